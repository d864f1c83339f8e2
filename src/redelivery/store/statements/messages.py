"""Publish (ids, COPY, staging) and consume (receive, ack, nack, reject, settle)."""

from __future__ import annotations

from psycopg import sql

from redelivery.rules.leased_row import receive_select
from redelivery.store.statements._shared import (
    _ANSWERS_RECEIPT,
    _DLQ_INSERT,
    _IS_INFLIGHT,
    _RECEIPT_FAILURE,
    _RECEIPT_MATCHES,
    _TOPIC_WAITED,
    _TOPIC_WAITER_KEY,
    _WAITER_KEY,
    AT,
    CAN_RETRY,
    NEXT_DELAY,
    NEXT_LEVEL,
    POLICIES_CTE,
    _attempt,
    _moved,
    _named,
    parked,
)

# The statements keep the layout of SQL, not of Python.
# fmt: off

# ---- publish --------------------------------------------------------------------------------------

#: Both publishers write the log with one binary COPY of these columns, a row per message whatever
#: the number of groups (each group's offset reaches it): the API encodes its messages from Arrow
#: arrays, a Spark publish's driver streams the chunks its tasks encoded and staged
#: (``messaging.copy_rows``). Ids come from the column's default, ``nextval('message_ids')``, in the
#: order of the rows, under the topic's publish lock. PostgreSQL checks each row as it is written:
#: a key's encoding, properties that are a JSON object, a JSON body that is JSON
#: (``messages_json_body``); the error names the row (``copy_rows.refused_row``).
COPY_MESSAGES = _named("COPY_MESSAGES", """
    COPY messages (topic_id, key, body, content_type, properties, published_at)
    FROM STDIN (FORMAT BINARY)""")
#: The publish time of this transaction's messages (``at`` or the transaction's start), and the
#: partition of the log that holds that time (NULL: none yet, ``log.ensure_partition`` makes one).
PUBLISH_TIME = _named("PUBLISH_TIME", f"""
    SELECT x.at, (SELECT l.partition_name FROM log_partitions l
                  WHERE coalesce(l.starts_at, '-infinity') <= x.at AND l.ends_at > x.at)
    FROM (SELECT {AT} AS at) x""")
#: An id below every id a publish is about to take (the sequence's last value, whoever took it):
#: read under the topic's publish lock, before the COPY, the publish's messages are then its
#: topic's messages past it (RECORD_PUBLISHED_BATCH).
ID_FLOOR = _named("ID_FLOOR", """
    SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM message_ids""")
#: A writer of new messages of a topic (publish, redrive to another topic) holds its topic row FOR
#: NO KEY UPDATE until it commits: publishers of one topic take turns (their ids grow in commit
#: order, and a batch's ids are a range no other message of the topic falls in), and the topic
#: cannot be deleted under them. Nothing: the topic is gone.
LOCK_TOPIC_FOR_PUBLISH = _named("LOCK_TOPIC_FOR_PUBLISH", """
    SELECT 1 FROM topics WHERE id = %(topic_id)s FOR NO KEY UPDATE""")
#: A writer of delivery rows that no subscription lock covers (a redrive reviving dead letters)
#: holds its topic row FOR KEY SHARE: the topic cannot be deleted under it. Nothing: it is gone.
LOCK_TOPIC_SHARED = _named("LOCK_TOPIC_SHARED", "SELECT 1 FROM topics WHERE id = %(topic_id)s FOR KEY SHARE")
#: The record of a published batch: (topic id, message count, fingerprint; None for a batch recorded
#: before 0013 whose messages had left the log, its first and last id; None before 0013).
PUBLISHED_BATCH = _named("PUBLISHED_BATCH", """
    SELECT topic_id, message_count, fingerprint, first_id, last_id FROM publish_batches
    WHERE batch_id = %(batch)s""")
#: Claim a batch id for this transaction's publish of ``count`` messages, published at their
#: publish time (``at`` or the transaction's start, as PUBLISH_TIME); nothing is returned when it
#: was published before (or is being published: the insert waits for that transaction, then finds
#: the row). Its range and fingerprint are recorded after the COPY (RECORD_PUBLISHED_BATCH).
CLAIM_PUBLISH_BATCH = _named("CLAIM_PUBLISH_BATCH", f"""
    INSERT INTO publish_batches (batch_id, topic_id, message_count, published_at)
    VALUES (%(batch)s, %(topic_id)s, %(count)s, {AT})
    ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id""")
#: After the COPY of a claimed batch, in its transaction: its messages are the topic's messages past
#: ``floor`` (ID_FLOOR) in ``{partition}``, the partition of their publish time, read as a table of
#: its own (the publisher holds its retirement lock: retention leaves it alone until the commit).
#: Their range, and the fingerprint PostgreSQL computes from the rows (their count and the sum of
#: their ``message_hash`` modulo 2^64: the same rows give the same fingerprint whatever their order
#: or partitioning), go into the batch's record, once (a record with a range is left alone).
#: Returns (messages written, their ids ascending); nothing if the batch had its record already.
RECORD_PUBLISHED_BATCH = sql.SQL("""/* redelivery:RECORD_PUBLISHED_BATCH */
    WITH published AS (
      SELECT count(*) AS messages, min(m.id) AS first_id, max(m.id) AS last_id,
             sum(message_hash(m.key, m.body, m.content_type, m.properties)) AS hash_sum,
             coalesce(array_agg(m.id ORDER BY m.id), '{{}}') AS ids
      FROM {partition} m WHERE m.topic_id = %(topic_id)s AND m.id > %(floor)s)
    UPDATE publish_batches b SET first_id = p.first_id, last_id = p.last_id,
        fingerprint = content_fingerprint(p.messages, p.hash_sum)
    FROM published p
    WHERE b.batch_id = %(batch)s AND b.first_id IS NULL AND b.message_ids IS NULL
    RETURNING p.messages, p.ids, {_TOPIC_WAITED} AS waited""".replace("{_TOPIC_WAITED}", _TOPIC_WAITED))
#: A small batch in one statement (``publishing.SMALL_BATCH_MESSAGES``), under the topic's publish
#: lock and the retirement lock of ``partition_name``, taken before it in its transaction. It writes
#: only when the topic exists and ``partition_name`` is the partition of the log that holds the
#: publish time as this statement sees it, after those locks (else nothing: the caller's guess of
#: the partition was stale, or the topic is gone; ``placed`` says which). Its ids are taken in the
#: arrays' order, ascending (the sequence of the column's default); its batch id is claimed with its
#: record whole (range, and the fingerprint RECORD_PUBLISHED_BATCH computes, from the same values),
#: so the batch's row is written once, never updated (no dead tuple a held horizon pins); its
#: messages are written only if the claim succeeded. Not claimed, nothing is written: the batch id
#: was published before (the claim waited for that transaction), and the COPY path compares the
#: repeat. Returns (messages written, their ids ascending, whether a consumer waits on the topic,
#: placed). The bodies go in binary (``%(bodies)b``): bytea as text would be escaped according to
#: the session's ``standard_conforming_strings``.
PUBLISH_SMALL_BATCH = _named("PUBLISH_SMALL_BATCH", f"""
    WITH target AS MATERIALIZED (
      SELECT EXISTS (SELECT 1 FROM topics t WHERE t.id = %(topic_id)s)
             AND (SELECT l.partition_name FROM log_partitions l
                  WHERE coalesce(l.starts_at, '-infinity') <= {AT} AND l.ends_at > {AT})
                 = %(partition_name)s AS placed),
    numbered AS MATERIALIZED (
      SELECT nextval('message_ids') AS id, r.key, r.body, r.content_type, r.properties
      FROM unnest(%(keys)s::text[], %(bodies)b::bytea[], %(content_types)s::text[],
                  %(properties)s::jsonb[]) WITH ORDINALITY AS r(key, body, content_type, properties, ord)
      WHERE (SELECT placed FROM target)
      ORDER BY r.ord),
    claimed AS (
      INSERT INTO publish_batches (batch_id, topic_id, message_count, published_at, first_id, last_id,
                                   fingerprint)
      SELECT %(batch)s, %(topic_id)s, count(*), {AT}, min(n.id), max(n.id),
             content_fingerprint(count(*), sum(message_hash(n.key, n.body, n.content_type, n.properties)))
      FROM numbered n HAVING count(*) > 0
      ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id),
    written AS (
      INSERT INTO messages (id, topic_id, key, body, content_type, properties, published_at)
      SELECT n.id, %(topic_id)s, n.key, n.body, n.content_type, n.properties, {AT}
      FROM numbered n WHERE EXISTS (SELECT 1 FROM claimed)
      RETURNING id)
    SELECT count(*), coalesce(array_agg(w.id ORDER BY w.id), '{{}}'), {_TOPIC_WAITED} AS waited,
           coalesce((SELECT placed FROM target), false)
    FROM written w""")
#: A batch id published again: its content goes into this session's temporary table (emptied at
#: commit), never into the log, and its fingerprint is compared with the published one's. ``ord``
#: keeps the caller's order (REPEATED_IDS).
CREATE_REPEATED_CONTENT = _named("CREATE_REPEATED_CONTENT", """
    CREATE TEMPORARY TABLE IF NOT EXISTS publish_repeated (
        topic_id integer, key text, body bytea, content_type text, properties jsonb,
        published_at timestamptz, ord bigint GENERATED ALWAYS AS IDENTITY) ON COMMIT DELETE ROWS""")
COPY_REPEATED_CONTENT = _named("COPY_REPEATED_CONTENT", """
    COPY publish_repeated (topic_id, key, body, content_type, properties, published_at)
    FROM STDIN (FORMAT BINARY)""")
REPEATED_FINGERPRINT = _named("REPEATED_FINGERPRINT", """
    SELECT content_fingerprint(count(*), sum(message_hash(key, body, content_type, properties)))
    FROM publish_repeated""")
#: The ids of a batch published again (its content in publish_repeated, the fingerprints equal), in
#: the caller's order: each repeated message is matched to a published one with the same
#: ``message_hash``, equal messages in order (the k-th equal one to the k-th smallest id). Nothing
#: when retention dropped the batch's messages from the log.
REPEATED_IDS = _named("REPEATED_IDS", """
    WITH stored AS (
      SELECT m.id, message_hash(m.key, m.body, m.content_type, m.properties) AS hash
      FROM publish_batches b
      JOIN messages m ON m.topic_id = b.topic_id
       AND (m.id BETWEEN b.first_id AND b.last_id OR m.id = ANY(b.message_ids))
      WHERE b.batch_id = %(batch)s),
    ranked AS (SELECT id, hash, row_number() OVER (PARTITION BY hash ORDER BY id) AS k FROM stored),
    repeated AS (
      SELECT r.ord, h.hash, row_number() OVER (PARTITION BY h.hash ORDER BY r.ord) AS k
      FROM publish_repeated r
      CROSS JOIN LATERAL (SELECT message_hash(r.key, r.body, r.content_type, r.properties) AS hash) h)
    SELECT s.id FROM repeated r JOIN ranked s ON s.hash = r.hash AND s.k = r.k ORDER BY r.ord""")
#: Claim partition ``part`` of publish job run ``run`` for staging. Nothing returned: an earlier
#: attempt of the task staged it (the insert waited for that attempt's transaction to end).
PUBLISH_PART_CLAIM = _named("PUBLISH_PART_CLAIM", """
    INSERT INTO publish_parts (batch_id, run_id, part, rows)
    VALUES (%(batch)s, %(stage_run)s, %(part)s, 0)
    ON CONFLICT DO NOTHING RETURNING 1""")
#: One chunk of a partition: ``rows`` messages in the binary COPY format (``copy_rows.encode_rows``).
STAGE_CHUNK = _named("STAGE_CHUNK", """
    INSERT INTO publish_staging (batch_id, run_id, part, seq, rows, data)
    VALUES (%(batch)s, %(stage_run)s, %(part)s, %(seq)s, %(rows)s, %(data)s)""")
PUBLISH_PART_STAGED = _named("PUBLISH_PART_STAGED", """
    UPDATE publish_parts SET rows = %(rows)s
    WHERE batch_id = %(batch)s AND run_id = %(stage_run)s AND part = %(part)s""")
PUBLISH_PART = _named("PUBLISH_PART", """
    SELECT rows FROM publish_parts
    WHERE batch_id = %(batch)s AND run_id = %(stage_run)s AND part = %(part)s""")
#: What a publish job run staged: (partitions, rows by the partitions' records, rows in its chunks).
PUBLISH_STAGED = _named("PUBLISH_STAGED", """
    SELECT (SELECT count(*) FROM publish_parts WHERE batch_id = %(batch)s AND run_id = %(stage_run)s),
           (SELECT coalesce(sum(rows), 0) FROM publish_parts
            WHERE batch_id = %(batch)s AND run_id = %(stage_run)s),
           (SELECT coalesce(sum(rows), 0) FROM publish_staging
            WHERE batch_id = %(batch)s AND run_id = %(stage_run)s)""")
#: A publish job run's chunks in the order its messages are published: partition by partition,
#: each in its own order. (part, rows, data).
STAGED_CHUNKS = _named("STAGED_CHUNKS", """
    SELECT part, rows, data FROM publish_staging
    WHERE batch_id = %(batch)s AND run_id = %(stage_run)s ORDER BY part, seq""")
#: A publish job run's chunks and partition records (published, or its publish failed).
DELETE_STAGED_RUN = _named("DELETE_STAGED_RUN", """
    WITH parts AS (DELETE FROM publish_parts WHERE batch_id = %(batch)s AND run_id = %(stage_run)s)
    DELETE FROM publish_staging WHERE batch_id = %(batch)s AND run_id = %(stage_run)s""")
#: The messages a group has waiting on a topic, what its ready-backlog cap counts (flow control): its
#: READY rows, its BLOCKED ones (an ordered subscription's messages waiting behind their key's head:
#: a receive that passes a message of a busy key turns it into one, and its promotion to READY when
#: the head ends changes nothing here), and the messages past its consume offset (an index-only
#: count of the log's primary key). BLOCKED rows through ``deliveries_blocked``, which holds only
#: those: nothing to read for an unordered subscription.
READY_COUNT = _named("READY_COUNT", """
    SELECT (SELECT count(*) FROM deliveries
            WHERE topic_id = %(topic_id)s AND group_id = %(group_id)s AND state = 'READY')
         + (SELECT count(*) FROM deliveries
            WHERE topic_id = %(topic_id)s AND group_id = %(group_id)s AND state = 'BLOCKED')
         + (SELECT count(*) FROM messages m
            WHERE m.topic_id = %(topic_id)s
              AND m.id > (SELECT consume_offset FROM subscriptions
                          WHERE topic_id = %(topic_id)s AND group_id = %(group_id)s))""")

# ---- consume --------------------------------------------------------------------------------------

#: Counts the receipts of a call that matched nothing (``n.answered`` of ``ids`` did) as stale on
#: the group, when ``count_stale``.
_COUNT_STALE = """stale AS (
      UPDATE consumer_groups g
      SET stale_receipts = g.stale_receipts + cardinality(%(ids)s::bigint[]) - n.answered
      FROM n WHERE g.id = %(group_id)s AND %(count_stale)s AND n.answered < cardinality(%(ids)s::bigint[])
      RETURNING 1)"""
#: The lease of a receive: ``at`` (or now) plus ``invisible_duration`` seconds.
_LEASE_END = f"{AT} + make_interval(secs => %(invisible_duration)s)"
#: A receive's READY rows (retries a tier run promoted, dead letters redriven, the next message of
#: a key an ordered subscription released: they waited already, and serving them first keeps the
#: lateness the tiers promise), oldest id first, ``FOR UPDATE SKIP LOCKED``, leased by their ids (an
#: array: a primary-key lookup); and the room they leave in the batch. A READY row whose message a
#: retention run has just detached is left alone (it is attached again:
#: ``log.drop_expired_partitions``); each row's message is probed by the log's primary key (OFFSET 0
#: keeps the EXISTS a per-row probe: as a semi-join the planner hashed the topic's whole log, 100,000
#: messages read for a few hundred READY rows, 33 ms a receive, when ``deliveries`` was analyzed
#: empty).
#: How many messages a receive may hand out (issue 41): ``max_messages``, none while the group's
#: breaker is open (or held), and, half-open, what ``probe_size`` leaves beside the subscription's
#: leases still running (a probe is a few messages in flight, not a rate). Read, not locked: a
#: receive that began before an opening hands its batch out, and those failures are parked.
_RECEIVE_GATE = """gate AS MATERIALIZED (
      SELECT coalesce((
        SELECT CASE WHEN b.open_until IS NULL THEN %(max_messages)s
                    WHEN b.open_until > now() THEN 0
                    ELSE greatest(0, least(%(max_messages)s, b.probe_size - (
                      SELECT count(*) FROM deliveries x
                      WHERE x.topic_id = b.topic_id AND x.group_id = b.group_id AND x.state = 'INFLIGHT'
                        AND x.invisible_until > now())))
               END
        FROM breakers b WHERE b.topic_id = %(topic_id)s AND b.group_id = %(group_id)s),
        %(max_messages)s) AS n)"""
_RECEIVE_READY = f"""{_RECEIVE_GATE},
    ready AS (
      SELECT d.message_id FROM deliveries d
      WHERE d.topic_id = %(topic_id)s AND d.group_id = %(group_id)s AND d.state = 'READY'
        AND EXISTS (SELECT 1 FROM messages m
                    WHERE m.topic_id = d.topic_id AND m.id = d.message_id AND m.published_at = d.published_at
                    OFFSET 0)
      ORDER BY d.message_id LIMIT (SELECT n FROM gate) FOR UPDATE SKIP LOCKED),
    again AS (
      UPDATE deliveries d SET state = 'INFLIGHT', delivery_count = d.delivery_count + 1,
          invisible_until = {_LEASE_END}, updated_at = now()
      WHERE d.topic_id = %(topic_id)s AND d.group_id = %(group_id)s
        AND d.message_id = ANY(ARRAY(SELECT message_id FROM ready))
      RETURNING d.message_id, d.published_at, d.delivery_count, d.reconsume_times, d.delay_level,
                d.invisible_until, d.last_error, d.redrive_count, d.key),
    room AS (SELECT (SELECT n FROM gate) - count(*) AS n FROM again)"""
#: The messages past the offset, oldest first, as many as the batch has room for.
_RECEIVE_NEW = """new AS (
      SELECT m.id, m.key, m.body, m.content_type, m.properties, m.published_at, m.origin_message_id
      FROM messages m
      WHERE m.topic_id = %(topic_id)s AND m.id > (SELECT consume_offset FROM subscription)
      ORDER BY m.id LIMIT (SELECT n FROM room))"""
#: The offset moved past every message of ``new``, which the subscription has taken.
_RECEIVE_MOVED = """moved AS (
      UPDATE subscriptions s SET consume_offset = (SELECT max(id) FROM new),
          messages_taken = s.messages_taken + (SELECT count(*) FROM new)
      WHERE s.topic_id = %(topic_id)s AND s.group_id = %(group_id)s AND EXISTS (SELECT 1 FROM new))"""


_AGAIN_COLUMNS, _TAKEN_COLUMNS = receive_select(_LEASE_END)


def _receive_rows(handed: str) -> str:
    """The rows a receive returns (``RECEIVE_COLUMNS``, declared with ``ReceivedMessage``: its
    select lists come from ``rules.leased_row``): the READY rows it leased, then the messages of the
    CTE ``handed`` (every one leased with delivery count 1; their lease the same expression: now()
    is the transaction's start)."""
    return f"""SELECT {_AGAIN_COLUMNS}
    FROM again a JOIN messages m
      ON m.topic_id = %(topic_id)s AND m.id = a.message_id AND m.published_at = a.published_at
    UNION ALL
    SELECT {_TAKEN_COLUMNS}
    FROM {handed} n
    ORDER BY 1"""


#: Lease up to ``max_messages`` messages of a topic to a group of an unordered subscription, in one
#: statement: first its READY rows, then, for the rest of the batch, the messages past its consume
#: offset: the subscription row locked ``FOR UPDATE`` when the log holds any (two consumers of a
#: group take turns for this part; an empty receive locks nothing), an INFLIGHT row with delivery
#: count 1 for each, and the offset moved past them.
#: Nothing past the offset for an ordered subscription (RECEIVE_ORDERED takes those).
RECEIVE = _named("RECEIVE", f"""
    WITH {_RECEIVE_READY},
    subscription AS (
      SELECT s.consume_offset FROM subscriptions s
      WHERE s.topic_id = %(topic_id)s AND s.group_id = %(group_id)s AND NOT s.ordered
        AND (SELECT n FROM room) > 0
        -- only when the log holds a message past the offset: an empty receive locks nothing that
        -- a busy one needs (the first id past it from the log's primary key, as PAST_OFFSET)
        AND (SELECT m.id FROM messages m WHERE m.topic_id = s.topic_id AND m.id > s.consume_offset
             ORDER BY m.id LIMIT 1) IS NOT NULL
      FOR UPDATE),
    {_RECEIVE_NEW},
    taken AS (
      INSERT INTO deliveries (topic_id, group_id, message_id, published_at, state, delivery_count,
                              invisible_until, ready_at)
      SELECT %(topic_id)s, %(group_id)s, n.id, n.published_at, 'INFLIGHT', 1, {_LEASE_END}, n.published_at
      FROM new n),
    {_RECEIVE_MOVED}
    {_receive_rows("new")}""")
#: A consumer of this backend waits for a subscription's messages (``messaging.waiting``): it holds
#: the topic's and the subscription's waiter locks (advisory, the session's, shared; migration
#: 0023) until its wait returns, or its session ends. A publisher tries the topic's exclusively, for
#: an instant, to learn whether anybody waits (the topic's is tried here too: never waited for; not
#: granted in that instant, the consumer waits without it, and a publish may then not wake it: its
#: re-check finds the message); publishers, tier runs and redrives notify the backends that hold
#: the subscription's. Written nowhere: no tuple, no WAL. Taken when the client knows its session
#: holds neither: its last wait of the subscription on this connection released them (else
#: ``WAITER_PRESENT_AGAIN``).
WAITER_PRESENT = _named("WAITER_PRESENT", f"""
    SELECT pg_try_advisory_lock_shared({_TOPIC_WAITER_KEY}), pg_advisory_lock_shared({_WAITER_KEY})""")
#: This backend holds the subscription's waiter lock (``pg_locks``: a read of the whole lock table,
#: which the common case does without).
_HOLDS_WAITER_LOCK = """EXISTS (SELECT 1 FROM pg_locks l
                  WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.objsubid = 2
                    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND l.classid = (-%(topic_id)s::int)::oid AND l.objid = %(group_id)s::int::oid)"""
#: ``WAITER_PRESENT`` when the client does not know whether its session holds the locks (the
#: first wait of the subscription on this connection, or one after a round trip cut short): taken
#: only when not held, so that shares do not pile up that one release would not undo.
WAITER_PRESENT_AGAIN = _named("WAITER_PRESENT_AGAIN", f"""
    SELECT pg_try_advisory_lock_shared({_TOPIC_WAITER_KEY}), pg_advisory_lock_shared({_WAITER_KEY})
    WHERE NOT {_HOLDS_WAITER_LOCK}""")
#: The consumer of this backend waits no more for the subscription (its wait returned): a notifier
#: picks only the backends that wait. False (and a warning) for a lock that was not held.
_WAITER_UNLOCK = (
    f"SELECT pg_advisory_unlock_shared({_WAITER_KEY}), pg_advisory_unlock_shared({_TOPIC_WAITER_KEY})"
)
WAITER_DONE = _named("WAITER_DONE", _WAITER_UNLOCK)
#: ``WAITER_DONE`` of a wait whose release was cut short, when the session still holds the
#: subscription's lock (else nothing), at the client's next receive on that connection: a backend
#: that holds it but waits no more would be notified in a waiting consumer's stead. The topic's lock
#: was only tried: not held, its unlock is a warning, nothing more.
WAITER_LEFT_BEHIND = _named("WAITER_LEFT_BEHIND", f"{_WAITER_UNLOCK}\nWHERE {_HOLDS_WAITER_LOCK}")
#: The server's pid of this session (a waiter's channel: a pooler reports a pid of its own).
BACKEND_PID = _named("BACKEND_PID", "SELECT pg_backend_pid()")
#: Wake the consumers waiting for the messages a commit made receivable: for each (topic id, group
#: id or NULL for every group of the topic, n messages), up to n of the group's waiting backends
#: (those that hold its waiter lock), chosen at random, one notification on each one's channel (the
#: function ``notify_waiters``, migrations 0019 and 0023); none when nobody waits (a notifying
#: commit takes a lock of the whole cluster).
NOTIFY_WAITERS = _named("NOTIFY_WAITERS", """
    SELECT notify_waiters(%(topic_ids)s::int[], %(group_ids)s::int[], %(counts)s::int[])""")
#: A receipt of another topic's message refused (SQLSTATE RD001: the statement is undone) when some
#: receipt matched nothing (``n.answered`` of ``ids`` did): ``refuse_foreign_receipts`` (migration
#: 0024) checks the receipts, (message id, the topic each names: ``ids`` and ``receipt_topics``,
#: aligned). The function is VOLATILE: its queries take their own snapshots, after the statement's
#: changes, as the separate check before it did (a receipt whose row the statement deleted is found
#: in its topic's log; one a concurrent ack answered first, too: stale, not refused).
_REFUSED = """refused AS (
      SELECT refuse_foreign_receipts(%(ids)s::bigint[], %(receipt_topics)s::int[], %(group_id)s)
      WHERE (SELECT answered FROM n) < cardinality(%(ids)s::bigint[]))"""
#: End the deliveries the receipts answer (message id, delivery count, the topic each names): an
#: ack deletes the delivery row, and the message, below its group's offset with no row, is
#: COMMITTED. Receipts that match nothing (late, repeated) are counted as stale on the group, in
#: the same statement, when ``count_stale`` (``settle`` counts them itself, last, so that its group
#: row is locked after every delivery row it changes). When some receipt matched nothing, a receipt
#: of another topic's message undoes the statement (``_REFUSED``): an ack outside a transaction is
#: one statement, committed on its own. Returns how many were acknowledged, and the topic id of each
#: (a breaker counts the acks that applied, never a stale one).
ACK = _named("ACK", f"""
    WITH acked AS (
      DELETE FROM deliveries d
      WHERE d.topic_id = ANY(%(topic_ids)s::int[]) AND d.group_id = %(group_id)s
        AND d.message_id = ANY(%(ids)s::bigint[])  -- the rows by their primary key, not the group's scan
        AND {_IS_INFLIGHT} AND {_ANSWERS_RECEIPT}
      RETURNING d.topic_id),
    n AS (SELECT count(*) AS answered FROM acked),
    {_COUNT_STALE},
    {_REFUSED}
    SELECT answered, ARRAY(SELECT topic_id FROM acked), (SELECT count(*) FROM refused) FROM n""")
#: Keep deliveries invisible longer (SQS ChangeMessageVisibility, Kafka KIP-1222's RENEW): each one
#: still INFLIGHT under its receipt (message id, delivery count, topic) whose lease has not ended
#: at ``at`` (or now: ``invisible_until`` after it; SQS refuses an ended one, MessageNotInflight)
#: gets ``invisible_until`` = ``at`` (or now) + ``invisible_duration`` seconds; its delivery count
#: does not change. Receipts that match nothing (an ended lease's among them) are counted as stale
#: on the group, and receipts of another topic refused, as ACK counts and refuses them. Returns how
#: many leases were extended.
EXTEND_LEASE = _named("EXTEND_LEASE", f"""
    WITH extended AS (
      UPDATE deliveries d SET invisible_until = {_LEASE_END}, updated_at = now()
      WHERE d.topic_id = ANY(%(topic_ids)s::int[]) AND d.group_id = %(group_id)s
        AND d.message_id = ANY(%(ids)s::bigint[])
        AND {_IS_INFLIGHT} AND {_ANSWERS_RECEIPT}
        AND d.invisible_until > {AT}
      RETURNING 1),
    n AS (SELECT count(*) AS answered FROM extended),
    {_COUNT_STALE},
    {_REFUSED}
    SELECT answered, (SELECT count(*) FROM refused) FROM n""")
#: Refuse (SQLSTATE RD001) the receipts of group ``group_id`` whose message is not a message of the
#: topic the receipt names (``refuse_foreign_receipts``, migration 0024); changes nothing.
REFUSE_FOREIGN_RECEIPTS = _named("REFUSE_FOREIGN_RECEIPTS", """
    SELECT refuse_foreign_receipts(%(ids)s::bigint[], %(receipt_topics)s::int[], %(group_id)s)""")
GROUP_STALE_RECEIPTS = _named("GROUP_STALE_RECEIPTS", """
    SELECT stale_receipts FROM consumer_groups WHERE id = %(group_id)s""")
#: Settle markers: a job run's part answered once (``Client.settle(marker=...)``).
SETTLE_PART_CLAIM = _named("SETTLE_PART_CLAIM", """
    INSERT INTO settle_parts (run_id, part) VALUES (%(settle_run)s, %(part)s)
    ON CONFLICT DO NOTHING RETURNING 1""")
SETTLE_PART = _named("SETTLE_PART", """
    SELECT acked, retried, dead_lettered, stale FROM settle_parts
    WHERE run_id = %(settle_run)s AND part = %(part)s""")
SETTLE_PART_RECORD = _named("SETTLE_PART_RECORD", """
    UPDATE settle_parts SET acked = %(acked)s, retried = %(retried)s, dead_lettered = %(dead_lettered)s,
        stale = %(stale)s
    WHERE run_id = %(settle_run)s AND part = %(part)s""")
CLEANUP_SETTLE_PARTS = _named("CLEANUP_SETTLE_PARTS", """
    DELETE FROM settle_parts WHERE (run_id, part) IN (
      SELECT run_id, part FROM settle_parts
      WHERE settled_at < now() - make_interval(secs => %(seconds)s::float8) LIMIT %(limit)s)""")
#: Add to groups' totals, the counters of ``redelivery.metrics`` (``catalog.add_group_totals``):
#: promoted and dead-lettered messages, stale receipts of a nack or reject, one entry per group id
#: in ``total_groups``. The last statement of the transaction whose moves it counts; the group rows
#: are locked in id order (locking happens after ORDER BY), after that transaction's delivery rows.
ADD_GROUP_TOTALS = _named("ADD_GROUP_TOTALS", """
    WITH added AS (
      SELECT * FROM unnest(%(total_groups)s::int[], %(total_promoted)s::bigint[],
                           %(total_dead_lettered)s::bigint[], %(total_stale)s::bigint[])
        AS a(group_id, promoted, dead_lettered, stale)),
    locked AS MATERIALIZED (
      SELECT g.id FROM consumer_groups g WHERE g.id IN (SELECT group_id FROM added) ORDER BY g.id FOR UPDATE)
    UPDATE consumer_groups g SET promoted = g.promoted + a.promoted,
        dead_lettered = g.dead_lettered + a.dead_lettered, stale_receipts = g.stale_receipts + a.stale
    FROM locked l JOIN added a ON a.group_id = l.id
    WHERE g.id = l.id""")

#: A failed delivery whose subscription's breaker is open, of a failure that counts (``parked``):
#: waiting again as the retry it would have been (its level, its wait), but its reconsume times
#: unchanged, ``parked`` in its history, never dead-lettered. The tiers promote it once the breaker
#: is no longer open. Not for a reject: a consumer's verdict on the message, not an attempt.
#: Returns (how many, their message ids).
FAIL_PARK = _named("FAIL_PARK", f"""
    WITH {POLICIES_CTE}, parked AS (
      UPDATE deliveries d SET state = 'WAITING_RETRY',
          delay_level = coalesce(%(level)s::smallint, {NEXT_LEVEL}),
          due_at = {AT} + make_interval(secs => coalesce(%(delay)s::float8, {NEXT_DELAY})),
          invisible_until = NULL, last_error = {_RECEIPT_FAILURE.error}, last_failure_at = {AT},
          first_failure_at = coalesce(d.first_failure_at, {AT}),
          attempts = {_attempt(AT, "'parked'", _RECEIPT_FAILURE)}, updated_at = now()
      FROM policies p
      WHERE {_RECEIPT_MATCHES} AND NOT %(force_dead_letter)s AND {parked(_RECEIPT_FAILURE)}
      RETURNING d.message_id)
    SELECT count(*), coalesce(array_agg(message_id), '{{}}') FROM parked""")
#: A failed delivery that may be retried: the retry's level and wait are ``level`` / ``delay``
#: (seconds) when given, else the policy's next ones. ``force_dead_letter`` (reject, negative
#: level) leaves every receipt to FAIL_DEAD_LETTER; ``outcome`` goes into the attempt history.
#: A parked one is FAIL_PARK's. Returns (how many, their message ids).
FAIL_RETRY = _named("FAIL_RETRY", f"""
    WITH {POLICIES_CTE}, retried AS (
      UPDATE deliveries d SET state = 'WAITING_RETRY', reconsume_times = d.reconsume_times + 1,
          delay_level = coalesce(%(level)s::smallint, {NEXT_LEVEL}),
          due_at = {AT} + make_interval(secs => coalesce(%(delay)s::float8, {NEXT_DELAY})),
          invisible_until = NULL, last_error = {_RECEIPT_FAILURE.error}, last_failure_at = {AT},
          first_failure_at = coalesce(d.first_failure_at, {AT}),
          attempts = {_attempt(AT, "%(outcome)s::text", _RECEIPT_FAILURE)}, updated_at = now()
      FROM policies p
      WHERE {_RECEIPT_MATCHES} AND NOT %(force_dead_letter)s AND {CAN_RETRY}
        AND NOT {parked(_RECEIPT_FAILURE)}
      RETURNING d.message_id)
    SELECT count(*), coalesce(array_agg(message_id), '{{}}') FROM retried""")
#: The failed deliveries FAIL_RETRY left (retries used up, or forced): the delivery row goes, and
#: its dead letter, with the failure, the history and the message, goes to the DLQ with ``reason``.
#: Returns (group id, reason, how many, their message ids) per group and reason.
FAIL_DEAD_LETTER = _named("FAIL_DEAD_LETTER", f"""
    WITH {POLICIES_CTE}, moved AS (
      DELETE FROM deliveries d USING policies p
      WHERE {_RECEIPT_MATCHES}
        AND (%(force_dead_letter)s OR (NOT {CAN_RETRY} AND NOT {parked(_RECEIPT_FAILURE)}))
      {_moved(AT, _RECEIPT_FAILURE, _attempt(AT, "%(outcome)s::text", _RECEIPT_FAILURE))}),
    {_DLQ_INSERT}
    SELECT group_id, reason::text, count(*), array_agg(message_id) FROM inserted GROUP BY 1, 2""")

# ---- views ----------------------------------------------------------------------------------------

#: Per subscription (topic name, group name): READY (its READY rows and the messages past its
#: offset), INFLIGHT, WAITING_RETRY, COMMITTED, DLQ and BLOCKED (an ordered subscription's messages
#: held behind their key's head). COMMITTED has no rows: it is what the subscription took past its
#: offset, ever, less what is still unfinished (delivery rows but HALTED ones, whose message is a
#: dead letter), dead (DLQ rows) or dead and deleted by retention. One snapshot, so they always add up.
SUBSCRIPTION_STATES = _named("SUBSCRIPTION_STATES", """
    WITH dead AS (SELECT topic_id, group_id, count(*) AS n FROM dlq_messages GROUP BY 1, 2)
    SELECT t.name, g.name, r.ready + p.past, r.inflight, r.waiting,
           s.messages_taken - r.unfinished - coalesce(q.n, 0) - s.dead_letters_expired, coalesce(q.n, 0),
           r.blocked
    FROM subscriptions s JOIN topics t ON t.id = s.topic_id JOIN consumer_groups g ON g.id = s.group_id
    CROSS JOIN LATERAL (
      SELECT count(*) FILTER (WHERE d.state = 'READY') AS ready,
             count(*) FILTER (WHERE d.state = 'INFLIGHT') AS inflight,
             count(*) FILTER (WHERE d.state = 'WAITING_RETRY') AS waiting,
             count(*) FILTER (WHERE d.state = 'BLOCKED') AS blocked,
             count(*) FILTER (WHERE d.state <> 'HALTED') AS unfinished
      FROM deliveries d WHERE d.topic_id = s.topic_id AND d.group_id = s.group_id) r
    CROSS JOIN LATERAL (
      SELECT count(*) AS past FROM messages m WHERE m.topic_id = s.topic_id AND m.id > s.consume_offset) p
    LEFT JOIN dead q ON q.topic_id = s.topic_id AND q.group_id = s.group_id
    ORDER BY 1, 2""")
# fmt: on
