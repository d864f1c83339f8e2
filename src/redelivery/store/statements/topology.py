"""Topics, groups, subscriptions, dead-letter queue tables, database set-up."""

from __future__ import annotations

from psycopg import sql

from redelivery.store.statements._shared import _named

# The statements keep the layout of SQL, not of Python.
# fmt: off

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
#: Before SUBSCRIBE, in its transaction: wait for the topic's publishers (their publish lock, FOR NO
#: KEY UPDATE, conflicts with FOR SHARE) so that no publish of the topic is half done, and, from the
#: beginning, for a retention run (their advisory lock, shared here: ``log.RETENTION_LOCK``): a
#: partition being detached is not in the log any new snapshot sees, and would be dropped or
#: attached again under the new offset. Nothing: the topic is gone.
LOCK_TOPIC_FOR_SUBSCRIBE = _named("LOCK_TOPIC_FOR_SUBSCRIBE", """
    WITH retention AS MATERIALIZED (
      SELECT pg_advisory_xact_lock_shared(%(namespace)s, %(key)s) WHERE %(from_beginning)s)
    SELECT 1 FROM topics t, (SELECT count(*) FROM retention) waited
    WHERE t.id = %(topic_id)s FOR SHARE OF t""")
#: Subscribe a group to a topic (nothing if it is), after LOCK_TOPIC_FOR_SUBSCRIBE: its consume
#: offset starts at the end of the topic's ids (``from_beginning`` false, Kafka's ``latest``:
#: messages published from now on), which is the id sequence's position, not the log's largest id
#: (a dead letter redriven after retention dropped its message comes back under its old id, and must
#: not go to a group that subscribed after the message had left); or just before the oldest message
#: the log still holds (``earliest``), the same position when it holds none. ``ordered`` and
#: ``on_exhausted`` are the subscription's for life (SUBSCRIPTION_ORDERING reads them back).
SUBSCRIBE = _named("SUBSCRIBE", """
    WITH sequence_end AS (
      SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END AS id FROM message_ids)
    INSERT INTO subscriptions (topic_id, group_id, ordered, on_exhausted, consume_offset)
    SELECT %(topic_id)s, %(group_id)s, %(ordered)s, %(on_exhausted)s,
           CASE WHEN %(from_beginning)s
                THEN coalesce((SELECT min(id) - 1 FROM messages WHERE topic_id = %(topic_id)s), e.id)
                ELSE e.id END
    FROM sequence_end e
    ON CONFLICT DO NOTHING""")
#: Deleting a topic first waits for the writers holding its row (LOCK_TOPIC_FOR_PUBLISH,
#: LOCK_TOPIC_SHARED) and for the receives holding its subscriptions, and keeps new ones out; the
#: next statements then see every row they committed.
LOCK_TOPIC_FOR_DELETE = _named("LOCK_TOPIC_FOR_DELETE", """
    SELECT 1 FROM topics WHERE id = %(topic_id)s FOR UPDATE""")
LOCK_SUBSCRIPTIONS_FOR_DELETE = _named("LOCK_SUBSCRIPTIONS_FOR_DELETE", """
    SELECT 1 FROM subscriptions WHERE topic_id = %(topic_id)s ORDER BY group_id FOR UPDATE""")
#: A topic's delivery rows (waiting for the tier runs and answers that hold them: a dead letter one
#: of them writes is committed before DELETE_TOPIC starts).
DELETE_TOPIC_DELIVERIES = _named("DELETE_TOPIC_DELIVERIES", """
    DELETE FROM deliveries WHERE topic_id = %(topic_id)s""")
#: A topic with its dead letters, its log and its breakers' counted answers; subscriptions (their
#: breakers too) and publish records cascade.
DELETE_TOPIC = _named("DELETE_TOPIC", """
    WITH deleted_dead_letters AS (DELETE FROM dlq_messages WHERE topic_id = %(topic_id)s),
    deleted_outcomes AS (DELETE FROM breaker_outcomes WHERE topic_id = %(topic_id)s),
    deleted_messages AS (DELETE FROM messages WHERE topic_id = %(topic_id)s)
    DELETE FROM topics WHERE id = %(topic_id)s""")
#: Subscriptions with their names and the group's own max reconsume times: all (``all``) or the
#: (topic id, group id) pairs given.
SUBSCRIPTIONS = _named("SUBSCRIPTIONS", """
    SELECT s.topic_id, s.group_id, t.name, g.name, g.max_reconsume_times
    FROM subscriptions s JOIN topics t ON t.id = s.topic_id JOIN consumer_groups g ON g.id = s.group_id
    WHERE %(all)s
       OR (s.topic_id, s.group_id) IN (SELECT * FROM unnest(%(topic_ids)s::int[], %(group_ids)s::int[]))""")
#: Whether a subscription is ordered, and what its exhausted heads do: (ordered, on_exhausted).
SUBSCRIPTION_ORDERING = _named("SUBSCRIPTION_ORDERING", """
    SELECT ordered, on_exhausted FROM subscriptions
    WHERE topic_id = %(topic_id)s AND group_id = %(group_id)s""")
SUBSCRIBED_GROUPS = _named("SUBSCRIBED_GROUPS", """
    SELECT group_id FROM subscriptions WHERE topic_id = %(topic_id)s""")
SUBSCRIBED_TOPICS = _named("SUBSCRIBED_TOPICS", """
    SELECT topic_id FROM subscriptions WHERE group_id = %(group_id)s ORDER BY topic_id""")
SUBSCRIPTION_NAMES = _named("SUBSCRIPTION_NAMES", """
    SELECT t.name, g.name FROM subscriptions s JOIN topics t ON t.id = s.topic_id
    JOIN consumer_groups g ON g.id = s.group_id ORDER BY 1, 2""")
#: How many values the sequence of message ids caches per session (nothing before migration 0012).
MESSAGE_ID_CACHE = _named("MESSAGE_ID_CACHE", """
    SELECT cache_size FROM pg_sequences WHERE schemaname = 'redelivery' AND sequencename = 'message_ids'""")
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
#: Every table of the DLQ schema, listed or not in ``dead_letter_queues`` (tests and benchmarks empty
#: the store by dropping them).
DLQ_TABLES = _named("DLQ_TABLES", "SELECT tablename FROM pg_tables WHERE schemaname = 'redelivery_dlq'")
#: No DLQ table made meanwhile (``CREATE_DLQ_TABLE`` locks ``dlq_messages``, of which it makes a
#: partition): emptying the store drops every one it lists.
LOCK_DLQ_MESSAGES = _named("LOCK_DLQ_MESSAGES", "LOCK TABLE dlq_messages IN ACCESS EXCLUSIVE MODE")
#: Every table of the log's schema (tests and benchmarks empty the store by dropping them).
LOG_TABLES = _named("LOG_TABLES", "SELECT tablename FROM pg_tables WHERE schemaname = 'redelivery_log'")
DROP_DLQ_TABLE = sql.SQL("/* redelivery:DROP_DLQ_TABLE */ DROP TABLE IF EXISTS {table}")
TRUNCATE_TABLES = sql.SQL("/* redelivery:TRUNCATE_TABLES */ TRUNCATE {tables} RESTART IDENTITY CASCADE")
#: Transaction-scoped advisory locks: (namespace, key).
ADVISORY_XACT_LOCK = _named("ADVISORY_XACT_LOCK", "SELECT pg_advisory_xact_lock(%(namespace)s, %(key)s)")
#: Session-scoped ones, for work that cannot run inside a transaction (a concurrent detach).
ADVISORY_LOCK = _named("ADVISORY_LOCK", "SELECT pg_advisory_lock(%(namespace)s, %(key)s)")
ADVISORY_UNLOCK = _named("ADVISORY_UNLOCK", "SELECT pg_advisory_unlock(%(namespace)s, %(key)s)")
#: The session's statement_timeout and lock_timeout, and setting them (work that must not be cut off
#: halfway: a concurrent detach).
SESSION_TIMEOUTS = _named("SESSION_TIMEOUTS", """
    SELECT current_setting('statement_timeout'), current_setting('lock_timeout')""")
SET_SESSION_TIMEOUTS = _named("SET_SESSION_TIMEOUTS", """
    SELECT set_config('statement_timeout', %(statement_timeout)s, false),
           set_config('lock_timeout', %(lock_timeout)s, false)""")
# fmt: on
