"""Publish (COPY, staging, fan-out) and consume (receive, ack, nack, reject, settle)."""

from __future__ import annotations

from redelivery.store.statements._shared import (
    _DLQ_COPY,
    _IS_INFLIGHT,
    _MOVED_RETURNING,
    _RECEIPT_MATCHES,
    _RECEIPTS,
    AT,
    CAN_RETRY,
    NEXT_DELAY,
    NEXT_LEVEL,
    POLICIES_CTE,
    _attempt,
    _named,
)

# The statements keep the layout of SQL, not of Python.
# fmt: off

# ---- publish --------------------------------------------------------------------------------------

#: The API publishes with a binary COPY straight into messages (every row tagged with its batch
#: id); a Spark publish stages each partition in publish_staging first (PUBLISH_PART_CLAIM), and
#: its driver moves the staged rows into messages in one transaction (STAGED_TO_MESSAGES). Either
#: way FAN_OUT then adds a READY delivery per subscribed group. A row of publish_staging is
#: (staging key, run, partition, seq).
COPY_MESSAGES = _named("COPY_MESSAGES", """
    COPY messages (topic_id, key, body, content_type, properties, publish_batch, published_at)
    FROM STDIN (FORMAT BINARY)""")
COPY_STAGING = _named("COPY_STAGING", """
    COPY publish_staging (batch_id, run_id, part, seq, key, body, content_type, properties)
    FROM STDIN (FORMAT BINARY)""")
#: The publish time of this transaction's messages: ``at`` or the transaction's start.
PUBLISH_TIME = _named("PUBLISH_TIME", f"SELECT {AT}")
#: Right after a claim: messages still tagged with the claimed batch id belong to an older publish
#: of it whose record retention deleted; they lose the tag, so that FAN_OUT and PUBLISHED_IDS see
#: this publish's messages only. (Nearly always changes nothing: one index lookup.)
UNTAG_FORGOTTEN_BATCH = _named("UNTAG_FORGOTTEN_BATCH", """
    UPDATE messages SET publish_batch = NULL WHERE publish_batch = %(batch)s""")
#: A writer of messages to a topic (publish, redrive to another topic) holds its topic row FOR KEY
#: SHARE until it commits: the topic cannot be deleted under it. Nothing: the topic is gone. (Once
#: per transaction, where a foreign key checked every row: migration 0008.)
LOCK_TOPIC_SHARED = _named("LOCK_TOPIC_SHARED", "SELECT 1 FROM topics WHERE id = %(topic_id)s FOR KEY SHARE")
#: The record of a published batch: (topic id, message count, fingerprint).
PUBLISHED_BATCH = _named("PUBLISHED_BATCH", """
    SELECT topic_id, message_count, fingerprint FROM publish_batches WHERE batch_id = %(batch)s""")
#: Claim a batch id for this transaction's publish; nothing is returned when it was published
#: before (or is being published: the insert waits for that transaction, then finds the row).
CLAIM_PUBLISH_BATCH = _named("CLAIM_PUBLISH_BATCH", """
    INSERT INTO publish_batches (batch_id, topic_id, message_count, fingerprint)
    VALUES (%(batch)s, %(topic_id)s, %(count)s, %(fingerprint)s)
    ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id""")
PUBLISHED_IDS = _named("PUBLISHED_IDS", "SELECT id FROM messages WHERE publish_batch = %(batch)s ORDER BY id")
#: Claim partition ``part`` of publish job run ``run`` for staging. Nothing returned: an earlier
#: attempt of the task staged it (the insert waited for that attempt's transaction to end).
PUBLISH_PART_CLAIM = _named("PUBLISH_PART_CLAIM", """
    INSERT INTO publish_parts (batch_id, run_id, part, rows, fingerprint)
    VALUES (%(batch)s, %(stage_run)s, %(part)s, 0, '')
    ON CONFLICT DO NOTHING RETURNING 1""")
PUBLISH_PART_STAGED = _named("PUBLISH_PART_STAGED", """
    UPDATE publish_parts SET rows = %(rows)s, fingerprint = %(fingerprint)s
    WHERE batch_id = %(batch)s AND run_id = %(stage_run)s AND part = %(part)s""")
PUBLISH_PART = _named("PUBLISH_PART", """
    SELECT rows, fingerprint FROM publish_parts
    WHERE batch_id = %(batch)s AND run_id = %(stage_run)s AND part = %(part)s""")
#: What a publish job run staged: (partitions, rows by the partitions' records, rows in staging).
PUBLISH_STAGED = _named("PUBLISH_STAGED", """
    SELECT (SELECT count(*) FROM publish_parts WHERE batch_id = %(batch)s AND run_id = %(stage_run)s),
           (SELECT coalesce(sum(rows), 0) FROM publish_parts
            WHERE batch_id = %(batch)s AND run_id = %(stage_run)s),
           (SELECT count(*) FROM publish_staging WHERE batch_id = %(batch)s AND run_id = %(stage_run)s)""")
#: A publish job run's staged rows and partition records (its publish failed).
DELETE_STAGED_RUN = _named("DELETE_STAGED_RUN", """
    WITH parts AS (DELETE FROM publish_parts WHERE batch_id = %(batch)s AND run_id = %(stage_run)s)
    DELETE FROM publish_staging WHERE batch_id = %(batch)s AND run_id = %(stage_run)s""")
#: A Spark publish run's staged rows -> messages of topic ``topic_id``, in staging order.
STAGED_TO_MESSAGES = _named("STAGED_TO_MESSAGES", f"""
    INSERT INTO messages (topic_id, key, body, content_type, properties, publish_batch, published_at)
    SELECT %(topic_id)s, u.key, u.body, u.content_type, u.properties, %(batch)s, {AT}
    FROM publish_staging u
    WHERE u.batch_id = %(batch)s AND u.run_id = %(stage_run)s
    ORDER BY u.part, u.seq""")
#: A READY delivery per subscribed group for every message of batch ``batch`` (this transaction
#: claimed it and wrote them: UNTAG_FORGOTTEN_BATCH); returns the messages' ids in order. Bodies
#: are not parsed here: the API and the Spark tasks check JSON text as PostgreSQL's jsonb would
#: (codec.check_json_text).
FAN_OUT = _named("FAN_OUT", """
    WITH new AS (SELECT id, topic_id, published_at FROM messages WHERE publish_batch = %(batch)s),
    fan AS (
      INSERT INTO deliveries (message_id, group_id, topic_id, ready_at, created_at, updated_at)
      SELECT new.id, s.group_id, new.topic_id, new.published_at, new.published_at, new.published_at
      FROM new JOIN subscriptions s ON s.topic_id = new.topic_id)
    SELECT id FROM new ORDER BY id""")
#: Every staged row of a batch (all partitionings): once it is published they are leftovers.
DELETE_STAGED = _named("DELETE_STAGED", "DELETE FROM publish_staging WHERE batch_id = %(staging)s")
#: A group's READY messages of a topic (flow control).
READY_COUNT = _named("READY_COUNT", """
    SELECT count(*) FROM deliveries
    WHERE group_id = %(group_id)s AND topic_id = %(topic_id)s AND state = 'READY'""")

# ---- consume --------------------------------------------------------------------------------------

# The claimed ids go to the UPDATE as an array: a primary-key lookup. Joined as a table, they were
# matched by scanning every delivery of the group, slower as the table grew.
RECEIVE = _named("RECEIVE", f"""
    WITH claimed AS (
      SELECT message_id FROM deliveries
      WHERE group_id = %(group_id)s AND topic_id = %(topic_id)s AND state = 'READY'
      ORDER BY message_id LIMIT %(max_messages)s FOR UPDATE SKIP LOCKED),
    leased AS (
      UPDATE deliveries d SET state = 'INFLIGHT', delivery_count = d.delivery_count + 1,
          invisible_until = {AT} + make_interval(secs => %(invisible_duration)s), updated_at = now()
      WHERE d.message_id = ANY(ARRAY(SELECT message_id FROM claimed)) AND d.group_id = %(group_id)s
        RETURNING d.message_id, d.delivery_count, d.reconsume_times, d.delay_level, d.invisible_until,
                d.last_error, d.redrive_count)
    SELECT l.message_id, m.key, m.body, m.content_type, m.properties::text AS properties, m.published_at,
           l.delivery_count, l.reconsume_times, l.delay_level, l.invisible_until,
           coalesce(m.origin_message_id, m.id) AS origin_message_id, l.last_error, l.redrive_count
    FROM leased l JOIN messages m ON m.id = l.message_id ORDER BY l.message_id""")

#: Commit the deliveries the receipts answer; receipts that match nothing (late, repeated) are
#: counted as stale on the group, in the same statement, when ``count_stale`` (``settle`` counts
#: them itself, last, so that its group row is locked after every delivery row it changes).
#: Returns how many were acknowledged.
ACK = _named("ACK", f"""
    WITH acked AS (
      UPDATE deliveries d SET state = 'COMMITTED', invisible_until = NULL, updated_at = now()
      FROM unnest(%(ids)s::bigint[], %(counts)s::int[]) AS i(message_id, delivery_count)
      WHERE d.message_id = i.message_id AND d.group_id = %(group_id)s AND {_IS_INFLIGHT}
        AND d.delivery_count = i.delivery_count
      RETURNING 1),
    n AS (SELECT count(*) AS acked FROM acked),
    stale AS (
      UPDATE consumer_groups g
      SET stale_receipts = g.stale_receipts + cardinality(%(ids)s::bigint[]) - n.acked
      FROM n WHERE g.id = %(group_id)s AND %(count_stale)s AND n.acked < cardinality(%(ids)s::bigint[])
      RETURNING 1)
    SELECT acked FROM n""")
#: The first receipt whose message is not of the topic the receipt names: (message id, the
#: message's topic). A message's topic never changes, so this read needs no lock.
RECEIPT_OF_ANOTHER_TOPIC = _named("RECEIPT_OF_ANOTHER_TOPIC", """
    SELECT i.message_id, t.name
    FROM unnest(%(ids)s::bigint[], %(topic_ids)s::int[]) AS i(message_id, topic_id)
    JOIN messages m ON m.id = i.message_id JOIN topics t ON t.id = m.topic_id
    WHERE m.topic_id <> i.topic_id
    LIMIT 1""")
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

#: A failed delivery that may be retried: the retry's level and wait are ``level`` / ``delay``
#: (seconds) when given, else the policy's next ones. ``force_dead_letter`` (reject, negative
#: level) leaves every receipt to FAIL_DEAD_LETTER; ``outcome`` goes into the attempt history.
FAIL_RETRY = _named("FAIL_RETRY", f"""
    WITH {POLICIES_CTE}, retried AS (
      UPDATE deliveries d SET state = 'WAITING_RETRY', reconsume_times = d.reconsume_times + 1,
          delay_level = coalesce(%(level)s::smallint, {NEXT_LEVEL}),
          due_at = {AT} + make_interval(secs => coalesce(%(delay)s::float8, {NEXT_DELAY})),
          invisible_until = NULL, last_error = i.error, last_failure_at = {AT},
          first_failure_at = coalesce(d.first_failure_at, {AT}),
          attempts = {_attempt(AT, "%(outcome)s::text", "i.error")}, updated_at = now()
      FROM {_RECEIPTS}, policies p
      WHERE {_RECEIPT_MATCHES} AND NOT %(force_dead_letter)s AND {CAN_RETRY}
      RETURNING 1)
    SELECT count(*) FROM retried""")
#: The failed deliveries FAIL_RETRY left (retries used up, or forced): to the DLQ with ``reason``.
FAIL_DEAD_LETTER = _named("FAIL_DEAD_LETTER", f"""
    WITH {POLICIES_CTE}, moved AS (
      UPDATE deliveries d SET state = 'DLQ', invisible_until = NULL, due_at = NULL,
          last_error = i.error, last_failure_at = {AT},
          first_failure_at = coalesce(d.first_failure_at, {AT}),
          attempts = {_attempt(AT, "%(outcome)s::text", "i.error")}, updated_at = now()
      FROM {_RECEIPTS}, policies p
      WHERE {_RECEIPT_MATCHES} AND (%(force_dead_letter)s OR NOT {CAN_RETRY})
      {_MOVED_RETURNING}),
    {_DLQ_COPY}""")
#: Whether FAIL_DEAD_LETTER would dead-letter any of these receipts (to make the DLQ table first).
FAIL_WOULD_DEAD_LETTER = _named("FAIL_WOULD_DEAD_LETTER", f"""
    WITH {POLICIES_CTE}
    SELECT 1 FROM deliveries d, {_RECEIPTS}, policies p
    WHERE {_RECEIPT_MATCHES} AND (%(force_dead_letter)s OR NOT {CAN_RETRY}) LIMIT 1""")

# ---- views ----------------------------------------------------------------------------------------

STATE_COUNTS = _named("STATE_COUNTS", """
    SELECT t.name, g.name, c.state::text, c.n
    FROM (SELECT topic_id, group_id, state, count(*) AS n FROM deliveries GROUP BY 1, 2, 3) c
    JOIN topics t ON t.id = c.topic_id JOIN consumer_groups g ON g.id = c.group_id""")
# fmt: on
