"""Every SQL statement of redelivery, by name. The one place to audit the state machine.

Each state change is one statement guarded by the state it expects (``state = 'INFLIGHT' AND
delivery_count = <the receipt's>`` ...): a change already made by an earlier or overlapping run
matches no row, and PostgreSQL's re-check of the ``WHERE`` clause after a row-lock wait (READ
COMMITTED) makes every message move at most once. Variants are parameters, never text: shared
pieces (the policy table, the receipt list, the dead-letter copy) are put together once, when this
module loads. Every statement starts with a ``/* redelivery:NAME */`` comment, so it can be found
in ``pg_stat_activity`` and in the server log; ``ALL`` maps each name to its text, and a test runs
``EXPLAIN`` on every one of them.

Parameters are psycopg named placeholders. Times: ``at`` is a timezone-aware ``datetime`` that
replaces the database clock (``None``: ``now()``); durations are float8 seconds.

``STATE_CHANGES`` names the statements that move a delivery from one state to another; the table in
docs/ARCHITECTURE.md ("State changes") lists the same, with the guard of each.
"""

from __future__ import annotations

from textwrap import dedent

from psycopg import sql

# The statements keep the layout of SQL, not of Python.
# fmt: off


def _named(name: str, text: str) -> str:
    return f"/* redelivery:{name} */\n" + dedent(text).strip()


# ---- shared pieces --------------------------------------------------------------------------------

#: The time of a client call: the caller's ``at`` or the database clock.
AT = "coalesce(%(at)s::timestamptz, now())"

#: The policy of each subscription, one row each, from the parameters ``catalog.policy_table``
#: builds: waits (seconds) and routing levels of retries 1..K as array literals, the Artemis
#: collision-avoidance factor, max reconsume times (-1 unlimited), the DLQ and the ready-backlog cap.
POLICIES_CTE = """policies AS (
    SELECT * FROM unnest(%(p_topic)s::int[], %(p_group)s::int[], %(p_max)s::int[], %(p_delays)s::text[],
                         %(p_levels)s::text[], %(p_jitter)s::float8[], %(p_dlq)s::int[], %(p_cap)s::int[])
        AS p(topic_id, group_id, max_times, delays, levels, jitter, dlq_id, cap))"""
POLICY_JOIN = "p.topic_id = d.topic_id AND p.group_id = d.group_id"
CAN_RETRY = "(p.max_times = -1 OR d.reconsume_times < p.max_times)"
# Retry n = d.reconsume_times + 1: its routing level, and its wait in seconds with Artemis collision
# avoidance (wait + wait * factor * U[0,1) with a random sign, seeds/004), at most 864000 s
# (levels.MAX_DELAY_SECONDS; policies.EffectivePolicy.delay cuts it the same way).
NEXT_LEVEL = "(p.levels::int[])[least(d.reconsume_times + 1, cardinality(p.levels::int[]))]"
NEXT_DELAY = """least((p.delays::float8[])[least(d.reconsume_times + 1, cardinality(p.delays::float8[]))]
                 * (1 + p.jitter * (CASE WHEN random() < 0.5 THEN -1 ELSE 1 END) * random()), 864000)"""

# Acks and nacks find their rows through the primary key. Written as a text comparison so that the
# planner cannot use the partial index of leases instead: that index keeps an entry for every row
# that was ever in flight until VACUUM, and scanning it whole made each ack slower than the last.
_IS_INFLIGHT = "d.state::text = 'INFLIGHT'"
#: The receipts of a call: message id, the delivery count it answers, and an error text.
_RECEIPTS = """unnest(%(ids)s::bigint[], %(counts)s::int[], %(errors)s::text[])
                    AS i(message_id, delivery_count, error)"""
_RECEIPT_MATCHES = f"""d.message_id = i.message_id AND d.group_id = %(g)s AND {_IS_INFLIGHT}
                      AND d.delivery_count = i.delivery_count AND {POLICY_JOIN}"""


def _attempt(at: str, outcome: str, error: str) -> str:
    """Appends one failed delivery to ``d.attempts`` (the last 20 are kept: ``append_attempt``)."""
    return (f"append_attempt(d.attempts, jsonb_build_object('at', {at}, 'delivery', d.delivery_count, "
            f"'outcome', {outcome}, 'error', {error}))")


# What an UPDATE that dead-letters returns, for _DLQ_COPY (the CTE must be called "moved").
_MOVED_RETURNING = """RETURNING d.message_id, d.group_id, d.topic_id, p.dlq_id, d.delivery_count,
              d.reconsume_times, d.first_failure_at, d.last_failure_at, d.last_error, d.attempts,
              d.redrive_count"""
# Copies the rows of the CTE "moved" into dlq_messages inside the database (payloads never leave it);
# the statement returns (group_id, reason, count).
_DLQ_COPY = """inserted AS (
    INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, key, body,
                              content_type, properties, published_at, reason, last_error, delivery_count,
                              reconsume_times, first_failure_at, last_failure_at, dead_lettered_at, attempts,
                              redrive_count)
    SELECT mv.dlq_id, mv.group_id, mv.message_id, mv.topic_id, coalesce(m.origin_message_id, m.id), m.key,
           m.body, m.content_type, m.properties, m.published_at, %(reason)s::dlq_reason, mv.last_error,
           mv.delivery_count, mv.reconsume_times, mv.first_failure_at, mv.last_failure_at,
           coalesce(%(dead_lettered_at)s::timestamptz, now()), mv.attempts, mv.redrive_count
    FROM moved mv JOIN messages m ON m.id = mv.message_id
    RETURNING group_id, reason)
SELECT group_id, reason::text, count(*) FROM inserted GROUP BY 1, 2"""

#: A tier window's candidates: due retries of its levels, and leases ended by the window end.
_DUE = """d.state = 'WAITING_RETRY' AND d.delay_level = ANY(%(levels)s::smallint[])
          AND d.due_at <= %(window_end)s"""
_EXPIRED = "d.state = 'INFLIGHT' AND d.invisible_until <= %(window_end)s"
_IN_RANGE = f"d.message_id >= %(low)s AND d.message_id < %(high)s AND {POLICY_JOIN}"
_LEASE_FAILED = _attempt("d.invisible_until", "'lease_expired'", "%(lease_error)s::text")
#: Adds one batch of observations to a tier's cumulative histogram ``metric`` (table tier_histograms):
#: ``bucket_counts`` per bucket of ``bucket_bounds`` (seconds; the last count: above every bound),
#: ``observed_sum`` their sum in seconds; ``rows`` selects the tier from the CTE "finished". Other
#: bounds than the stored ones restart the histogram (Prometheus sees a counter reset).
_HISTOGRAM_ADD = """INSERT INTO tier_histograms AS h (tier, metric, bounds, counts, sum)
    SELECT tier, '{metric}', %(bucket_bounds)s::float8[], %(bucket_counts)s::bigint[],
           %(observed_sum)s::float8
    {rows}
    ON CONFLICT (tier, metric) DO UPDATE SET
        counts = CASE WHEN h.bounds = EXCLUDED.bounds
                      THEN ARRAY(SELECT a + b FROM unnest(h.counts, EXCLUDED.counts)
                                                   WITH ORDINALITY AS u(a, b, i) ORDER BY i)
                      ELSE EXCLUDED.counts END,
        sum = CASE WHEN h.bounds = EXCLUDED.bounds THEN h.sum + EXCLUDED.sum ELSE EXCLUDED.sum END,
        bounds = EXCLUDED.bounds, updated_at = now()"""
# The bucket of the tier's lateness histogram (``lateness_le``, bounds in seconds, ascending): the
# index of the first bound at least ``lateness`` (= how many bounds are below it), cardinality when
# none is. width_bucket counts thresholds <= its operand; on negated bounds, the bounds >= lateness.
_LATENESS_BUCKET = """cardinality(%(lateness_le)s::float8[]) - width_bucket(-lateness,
           (SELECT array_agg(-b ORDER BY -b) FROM unnest(%(lateness_le)s::float8[]) AS b))"""
# Promoted rows per (group, level, lateness bucket, histogram bucket): lateness = window end - due
# time, seconds; with its largest value and sum.
# The topic is returned too: a tier run emits an asset event per subscription with promotions.
_PROMOTED_COUNTS = f"""RETURNING d.group_id, d.delay_level, d.topic_id,
                            extract(epoch FROM %(window_end)s - d.due_at)::float8 AS lateness)
SELECT group_id, delay_level, floor(lateness * 1000 / %(bucket_ms)s)::int, count(*), max(lateness), topic_id,
       sum(lateness), {_LATENESS_BUCKET}
FROM promoted GROUP BY 1, 2, 3, 6, 8"""

#: A dead-letter filter of values (never SQL): every condition is a parameter, NULL = no condition;
#: text matches with strpos, so '%' and '_' are plain characters.
DLQ_FILTER = """q.group_id = %(g)s
    AND (%(topic_id)s::int IS NULL OR q.topic_id = %(topic_id)s::int)
    AND (%(from)s::timestamptz IS NULL OR q.dead_lettered_at >= %(from)s::timestamptz)
    AND (%(to)s::timestamptz IS NULL OR q.dead_lettered_at < %(to)s::timestamptz)
    AND (%(reasons)s::text[] IS NULL OR q.reason::text = ANY(%(reasons)s::text[]))
    AND (%(error)s::text IS NULL OR strpos(lower(coalesce(q.last_error, '')), lower(%(error)s::text)) > 0)
    AND (%(ids)s::bigint[] IS NULL OR q.message_id = ANY(%(ids)s::bigint[]))"""
_DLQ_FROM = "dlq_messages q JOIN topics t ON t.id = q.topic_id JOIN dead_letter_queues dq ON dq.id = q.dlq_id"

# ---- topology -------------------------------------------------------------------------------------

TOPIC_ID = _named("TOPIC_ID", "SELECT id FROM topics WHERE name = %(name)s")
GROUP_BY_NAME = _named("GROUP_BY_NAME", """
    SELECT id, max_reconsume_times FROM consumer_groups WHERE name = %(name)s""")
# Lookups before inserts: an INSERT ... ON CONFLICT takes a value of the identity sequence even
# when the row exists, and calls that repeat (every CLI command, every demo run) would use it up.
# Two creators racing: the loser's insert finds the winner's row and returns nothing; run again.
#: The id of topic ``name``, created if missing.
CREATE_TOPIC = _named("CREATE_TOPIC", """
    WITH existing AS (SELECT id FROM topics WHERE name = %(name)s),
    inserted AS (
      INSERT INTO topics (name) SELECT %(name)s WHERE NOT EXISTS (SELECT 1 FROM existing)
      ON CONFLICT (name) DO NOTHING RETURNING id)
    SELECT id FROM existing UNION ALL SELECT id FROM inserted""")
#: The id of group ``name``, created if missing; its own max reconsume times set when given, kept
#: when ``max_reconsume_times`` is NULL.
CREATE_GROUP = _named("CREATE_GROUP", """
    WITH existing AS (SELECT id FROM consumer_groups WHERE name = %(name)s),
    inserted AS (
      INSERT INTO consumer_groups (name, max_reconsume_times)
      SELECT %(name)s, %(max_reconsume_times)s::int WHERE NOT EXISTS (SELECT 1 FROM existing)
      ON CONFLICT (name) DO NOTHING RETURNING id),
    updated AS (
      UPDATE consumer_groups SET max_reconsume_times = %(max_reconsume_times)s::int
      WHERE id = (SELECT id FROM existing) AND %(max_reconsume_times)s::int IS NOT NULL RETURNING id)
    SELECT id FROM existing UNION ALL SELECT id FROM inserted""")
#: Set (or, with NULL, clear: the policy decides) a group's own max reconsume times.
SET_GROUP_MAX = _named("SET_GROUP_MAX", """
    UPDATE consumer_groups SET max_reconsume_times = %(max_reconsume_times)s::int WHERE name = %(name)s
    RETURNING id""")
SUBSCRIBE = _named("SUBSCRIBE", """
    INSERT INTO subscriptions (topic_id, group_id) VALUES (%(topic_id)s, %(g)s) ON CONFLICT DO NOTHING""")
#: Deleting a topic first waits for the writers holding its row (LOCK_TOPIC_SHARED) and keeps new
#: ones out; DELETE_TOPIC, the next statement, then sees every message they committed.
LOCK_TOPIC_FOR_DELETE = _named("LOCK_TOPIC_FOR_DELETE", """
    SELECT 1 FROM topics WHERE id = %(topic_id)s FOR UPDATE""")
#: A topic with its deliveries, messages, subscriptions and dead letters. The dead letters go with
#: their deliveries (a foreign key, row by row under row locks: one being written at the same moment
#: goes too); subscriptions and publish records cascade from the topic.
DELETE_TOPIC = _named("DELETE_TOPIC", """
    WITH deleted_deliveries AS (
      DELETE FROM deliveries d USING messages m WHERE m.id = d.message_id AND m.topic_id = %(topic_id)s),
    deleted_messages AS (DELETE FROM messages WHERE topic_id = %(topic_id)s)
    DELETE FROM topics WHERE id = %(topic_id)s""")
#: Subscriptions with their names and the group's own max reconsume times: all (``all``) or the
#: (topic id, group id) pairs given.
SUBSCRIPTIONS = _named("SUBSCRIPTIONS", """
    SELECT s.topic_id, s.group_id, t.name, g.name, g.max_reconsume_times
    FROM subscriptions s JOIN topics t ON t.id = s.topic_id JOIN consumer_groups g ON g.id = s.group_id
    WHERE %(all)s OR (s.topic_id, s.group_id) IN (SELECT * FROM unnest(%(t)s::int[], %(gs)s::int[]))""")
SUBSCRIBED_GROUPS = _named("SUBSCRIBED_GROUPS", """
    SELECT group_id FROM subscriptions WHERE topic_id = %(topic_id)s""")
SUBSCRIBED_TOPICS = _named("SUBSCRIBED_TOPICS", """
    SELECT topic_id FROM subscriptions WHERE group_id = %(group_id)s ORDER BY topic_id""")
SUBSCRIPTION_NAMES = _named("SUBSCRIPTION_NAMES", """
    SELECT t.name, g.name FROM subscriptions s JOIN topics t ON t.id = s.topic_id
    JOIN consumer_groups g ON g.id = s.group_id ORDER BY 1, 2""")
#: The schema's Alembic revision (the table is missing before the first migration).
SCHEMA_REVISION = _named("SCHEMA_REVISION", "SELECT version_num FROM redelivery.alembic_version")
#: The embedded server's own checks (``embedded.ensure_running``).
DATA_DIRECTORY = _named("DATA_DIRECTORY", "SHOW data_directory")
DATABASE_EXISTS = _named("DATABASE_EXISTS", "SELECT 1 FROM pg_database WHERE datname = %(name)s")
CREATE_DATABASE = sql.SQL("/* redelivery:CREATE_DATABASE */ CREATE DATABASE {name}")
SET_ROLE_PASSWORD = sql.SQL("/* redelivery:SET_ROLE_PASSWORD */ ALTER ROLE {role} PASSWORD {password}")
RELOAD_CONF = _named("RELOAD_CONF", "SELECT pg_reload_conf()")
GROUP_NAMES = _named("GROUP_NAMES", "SELECT id, name FROM consumer_groups")
TOPIC_NAMES = _named("TOPIC_NAMES", "SELECT id, name FROM topics")
DB_NOW = _named("DB_NOW", "SELECT now()")

# ---- dead-letter queues ---------------------------------------------------------------------------

#: Register the DLQ names not known yet (only those: see CREATE_TOPIC on identity values).
REGISTER_DLQ_NAMES = _named("REGISTER_DLQ_NAMES", """
    INSERT INTO dead_letter_queues (name)
    SELECT n FROM unnest(%(names)s::text[]) AS n
    WHERE NOT EXISTS (SELECT 1 FROM dead_letter_queues q WHERE q.name = n)
    ON CONFLICT (name) DO NOTHING""")
DLQ_IDS = _named("DLQ_IDS", "SELECT name, id FROM dead_letter_queues WHERE name = ANY(%(names)s::text[])")
DLQ_TABLE_STATE = _named("DLQ_TABLE_STATE", """
    SELECT name, table_created_at FROM dead_letter_queues WHERE id = %(dlq_id)s""")
DLQS_WITHOUT_TABLE = _named("DLQS_WITHOUT_TABLE", """
    SELECT id FROM dead_letter_queues WHERE table_created_at IS NULL""")
MARK_DLQ_TABLE_CREATED = _named("MARK_DLQ_TABLE_CREATED", """
    UPDATE dead_letter_queues SET table_created_at = now() WHERE id = %(dlq_id)s""")
#: A DLQ's table: a partition of dlq_messages named after the DLQ (the name is validated first).
CREATE_DLQ_TABLE = sql.SQL(
    "/* redelivery:CREATE_DLQ_TABLE */ "
    "CREATE TABLE IF NOT EXISTS {table} PARTITION OF dlq_messages FOR VALUES IN ({dlq_id})")
#: Emptying the state store (tests and benchmarks only): its tables, found rather than listed so
#: that a new table is never forgotten; the DLQ tables are dropped, as their queues are forgotten.
STATE_STORE_TABLES = _named("STATE_STORE_TABLES", """
    SELECT tablename FROM pg_tables WHERE schemaname = 'redelivery' AND tablename <> 'alembic_version'
    ORDER BY 1""")
DLQ_NAMES = _named("DLQ_NAMES", "SELECT name FROM dead_letter_queues")
DROP_DLQ_TABLE = sql.SQL("/* redelivery:DROP_DLQ_TABLE */ DROP TABLE IF EXISTS {table}")
TRUNCATE_TABLES = sql.SQL("/* redelivery:TRUNCATE_TABLES */ TRUNCATE {tables} RESTART IDENTITY CASCADE")
#: Transaction-scoped advisory locks: (namespace, key).
ADVISORY_XACT_LOCK = _named("ADVISORY_XACT_LOCK", "SELECT pg_advisory_xact_lock(%(namespace)s, %(key)s)")

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
    SELECT count(*) FROM deliveries WHERE group_id = %(g)s AND topic_id = %(topic_id)s AND state = 'READY'""")

# ---- consume --------------------------------------------------------------------------------------

# The claimed ids go to the UPDATE as an array: a primary-key lookup. Joined as a table, they were
# matched by scanning every delivery of the group, slower as the table grew.
RECEIVE = _named("RECEIVE", f"""
    WITH claimed AS (
      SELECT message_id FROM deliveries
      WHERE group_id = %(g)s AND topic_id = %(topic_id)s AND state = 'READY'
      ORDER BY message_id LIMIT %(n)s FOR UPDATE SKIP LOCKED),
    leased AS (
      UPDATE deliveries d SET state = 'INFLIGHT', delivery_count = d.delivery_count + 1,
          invisible_until = {AT} + make_interval(secs => %(lease)s), updated_at = now()
      WHERE d.message_id = ANY(ARRAY(SELECT message_id FROM claimed)) AND d.group_id = %(g)s
        RETURNING d.message_id, d.delivery_count, d.reconsume_times, d.delay_level, d.invisible_until,
                d.last_error, d.redrive_count)
    SELECT l.message_id, m.key, m.body, m.content_type, m.properties::text, m.published_at,
           l.delivery_count, l.reconsume_times, l.delay_level, l.invisible_until,
           coalesce(m.origin_message_id, m.id), l.last_error, l.redrive_count
    FROM leased l JOIN messages m ON m.id = l.message_id ORDER BY l.message_id""")

#: Commit the deliveries the receipts answer; receipts that match nothing (late, repeated) are
#: counted as stale on the group, in the same statement, when ``count_stale`` (``settle`` counts
#: them itself, last, so that its group row is locked after every delivery row it changes).
#: Returns how many were acknowledged.
ACK = _named("ACK", f"""
    WITH acked AS (
      UPDATE deliveries d SET state = 'COMMITTED', invisible_until = NULL, updated_at = now()
      FROM unnest(%(ids)s::bigint[], %(counts)s::int[]) AS i(message_id, delivery_count)
      WHERE d.message_id = i.message_id AND d.group_id = %(g)s AND {_IS_INFLIGHT}
        AND d.delivery_count = i.delivery_count
      RETURNING 1),
    n AS (SELECT count(*) AS acked FROM acked),
    stale AS (
      UPDATE consumer_groups g
      SET stale_receipts = g.stale_receipts + cardinality(%(ids)s::bigint[]) - n.acked
      FROM n WHERE g.id = %(g)s AND %(count_stale)s AND n.acked < cardinality(%(ids)s::bigint[])
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
    SELECT stale_receipts FROM consumer_groups WHERE id = %(g)s""")
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

# ---- tier window ----------------------------------------------------------------------------------

#: Quantile cut points of the message ids a window would touch (``plan_ranges``).
PLAN_WINDOW_RANGES = _named("PLAN_WINDOW_RANGES", f"""
    SELECT min(message_id), max(message_id),
           percentile_disc(%(fractions)s::float8[]) WITHIN GROUP (ORDER BY message_id)
    FROM deliveries d WHERE ({_DUE}) OR ({_EXPIRED})""")
#: How many deliveries a window would touch.
WINDOW_CANDIDATES = _named("WINDOW_CANDIDATES", f"""
    SELECT count(*) FROM deliveries d WHERE ({_DUE}) OR ({_EXPIRED})""")
#: DLQs without a table that a window would dead-letter into.
WINDOW_DLQS_NEEDED = _named("WINDOW_DLQS_NEEDED", f"""
    WITH {POLICIES_CTE}
    SELECT DISTINCT p.dlq_id FROM deliveries d JOIN policies p ON {POLICY_JOIN}
    WHERE p.dlq_id = ANY(%(missing)s::int[]) AND p.max_times <> -1 AND (
          ({_EXPIRED} AND d.reconsume_times >= p.max_times)
       OR ({_DUE} AND d.reconsume_times > p.max_times))""")
#: A lease that ended is a failed delivery: the retry is due its policy's wait after the lease end.
EXPIRE_LEASES_RETRY = _named("EXPIRE_LEASES_RETRY", f"""
    WITH {POLICIES_CTE}, retried AS (
      UPDATE deliveries d SET state = 'WAITING_RETRY',
          reconsume_times = d.reconsume_times + 1, delay_level = {NEXT_LEVEL},
          due_at = d.invisible_until + make_interval(secs => {NEXT_DELAY}),
          last_error = %(lease_error)s, last_failure_at = d.invisible_until,
          first_failure_at = coalesce(d.first_failure_at, d.invisible_until),
          attempts = {_LEASE_FAILED}, invisible_until = NULL, updated_at = now()
      FROM policies p
      WHERE {_IN_RANGE} AND {_EXPIRED} AND {CAN_RETRY}
      RETURNING d.group_id)
    SELECT group_id, count(*) FROM retried GROUP BY 1""")
EXPIRE_LEASES_DEAD_LETTER = _named("EXPIRE_LEASES_DEAD_LETTER", f"""
    WITH {POLICIES_CTE}, moved AS (
      UPDATE deliveries d SET state = 'DLQ', last_error = %(lease_error)s,
          last_failure_at = d.invisible_until,
          first_failure_at = coalesce(d.first_failure_at, d.invisible_until),
          attempts = {_LEASE_FAILED}, invisible_until = NULL, due_at = NULL, updated_at = now()
      FROM policies p
      WHERE {_IN_RANGE} AND {_EXPIRED} AND NOT {CAN_RETRY}
      {_MOVED_RETURNING}),
    {_DLQ_COPY}""")
#: Due retries of subscriptions without a ready-backlog cap (PROMOTE_CAPPED does the others).
PROMOTE = _named("PROMOTE", f"""
    WITH {POLICIES_CTE}, promoted AS (
      UPDATE deliveries d SET state = 'READY', ready_at = now(), updated_at = now()
      FROM policies p
      WHERE {_IN_RANGE} AND {_DUE} AND p.cap IS NULL
        AND (p.max_times = -1 OR d.reconsume_times <= p.max_times)
      {_PROMOTED_COUNTS}""")
#: Due retries whose policy's max reconsume times was lowered below theirs while they waited.
DEAD_LETTER_OVER_MAX = _named("DEAD_LETTER_OVER_MAX", f"""
    WITH {POLICIES_CTE}, moved AS (
      UPDATE deliveries d SET state = 'DLQ', due_at = NULL, updated_at = now()
      FROM policies p
      WHERE {_IN_RANGE} AND {_DUE} AND p.max_times <> -1 AND d.reconsume_times > p.max_times
      {_MOVED_RETURNING}),
    {_DLQ_COPY}""")
#: Due retries of one capped subscription (topic_id, g), oldest due first, at most ``room``.
PROMOTE_CAPPED = _named("PROMOTE_CAPPED", f"""
    WITH {POLICIES_CTE}, chosen AS (
      SELECT d.message_id FROM deliveries d
      WHERE d.group_id = %(g)s AND d.topic_id = %(topic_id)s AND {_DUE}
      ORDER BY d.due_at, d.message_id LIMIT %(room)s FOR UPDATE),
    promoted AS (
      UPDATE deliveries d SET state = 'READY', ready_at = now(), updated_at = now()
      FROM policies p, chosen c
      WHERE d.message_id = c.message_id AND d.group_id = %(g)s AND {POLICY_JOIN} AND {_DUE}
        AND (p.max_times = -1 OR d.reconsume_times <= p.max_times)
      {_PROMOTED_COUNTS}""")
DUE_COUNT = _named("DUE_COUNT", f"""
    SELECT count(*) FROM deliveries d WHERE d.group_id = %(g)s AND d.topic_id = %(topic_id)s AND {_DUE}""")

TIER_RUN_START = _named("TIER_RUN_START", """
    INSERT INTO tier_runs (run_key, tier, levels, window_start, window_end, dry_run)
    VALUES (%(run_key)s, %(tier)s, %(levels)s::smallint[], %(window_start)s, %(window_end)s, %(dry_run)s)
    ON CONFLICT (run_key) DO UPDATE SET tier = EXCLUDED.tier, levels = EXCLUDED.levels,
        window_start = EXCLUDED.window_start, window_end = EXCLUDED.window_end,
        dry_run = EXCLUDED.dry_run, status = 'running', started_at = now(),
        finished_at = NULL, summary = NULL""")
#: ``status`` 'success' with the summary, or 'failed' (summary NULL).
#: A run that is not a dry run is one observation of its tier's run-duration histogram
#: (``bucket_*``, ``observed_sum``: its duration, seconds), in the same transaction.
TIER_RUN_FINISH = _named("TIER_RUN_FINISH", f"""
    WITH finished AS (
      UPDATE tier_runs SET status = %(status)s, finished_at = now(), summary = %(summary)s::jsonb
      WHERE run_key = %(run_key)s RETURNING tier, dry_run)
    {_HISTOGRAM_ADD.format(metric="run_duration", rows="FROM finished WHERE NOT dry_run")}""")
#: The lateness of a tier run's transaction's promotions (``bucket_*``, ``observed_sum`` in seconds:
#: ``transitions.count_moves``), after its ADD_GROUP_TOTALS.
ADD_RETRY_LATENESS = _named("ADD_RETRY_LATENESS", f"""
    WITH finished AS (SELECT %(tier)s::text AS tier)
    {_HISTOGRAM_ADD.format(metric="retry_lateness", rows="FROM finished")}""")
#: Messages waiting at levels a table of ``level_count`` levels does not have: (level, count).
WAITING_BEYOND_LEVELS = _named("WAITING_BEYOND_LEVELS", """
    SELECT delay_level, count(*) FROM deliveries
    WHERE state = 'WAITING_RETRY' AND delay_level > %(level_count)s::int GROUP BY 1 ORDER BY 1""")
TIER_RUN_RESULT = _named("TIER_RUN_RESULT", """
    SELECT status, summary FROM tier_runs WHERE run_key = %(run_key)s""")
LATEST_TIER_RUNS = _named("LATEST_TIER_RUNS", """
    SELECT DISTINCT ON (tier) tier, window_end, status, summary->>'promoted', summary->>'dead_lettered',
           summary->'lateness_seconds'->>'p99'
    FROM tier_runs ORDER BY tier, finished_at DESC NULLS LAST""")

# ---- dead letters ---------------------------------------------------------------------------------

DLQ_COUNT = _named("DLQ_COUNT", f"SELECT count(*) FROM dlq_messages q WHERE {DLQ_FILTER}")
#: The matching dead letters, oldest first, at most ``limit``.
DLQ_SELECT = _named("DLQ_SELECT", f"""
    SELECT q.message_id, t.name AS topic, dq.name AS dead_letter_queue, q.reason::text AS reason,
           q.last_error, q.delivery_count, q.reconsume_times, q.dead_lettered_at, q.first_failure_at,
           q.last_failure_at, q.redrive_count,
           q.origin_message_id, q.key, q.body, q.content_type, q.properties, q.attempts
    FROM {_DLQ_FROM} WHERE {DLQ_FILTER}
    ORDER BY q.dead_lettered_at, q.message_id LIMIT %(limit)s""")
#: Per group with dead letters (one group by name, or all when ``group`` is NULL).
DLQ_SUMMARY_GROUPS = _named("DLQ_SUMMARY_GROUPS", """
    SELECT g.id, g.name, count(*), min(q.dead_lettered_at), max(q.dead_lettered_at)
    FROM dlq_messages q JOIN consumer_groups g ON g.id = q.group_id
    WHERE %(group)s::text IS NULL OR g.name = %(group)s::text
    GROUP BY 1, 2 ORDER BY 3 DESC, 2""")
DLQ_TOP_QUEUES = _named("DLQ_TOP_QUEUES", f"""
    SELECT dq.name, count(*) FROM {_DLQ_FROM} WHERE q.group_id = %(g)s
    GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT %(limit)s""")
DLQ_TOP_REASONS = _named("DLQ_TOP_REASONS", f"""
    SELECT q.reason::text, count(*) FROM {_DLQ_FROM} WHERE q.group_id = %(g)s
    GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT %(limit)s""")
DLQ_TOP_ERRORS = _named("DLQ_TOP_ERRORS", f"""
    SELECT coalesce(q.last_error, '(none)'), count(*) FROM {_DLQ_FROM} WHERE q.group_id = %(g)s
    GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT %(limit)s""")

# ---- redrive --------------------------------------------------------------------------------------

#: Quantile cut points of the message ids a redrive selects (``plan_ranges``).
PLAN_REDRIVE_RANGES = _named("PLAN_REDRIVE_RANGES", f"""
    SELECT min(message_id), max(message_id),
           percentile_disc(%(fractions)s::float8[]) WITHIN GROUP (ORDER BY message_id)
    FROM dlq_messages q WHERE {DLQ_FILTER}""")
#: Start a redrive run, or resume it (same run key): a finished run stays finished, except that a
#: real run after a dry run under the same key moves (once real, a run stays real). A key stands
#: for one selection (``filter`` without ``dry_run``), and a dry run never resumes a real run:
#: otherwise the conflicting row is left as it is and nothing is returned (REDRIVE_RUN_BY_KEY says
#: why), so a refused call changes nothing.
REDRIVE_RUN_START = _named("REDRIVE_RUN_START", """
    INSERT INTO redrive_runs (run_key, triggered_by, group_id, filter, dry_run)
    VALUES (%(run_key)s, %(triggered_by)s, %(g)s, %(filter)s, %(dry_run)s)
    ON CONFLICT (run_key) DO UPDATE SET
        status = CASE WHEN redrive_runs.status = 'success' AND (EXCLUDED.dry_run OR NOT redrive_runs.dry_run)
                      THEN 'success' ELSE 'running' END,
        dry_run = redrive_runs.dry_run AND EXCLUDED.dry_run,
        finished_at = CASE WHEN redrive_runs.dry_run AND NOT EXCLUDED.dry_run THEN NULL
                           ELSE redrive_runs.finished_at END
    WHERE redrive_runs.filter - 'dry_run' = EXCLUDED.filter - 'dry_run'
      AND (redrive_runs.dry_run OR NOT EXCLUDED.dry_run)
    RETURNING id, moved, status, dry_run, filter""")
#: A redrive run's audit record by its key (why REDRIVE_RUN_START refused a call; the request a
#: spark-submit job runs; what it did), the columns of REDRIVE_RUN_FINISH.
REDRIVE_RUN_BY_KEY = _named("REDRIVE_RUN_BY_KEY", """
    SELECT run_key, triggered_by, filter, dry_run, status, matched, filter->'max_messages' AS max_messages,
           moved, held_by_backlog_cap, sample, started_at, finished_at
    FROM redrive_runs WHERE run_key = %(run_key)s""")
#: Pace a run's batches (all its Spark tasks included): reserve the next ``seconds`` of the run's
#: schedule; returns how long to wait (seconds, <= 0: go now) before moving the batch.
RESERVE_REDRIVE_SLOT = _named("RESERVE_REDRIVE_SLOT", """
    UPDATE redrive_runs
    SET next_slot_at = greatest(next_slot_at, clock_timestamp())
                       + make_interval(secs => %(seconds)s::float8)
    WHERE id = %(run)s
    RETURNING extract(epoch FROM next_slot_at - make_interval(secs => %(seconds)s::float8)
                                 - clock_timestamp())""")
#: How many selected dead letters come from topic ``dest`` (a redrive "to another topic" may not
#: copy a message into its own topic).
DLQ_COUNT_FROM_TOPIC = _named("DLQ_COUNT_FROM_TOPIC", f"""
    SELECT count(*) FROM dlq_messages q WHERE {DLQ_FILTER} AND q.topic_id = %(dest)s::int""")
#: One batch of a redrive, in one transaction: up to ``n`` selected dead letters (in the id range
#: [lo, hi) when given; never one this run moved already) leave the DLQ table; their deliveries go
#: back to READY, or, with a destination topic ``dest``, are closed as COMMITTED while a copy is
#: published to ``dest`` for its groups; every move is audited. The delivery count is kept (it never
#: decreases: old receipts stay stale); ``reset`` restores the retry budget (reconsume times 0);
#: the redrive count goes up. Returns (dead letters removed, deliveries revived): a difference
#: means a DLQ row without a DLQ delivery, and the caller rolls back.
REDRIVE_MOVE_BATCH = _named("REDRIVE_MOVE_BATCH", f"""
    WITH picked AS (
      SELECT q.dlq_id, q.group_id, q.message_id FROM dlq_messages q
      WHERE {DLQ_FILTER}
        AND (%(lo)s::bigint IS NULL OR (q.message_id >= %(lo)s::bigint AND q.message_id < %(hi)s::bigint))
        AND NOT EXISTS (SELECT 1 FROM redrive_moves rm WHERE rm.run_id = %(run)s
                        AND rm.group_id = q.group_id AND rm.message_id = q.message_id)
      ORDER BY q.message_id LIMIT %(n)s FOR UPDATE SKIP LOCKED),
    removed AS (
      DELETE FROM dlq_messages q USING picked p
      WHERE q.dlq_id = p.dlq_id AND q.group_id = p.group_id AND q.message_id = p.message_id
      RETURNING q.message_id, q.group_id, q.key, q.body, q.content_type, q.properties, q.origin_message_id),
    revived AS (
      UPDATE deliveries d SET
          state = CASE WHEN %(dest)s::int IS NULL THEN 'READY' ELSE 'COMMITTED' END::delivery_state,
          reconsume_times = CASE WHEN %(dest)s::int IS NULL AND %(reset)s THEN 0 ELSE d.reconsume_times END,
          redrive_count = d.redrive_count + 1,
          delay_level = NULL, due_at = NULL, invisible_until = NULL,
          ready_at = CASE WHEN %(dest)s::int IS NULL THEN now() ELSE d.ready_at END,
          last_error = CASE WHEN %(dest)s::int IS NULL THEN d.last_error
                            ELSE 'redriven to topic ' || %(dest_name)s::text END,
          updated_at = now()
      FROM removed r WHERE d.message_id = r.message_id AND d.group_id = r.group_id AND d.state = 'DLQ'
      RETURNING d.message_id, d.group_id),
    copies AS (
      INSERT INTO messages (topic_id, key, body, content_type, properties, origin_message_id)
      SELECT %(dest)s::int, r.key, r.body, r.content_type, r.properties, r.origin_message_id
      FROM removed r WHERE %(dest)s::int IS NOT NULL ORDER BY r.message_id RETURNING id, published_at),
    fan AS (
      INSERT INTO deliveries (message_id, group_id, topic_id, ready_at, created_at, updated_at)
      SELECT c.id, s.group_id, %(dest)s::int, c.published_at, c.published_at, c.published_at
      FROM copies c JOIN subscriptions s ON s.topic_id = %(dest)s::int),
    logged AS (
      INSERT INTO redrive_moves (run_id, group_id, message_id)
      SELECT %(run)s, group_id, message_id FROM revived RETURNING 1),
    counted AS (
      UPDATE redrive_runs SET moved = moved + (SELECT count(*) FROM logged) WHERE id = %(run)s RETURNING 1),
    -- the group's redriven total: its new value reads all of revived, so the row is locked last
    totals AS (
      UPDATE consumer_groups SET redriven = redriven + (SELECT count(*) FROM revived)
      WHERE id = %(g)s AND EXISTS (SELECT 1 FROM revived))
    SELECT (SELECT count(*) FROM removed), (SELECT count(*) FROM revived) FROM counted""")
#: Close a redrive run: ``status`` and, when given, ``matched``, ``held_by_backlog_cap`` and ``sample``.
REDRIVE_RUN_FINISH = _named("REDRIVE_RUN_FINISH", """
    UPDATE redrive_runs SET status = %(status)s, finished_at = now(),
        matched = coalesce(%(matched)s::bigint, matched),
        held_by_backlog_cap = coalesce(%(held_by_backlog_cap)s::bigint, held_by_backlog_cap),
        sample = coalesce(%(sample)s::jsonb, sample)
    WHERE id = %(run)s
    RETURNING run_key, triggered_by, filter, dry_run, status, matched, filter->'max_messages' AS max_messages,
              moved, held_by_backlog_cap, sample, started_at, finished_at""")
LATEST_REDRIVES = _named("LATEST_REDRIVES", """
    SELECT r.run_key, g.name, r.triggered_by, r.dry_run, r.status, r.matched,
           (r.filter->>'max_messages')::bigint, r.moved, r.held_by_backlog_cap, r.started_at
    FROM redrive_runs r JOIN consumer_groups g ON g.id = r.group_id ORDER BY r.id DESC LIMIT 10""")

# ---- operator page --------------------------------------------------------------------------------
# The "Dead letters" page (``redelivery.airflow.ui``), read on each page load. Like the metrics, each
# costs what it counts (a live state through its partial index, dead letters through their narrow
# index, a tier's latest runs through tier_runs_window): the deliveries' history (COMMITTED) is not read.

#: Deliveries per group and live state, summed over the group's topics: READY, INFLIGHT,
#: WAITING_RETRY, and DLQ counted as its dead-letter rows (the same, row for row: invariant 2).
GROUP_STATE_COUNTS = _named("GROUP_STATE_COUNTS", """
    SELECT g.name, c.state, c.n
    FROM (SELECT group_id, 'READY' AS state, count(*) AS n FROM deliveries WHERE state = 'READY' GROUP BY 1
          UNION ALL
          SELECT group_id, 'INFLIGHT', count(*) FROM deliveries WHERE state = 'INFLIGHT' GROUP BY 1
          UNION ALL
          SELECT group_id, 'WAITING_RETRY', count(*) FROM deliveries WHERE state = 'WAITING_RETRY' GROUP BY 1
          UNION ALL
          SELECT group_id, 'DLQ', count(*) FROM dlq_messages GROUP BY 1) c
    JOIN consumer_groups g ON g.id = c.group_id ORDER BY 1, 2""")
#: Retries waiting (WAITING_RETRY) per group and delay level, summed over the group's topics.
GROUP_WAITING_PER_LEVEL = _named("GROUP_WAITING_PER_LEVEL", """
    SELECT g.name, c.delay_level, c.n
    FROM (SELECT group_id, delay_level, count(*) AS n FROM deliveries
          WHERE state = 'WAITING_RETRY' GROUP BY 1, 2) c
    JOIN consumer_groups g ON g.id = c.group_id ORDER BY 1, 2""")
#: The tiers that have runs, by a skip scan of tier_runs_window (one index descent per tier).
_TIERS_WITH_RUNS = """WITH RECURSIVE tiers AS (
        SELECT min(tier) AS tier FROM tier_runs
        UNION ALL
        SELECT (SELECT min(r.tier) FROM tier_runs r WHERE r.tier > t.tier)
        FROM tiers t WHERE t.tier IS NOT NULL)"""
#: The latest ``n`` successful real runs of each tier, oldest first: window end, promoted, and the
#: lateness (window end minus due time) p50, p99 and max in seconds (NULL: the run promoted nothing).
#: The tiers are found by a skip scan of tier_runs_window, then each tier's runs read backwards from it.
RECENT_TIER_LATENESS = _named("RECENT_TIER_LATENESS", f"""
    {_TIERS_WITH_RUNS}
    SELECT t.tier, r.window_end, (r.summary->>'promoted')::bigint,
           (r.summary->'lateness_seconds'->>'p50')::float8, (r.summary->'lateness_seconds'->>'p99')::float8,
           (r.summary->'lateness_seconds'->>'max')::float8
    FROM tiers t CROSS JOIN LATERAL (
        SELECT window_end, summary FROM tier_runs
        WHERE tier = t.tier AND status = 'success' AND NOT dry_run
        ORDER BY window_end DESC LIMIT %(n)s) r
    WHERE t.tier IS NOT NULL ORDER BY 1, 2""")
#: The groups the page lists, at most ``limit``: each group whose name contains ``name`` (as text,
#: case-insensitively; '' matches every group) and that has live deliveries (READY, INFLIGHT,
#: WAITING_RETRY) or dead letters, most dead letters first, then by name. Per group: id, name, its
#: counts per live state, its oldest and newest dead-lettering time, and how many groups matched in
#: all (before the limit). The counts come from the partial indexes and dlq_messages_group.
PAGE_GROUPS = _named("PAGE_GROUPS", """
    WITH chosen AS MATERIALIZED (
        SELECT id, name FROM consumer_groups WHERE strpos(lower(name), lower(%(name)s::text)) > 0),
    counts AS (
        SELECT group_id, count(*) AS ready, 0::bigint AS inflight, 0::bigint AS waiting, 0::bigint AS dead,
               NULL::timestamptz AS oldest, NULL::timestamptz AS newest
        FROM deliveries WHERE state = 'READY' AND group_id IN (SELECT id FROM chosen) GROUP BY 1
        UNION ALL
        SELECT group_id, 0, count(*), 0, 0, NULL, NULL
        FROM deliveries WHERE state = 'INFLIGHT' AND group_id IN (SELECT id FROM chosen) GROUP BY 1
        UNION ALL
        SELECT group_id, 0, 0, count(*), 0, NULL, NULL
        FROM deliveries WHERE state = 'WAITING_RETRY' AND group_id IN (SELECT id FROM chosen) GROUP BY 1
        UNION ALL
        SELECT group_id, 0, 0, 0, count(*), min(dead_lettered_at), max(dead_lettered_at)
        FROM dlq_messages WHERE group_id IN (SELECT id FROM chosen) GROUP BY 1),
    per_group AS (
        SELECT c.id, c.name, sum(k.ready)::bigint AS ready, sum(k.inflight)::bigint AS inflight,
               sum(k.waiting)::bigint AS waiting, sum(k.dead)::bigint AS dead, min(k.oldest) AS oldest,
               max(k.newest) AS newest
        FROM counts k JOIN chosen c ON c.id = k.group_id GROUP BY 1, 2)
    SELECT id, name, ready, inflight, waiting, dead, oldest, newest, count(*) OVER ()
    FROM per_group ORDER BY dead DESC, name LIMIT %(limit)s""")
#: Retries waiting (WAITING_RETRY) per delay level of the groups ``ids``: (group id, level, count).
PAGE_WAITING_PER_LEVEL = _named("PAGE_WAITING_PER_LEVEL", """
    SELECT group_id, delay_level, count(*) FROM deliveries
    WHERE state = 'WAITING_RETRY' AND group_id = ANY(%(ids)s::int[]) GROUP BY 1, 2 ORDER BY 1, 2""")
#: Dead letters per DLQ of the groups ``ids``, at most ``limit`` DLQs per group, most first:
#: (group id, DLQ name, count).
PAGE_DLQ_QUEUES = _named("PAGE_DLQ_QUEUES", """
    SELECT group_id, name, n FROM (
        SELECT c.group_id, dq.name, c.n,
               row_number() OVER (PARTITION BY c.group_id ORDER BY c.n DESC, dq.name) AS rank
        FROM (SELECT group_id, dlq_id, count(*) AS n FROM dlq_messages
              WHERE group_id = ANY(%(ids)s::int[]) GROUP BY 1, 2) c
        JOIN dead_letter_queues dq ON dq.id = c.dlq_id) r
    WHERE rank <= %(limit)s ORDER BY 1, 3 DESC, 2""")
#: Dead letters per reason of the groups ``ids`` (every reason a group has): (group id, reason,
#: count), most first.
PAGE_DLQ_REASONS = _named("PAGE_DLQ_REASONS", """
    SELECT group_id, reason::text, count(*) FROM dlq_messages
    WHERE group_id = ANY(%(ids)s::int[]) GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2""")
#: The ``limit`` most frequent last errors of the groups ``ids`` (a dead letter's whole row is
#: read: the error is not in an index): (group id, error or '(none)', count), most first.
PAGE_DLQ_TOP_ERRORS = _named("PAGE_DLQ_TOP_ERRORS", """
    SELECT group_id, error, n FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.group_id ORDER BY c.n DESC, c.error) AS rank
        FROM (SELECT group_id, coalesce(last_error, '(none)') AS error, count(*) AS n FROM dlq_messages
              WHERE group_id = ANY(%(ids)s::int[]) GROUP BY 1, 2) c) r
    WHERE rank <= %(limit)s ORDER BY 1, 3 DESC, 2""")
#: Per tier with runs: its latest run (by window end: run key, window end, status, dry run,
#: promoted, dead-lettered, lateness p99 in seconds) and when its latest finished run finished.
#: The tiers by the skip scan of RECENT_TIER_LATENESS, each tier's runs read backwards.
PAGE_TIER_RUNS = _named("PAGE_TIER_RUNS", f"""
    {_TIERS_WITH_RUNS}
    SELECT t.tier, r.run_key, r.window_end, r.status, r.dry_run, (r.summary->>'promoted')::bigint,
           (r.summary->>'dead_lettered')::bigint, (r.summary->'lateness_seconds'->>'p99')::float8,
           f.finished_at
    FROM tiers t
    CROSS JOIN LATERAL (
        SELECT run_key, window_end, status, dry_run, summary FROM tier_runs
        WHERE tier = t.tier ORDER BY window_end DESC LIMIT 1) r
    LEFT JOIN LATERAL (
        SELECT finished_at FROM tier_runs
        WHERE tier = t.tier AND finished_at IS NOT NULL ORDER BY window_end DESC LIMIT 1) f ON true
    WHERE t.tier IS NOT NULL ORDER BY 1""")
#: Retries waiting at the delay levels ``levels`` (a paused tier's), and how many of them are due
#: (at ``at``, default the database clock): from the index deliveries_waiting alone.
PAGE_WAITING_AT_LEVELS = _named("PAGE_WAITING_AT_LEVELS", f"""
    SELECT count(*), count(*) FILTER (WHERE due_at <= {AT}) FROM deliveries
    WHERE state = 'WAITING_RETRY' AND delay_level = ANY(%(levels)s::smallint[])""")

# ---- metrics --------------------------------------------------------------------------------------
# Read at scrape time (``redelivery.metrics``), together in one read-only snapshot. Each costs what
# it counts: a live state's rows through its partial index, the dead letters through their narrow
# index, the groups, the tiers; never the deliveries' history (COMMITTED is not counted).

#: READY deliveries per subscription: how many, and the age in seconds (at ``at``, default the
#: database clock) of the one READY the longest (ready_at: when it last became READY; rows made
#: READY before migration 0003 have none). Both from the index deliveries_ready_at (0006) alone.
METRICS_READY = _named("METRICS_READY", f"""
    SELECT t.name, g.name, r.n, coalesce(greatest(extract(epoch FROM {AT} - r.oldest), 0), 0)::float8
    FROM (SELECT group_id, topic_id, count(*) AS n, min(ready_at) AS oldest
          FROM deliveries WHERE state = 'READY' GROUP BY 1, 2) r
    JOIN topics t ON t.id = r.topic_id JOIN consumer_groups g ON g.id = r.group_id""")
METRICS_INFLIGHT = _named("METRICS_INFLIGHT", """
    SELECT t.name, g.name, c.n
    FROM (SELECT topic_id, group_id, count(*) AS n FROM deliveries WHERE state = 'INFLIGHT' GROUP BY 1, 2) c
    JOIN topics t ON t.id = c.topic_id JOIN consumer_groups g ON g.id = c.group_id""")
#: WAITING_RETRY deliveries per subscription and delay level.
METRICS_WAITING = _named("METRICS_WAITING", """
    SELECT t.name, g.name, c.delay_level, c.n
    FROM (SELECT topic_id, group_id, delay_level, count(*) AS n FROM deliveries
          WHERE state = 'WAITING_RETRY' GROUP BY 1, 2, 3) c
    JOIN topics t ON t.id = c.topic_id JOIN consumer_groups g ON g.id = c.group_id""")
#: Dead letters per DLQ, topic, group and reason (the DLQ state of the deliveries, row for row).
METRICS_DEAD_LETTERS = _named("METRICS_DEAD_LETTERS", """
    SELECT dq.name, t.name, g.name, c.reason::text, c.n
    FROM (SELECT dlq_id, group_id, topic_id, reason, count(*) AS n FROM dlq_messages GROUP BY 1, 2, 3, 4) c
    JOIN dead_letter_queues dq ON dq.id = c.dlq_id JOIN topics t ON t.id = c.topic_id
    JOIN consumer_groups g ON g.id = c.group_id""")
METRICS_GROUP_TOTALS = _named("METRICS_GROUP_TOTALS", """
    SELECT name, promoted, dead_lettered, redriven, stale_receipts FROM consumer_groups""")
METRICS_HISTOGRAMS = _named("METRICS_HISTOGRAMS", """
    SELECT tier, metric, bounds, counts, sum FROM tier_histograms ORDER BY 1, 2""")

# ---- retention ------------------------------------------------------------------------------------
# Records older than their retention (seconds), deleted a bounded number of rows at a time.

#: A batch id publishes once within the retention of its record.
CLEANUP_PUBLISH_BATCHES = _named("CLEANUP_PUBLISH_BATCHES", """
    DELETE FROM publish_batches WHERE batch_id = ANY(ARRAY(
      SELECT batch_id FROM publish_batches
      WHERE published_at < now() - make_interval(secs => %(seconds)s::float8) LIMIT %(limit)s))""")
CLEANUP_PUBLISH_PARTS = _named("CLEANUP_PUBLISH_PARTS", """
    DELETE FROM publish_parts WHERE (batch_id, run_id, part) IN (
      SELECT batch_id, run_id, part FROM publish_parts
      WHERE staged_at < now() - make_interval(secs => %(seconds)s::float8) LIMIT %(limit)s)""")
#: Staged rows of publishes that never finished.
CLEANUP_PUBLISH_STAGING = _named("CLEANUP_PUBLISH_STAGING", """
    DELETE FROM publish_staging WHERE ctid = ANY(ARRAY(
      SELECT ctid FROM publish_staging
      WHERE staged_at < now() - make_interval(secs => %(seconds)s::float8) LIMIT %(limit)s))""")
CLEANUP_TIER_RUNS = _named("CLEANUP_TIER_RUNS", """
    DELETE FROM tier_runs WHERE id = ANY(ARRAY(
      SELECT id FROM tier_runs
      WHERE finished_at < now() - make_interval(secs => %(seconds)s::float8) LIMIT %(limit)s))""")
#: Redrive runs with their per-message audit rows (redrive_moves cascade).
CLEANUP_REDRIVE_RUNS = _named("CLEANUP_REDRIVE_RUNS", """
    DELETE FROM redrive_runs WHERE id = ANY(ARRAY(
      SELECT id FROM redrive_runs
      WHERE finished_at < now() - make_interval(secs => %(seconds)s::float8) LIMIT %(limit)s))""")

# ---- asset watchers -------------------------------------------------------------------------------
# ``airflow.triggers.ReadyMessagesTrigger``: new READY deliveries of a subscription since a watermark.

#: The watermark's horizon: the start of the oldest transaction open in this database (client
#: sessions but this one), or now; never more than ``settle`` seconds ago. A delivery's ready_at is
#: its transaction's start, so every delivery with an older ready_at is committed by then.
READY_HORIZON = _named("READY_HORIZON", """
    SELECT least(now(), greatest(coalesce(min(a.xact_start), now()),
                                 now() - make_interval(secs => %(settle)s::float8)))
    FROM pg_stat_activity a
    WHERE a.datname = current_database() AND a.backend_type = 'client backend'
      AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL""")
#: How many deliveries of (topic, group) are READY with ready_at in [watermark, horizon)
#: (watermark NULL: from the beginning).
READY_SINCE = _named("READY_SINCE", """
    SELECT count(*) FROM deliveries d
    WHERE d.group_id = (SELECT id FROM consumer_groups WHERE name = %(group)s)
      AND d.topic_id = (SELECT id FROM topics WHERE name = %(topic)s) AND d.state = 'READY'
      AND d.ready_at >= coalesce(%(watermark)s::timestamptz, '-infinity') AND d.ready_at < %(horizon)s""")
#: An asset's claimed watermark (events left the trigger up to it) and its confirmed one (Airflow
#: stored the events up to it; NULL: none confirmed yet).
ASSET_WATERMARK = _named("ASSET_WATERMARK", """
    SELECT watermark, confirmed FROM asset_watermarks WHERE asset_uri = %(asset_uri)s""")
#: Claim an event: move an asset's watermark from ``previous`` (NULL: none stored yet) forward to
#: ``watermark`` (never back: a repeat from the confirmed watermark can end below it) and count the
#: event; returns the claimed watermark, or nothing when the stored one is no longer ``previous``
#: (another copy of the trigger fired first).
ADVANCE_ASSET_WATERMARK = _named("ADVANCE_ASSET_WATERMARK", """
    INSERT INTO asset_watermarks (asset_uri, watermark) VALUES (%(asset_uri)s, %(watermark)s)
    ON CONFLICT (asset_uri) DO UPDATE
        SET watermark = greatest(asset_watermarks.watermark, EXCLUDED.watermark),
            events = asset_watermarks.events + 1, fired_at = now()
        WHERE asset_watermarks.watermark IS NOT DISTINCT FROM %(previous)s::timestamptz
    RETURNING watermark""")
#: Move an asset's confirmed watermark forward to ``watermark`` (never back, never past the claimed
#: one): Airflow stored the events before it (``ReadyMessagesProducer.advance``).
CONFIRM_ASSET_WATERMARK = _named("CONFIRM_ASSET_WATERMARK", """
    UPDATE asset_watermarks SET confirmed = least(watermark, %(watermark)s::timestamptz)
    WHERE asset_uri = %(asset_uri)s AND (confirmed IS NULL OR confirmed < %(watermark)s::timestamptz)""")

#: The statements that move deliveries between states (docs/ARCHITECTURE.md, "State changes").
STATE_CHANGES = ("FAN_OUT", "RECEIVE", "ACK", "FAIL_RETRY", "FAIL_DEAD_LETTER", "EXPIRE_LEASES_RETRY",
                 "EXPIRE_LEASES_DEAD_LETTER", "PROMOTE", "PROMOTE_CAPPED", "DEAD_LETTER_OVER_MAX",
                 "REDRIVE_MOVE_BATCH")
#: Every statement by name (psycopg.sql compositions excepted): the EXPLAIN test runs them all.
ALL: dict[str, str] = {name: value for name, value in dict(globals()).items()
                       if isinstance(value, str) and value.startswith("/* redelivery:")}
# fmt: on
