"""Retention (the log's partitions, bounded deletes of old records) and the asset watchers'
watermarks."""

from __future__ import annotations

from psycopg import sql

from redelivery.store.statements._shared import _named

# The statements keep the layout of SQL, not of Python.
# fmt: off

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

#: Dead letters older than ``retention.dead_letters`` (by dead-lettering time), at most ``limit``;
#: each subscription counts the ones it lost (``dead_letters_expired``: its COMMITTED count stays).
CLEANUP_DEAD_LETTERS = _named("CLEANUP_DEAD_LETTERS", """
    WITH expired AS (
      DELETE FROM dlq_messages q USING (
        SELECT dlq_id, group_id, message_id FROM dlq_messages
        WHERE dead_lettered_at < now() - make_interval(secs => %(seconds)s::float8) LIMIT %(limit)s) o
      WHERE q.dlq_id = o.dlq_id AND q.group_id = o.group_id AND q.message_id = o.message_id
      RETURNING q.topic_id, q.group_id),
    counted AS (
      UPDATE subscriptions s SET dead_letters_expired = s.dead_letters_expired + e.n
      FROM (SELECT topic_id, group_id, count(*) AS n FROM expired GROUP BY 1, 2) e
      WHERE s.topic_id = e.topic_id AND s.group_id = e.group_id)
    SELECT count(*) FROM expired""")

# ---- the log's partitions -------------------------------------------------------------------------
# ``redelivery.store.log``: range partitions of ``messages`` on publish time, in schema
# redelivery_log, each listed in log_partitions by the transaction that attaches or drops it.

#: The partition holding time ``at``: (name, starts_at, ends_at), or nothing.
LOG_PARTITION_AT = _named("LOG_PARTITION_AT", """
    SELECT partition_name, starts_at, ends_at FROM log_partitions
    WHERE coalesce(starts_at, '-infinity') <= %(at)s::timestamptz AND ends_at > %(at)s::timestamptz""")
#: Where the partitions before and after ``at`` end and start (NULL: none), so that a new partition
#: for ``at`` fills the gap between them.
LOG_PARTITION_NEIGHBOURS = _named("LOG_PARTITION_NEIGHBOURS", """
    SELECT (SELECT max(ends_at) FROM log_partitions WHERE ends_at <= %(at)s::timestamptz),
           (SELECT min(starts_at) FROM log_partitions WHERE starts_at > %(at)s::timestamptz)""")
#: A new partition's table, made apart from the log and then attached (ATTACH_LOG_PARTITION), which
#: takes the log only in SHARE UPDATE EXCLUSIVE mode: publishers and consumers go on meanwhile.
CREATE_LOG_PARTITION = sql.SQL(
    "/* redelivery:CREATE_LOG_PARTITION */ "
    "CREATE TABLE {partition} (LIKE redelivery.messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
ATTACH_LOG_PARTITION = sql.SQL(
    "/* redelivery:ATTACH_LOG_PARTITION */ "
    "ALTER TABLE redelivery.messages ATTACH PARTITION {partition}"
    " FOR VALUES FROM ({starts_at}) TO ({ends_at})")
REGISTER_LOG_PARTITION = _named("REGISTER_LOG_PARTITION", """
    INSERT INTO log_partitions (partition_name, starts_at, ends_at)
    VALUES (%(partition_name)s, %(starts_at)s, %(ends_at)s)""")
#: Every partition, oldest first: (name, starts_at, ends_at, attached, detach pending).
LOG_PARTITIONS = _named("LOG_PARTITIONS", """
    SELECT l.partition_name, l.starts_at, l.ends_at, i.inhrelid IS NOT NULL AND NOT i.inhdetachpending,
           coalesce(i.inhdetachpending, false)
    FROM log_partitions l
    LEFT JOIN pg_class c ON c.relname = l.partition_name
        AND c.relnamespace = 'redelivery_log'::regnamespace
    LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = 'redelivery.messages'::regclass
    ORDER BY l.starts_at NULLS FIRST""")
#: The subscriptions that still need a partition's messages: (topic, group) of each whose consume
#: offset is below one of its topic's messages there, or that has a delivery row of a message
#: there. Reads the partition's table itself, so it holds before and after a detach.
PARTITION_HOLDERS = sql.SQL("""/* redelivery:PARTITION_HOLDERS */
    SELECT t.name, g.name FROM (
      SELECT s.topic_id, s.group_id FROM subscriptions s
      WHERE EXISTS (SELECT 1 FROM {partition} m WHERE m.topic_id = s.topic_id AND m.id > s.consume_offset)
      UNION
      SELECT DISTINCT d.topic_id, d.group_id FROM deliveries d
      WHERE d.published_at >= {starts_at} AND d.published_at < {ends_at}) h
    JOIN topics t ON t.id = h.topic_id JOIN consumer_groups g ON g.id = h.group_id
    ORDER BY 1, 2""")
#: Detaching waits for every transaction that may read the partition, without blocking the log
#: (two transactions: it cannot run inside one). A detach cut off halfway is finished by FINALIZE.
DETACH_LOG_PARTITION = sql.SQL(
    "/* redelivery:DETACH_LOG_PARTITION */ "
    "ALTER TABLE redelivery.messages DETACH PARTITION {partition} CONCURRENTLY")
FINALIZE_LOG_PARTITION_DETACH = sql.SQL(
    "/* redelivery:FINALIZE_LOG_PARTITION_DETACH */ "
    "ALTER TABLE redelivery.messages DETACH PARTITION {partition} FINALIZE")
DROP_LOG_PARTITION = sql.SQL("/* redelivery:DROP_LOG_PARTITION */ DROP TABLE IF EXISTS {partition}")
FORGET_LOG_PARTITION = _named("FORGET_LOG_PARTITION", """
    DELETE FROM log_partitions WHERE partition_name = %(partition_name)s""")

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
#: How many messages (topic, group) can receive that became ready in [watermark, horizon)
#: (watermark NULL: from the beginning): its READY rows by ready_at, and the messages past its
#: consume offset by publish time.
READY_SINCE = _named("READY_SINCE", """
    WITH s AS (
      SELECT s.topic_id, s.group_id, s.consume_offset FROM subscriptions s
      WHERE s.group_id = (SELECT id FROM consumer_groups WHERE name = %(group)s)
        AND s.topic_id = (SELECT id FROM topics WHERE name = %(topic)s))
    SELECT (SELECT count(*) FROM deliveries d JOIN s ON d.topic_id = s.topic_id AND d.group_id = s.group_id
            WHERE d.state = 'READY' AND d.ready_at >= coalesce(%(watermark)s::timestamptz, '-infinity')
              AND d.ready_at < %(horizon)s)
         + (SELECT count(*) FROM messages m JOIN s ON m.topic_id = s.topic_id
            WHERE m.id > s.consume_offset
              AND m.published_at >= coalesce(%(watermark)s::timestamptz, '-infinity')
              AND m.published_at < %(horizon)s)""")
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
# fmt: on
