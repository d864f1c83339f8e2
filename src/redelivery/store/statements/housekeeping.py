"""Retention (the log's partitions, bounded deletes of old records) and the asset watchers'
watermarks."""

from __future__ import annotations

from psycopg import sql

from redelivery.store.statements._shared import AT, _named

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
#: A breaker's audit (its transitions), as long as redrive runs are kept.
CLEANUP_BREAKER_TRANSITIONS = _named("CLEANUP_BREAKER_TRANSITIONS", """
    DELETE FROM breaker_transitions WHERE id = ANY(ARRAY(
      SELECT id FROM breaker_transitions
      WHERE at < now() - make_interval(secs => %(seconds)s::float8) LIMIT %(limit)s))""")

#: Dead letters older than ``retention.dead_letters`` (by dead-lettering time), at most ``limit``;
#: each subscription counts the ones it lost (``dead_letters_expired``: its COMMITTED count stays).
CLEANUP_DEAD_LETTERS = _named("CLEANUP_DEAD_LETTERS", """
    WITH expired AS (
      DELETE FROM dlq_messages q USING (
        SELECT dlq_id, group_id, message_id FROM dlq_messages
        WHERE dead_lettered_at < now() - make_interval(secs => %(seconds)s::float8) LIMIT %(limit)s) o
      WHERE q.dlq_id = o.dlq_id AND q.group_id = o.group_id AND q.message_id = o.message_id
      RETURNING q.topic_id, q.group_id, q.message_id),
    -- the HALTED head of an ordered subscription's key goes with its dead letter: the key is
    -- released (finish_ordered_heads promotes its next message), or it would be held for ever
    released AS (
      DELETE FROM deliveries d
      WHERE d.state = 'HALTED' AND d.group_id = ANY(ARRAY(SELECT group_id FROM expired))
        AND d.message_id = ANY(ARRAY(SELECT message_id FROM expired))
        AND (d.group_id, d.message_id) = ANY(ARRAY(SELECT (e.group_id, e.message_id) FROM expired e))),
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
#: there (a HALTED one aside: its message is a dead letter, whose copy a redrive puts back). Reads
#: the partition's table itself, so it holds before and after a detach.
PARTITION_HOLDERS = sql.SQL("""/* redelivery:PARTITION_HOLDERS */
    SELECT t.name, g.name FROM (
      SELECT s.topic_id, s.group_id FROM subscriptions s
      WHERE EXISTS (SELECT 1 FROM {partition} m WHERE m.topic_id = s.topic_id AND m.id > s.consume_offset)
      UNION
      SELECT DISTINCT d.topic_id, d.group_id FROM deliveries d
      WHERE d.published_at >= {starts_at} AND d.published_at < {ends_at}
        AND d.state <> 'HALTED') h
    JOIN topics t ON t.id = h.topic_id JOIN consumer_groups g ON g.id = h.group_id
    ORDER BY 1, 2""")
#: A partition's retirement lock (advisory, namespace ``log.RETIRE_LOCK``, keyed by the partition's
#: name): every writer of new messages into a partition holds it shared for its transaction
#: (LOCK_LOG_PARTITION_FOR_PUBLISH), a retention run holds it exclusively from its first look at
#: the partition to its drop or attach (a session lock: a concurrent detach runs outside any
#: transaction). So retention sees every message committed into the partition before it looks, and
#: no message enters it while it is detached, hidden from the receives that move the offsets.
LOCK_LOG_PARTITION_FOR_RETENTION = _named("LOCK_LOG_PARTITION_FOR_RETENTION", """
    SELECT pg_advisory_lock(%(namespace)s, hashtext(%(partition_name)s))""")
UNLOCK_LOG_PARTITION_FOR_RETENTION = _named("UNLOCK_LOG_PARTITION_FOR_RETENTION", """
    SELECT pg_advisory_unlock(%(namespace)s, hashtext(%(partition_name)s))""")
#: A publisher's share of the retirement lock of the partition that holds publish time ``at`` (or
#: now), for its transaction; it waits while a retention run is retiring that partition. Returns the
#: partition's name (nothing: no partition holds that time).
LOCK_LOG_PARTITION_FOR_PUBLISH = _named("LOCK_LOG_PARTITION_FOR_PUBLISH", f"""
    SELECT l.partition_name, pg_advisory_xact_lock_shared(%(namespace)s, hashtext(l.partition_name))
    FROM log_partitions l
    WHERE coalesce(l.starts_at, '-infinity') <= {AT} AND l.ends_at > {AT}""")
#: A publisher's share of the retirement lock of the partition named ``partition_name`` (its guess
#: of the partition that holds the publish time), for its transaction, without reading the log's
#: partitions: the statement after it checks, in a snapshot after the wait, that the guess holds
#: (PUBLISH_SMALL_BATCH), and writes nothing otherwise.
LOCK_LOG_PARTITION_NAMED = _named("LOCK_LOG_PARTITION_NAMED", """
    SELECT pg_advisory_xact_lock_shared(%(namespace)s, hashtext(%(partition_name)s))""")
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
# ``airflow.triggers.ReadyMessagesTrigger``: what (topic, group) can receive that is new since an
# asset's watermarks: READY delivery rows by ready_at (a time watermark), new log messages by id.

#: The time watermark's horizon: the start of the oldest transaction open in this database (client
#: sessions but this one), or now; never more than ``settle`` seconds ago. A delivery's ready_at is
#: its transaction's start, so every delivery with an older ready_at is committed by then.
READY_HORIZON = _named("READY_HORIZON", """
    SELECT least(now(), greatest(coalesce(min(a.xact_start), now()),
                                 now() - make_interval(secs => %(settle)s::float8)))
    FROM pg_stat_activity a
    WHERE a.datname = current_database() AND a.backend_type = 'client backend'
      AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL""")
#: What (topic, group) can receive that is new: (READY rows with ready_at in [watermark, horizon)
#: (watermark NULL: from the beginning), messages of the log past its consume offset with ids past
#: ``id_watermark`` (NULL: every one past the offset), the highest id among those (NULL: none)).
#: The ids need no horizon: a topic's ids are taken under its publish lock, which a publisher
#: holds until its commit is visible, so a message this snapshot does not see commits later with
#: an id above every one it sees, past the new id watermark; a message's published_at cannot tell
#: (a publish's ``at``, a Spark publish's job start, or a long transaction's start).
READY_SINCE = _named("READY_SINCE", """
    WITH s AS (
      SELECT s.topic_id, s.group_id, s.consume_offset FROM subscriptions s
      WHERE s.group_id = (SELECT id FROM consumer_groups WHERE name = %(group)s)
        AND s.topic_id = (SELECT id FROM topics WHERE name = %(topic)s)),
    published AS (
      SELECT count(*) AS n, max(m.id) AS last_id FROM messages m JOIN s ON m.topic_id = s.topic_id
      WHERE m.id > greatest(s.consume_offset, %(id_watermark)s::bigint))
    SELECT (SELECT count(*) FROM deliveries d JOIN s ON d.topic_id = s.topic_id AND d.group_id = s.group_id
            WHERE d.state = 'READY' AND d.ready_at >= coalesce(%(watermark)s::timestamptz, '-infinity')
              AND d.ready_at < %(horizon)s),
           p.n, p.last_id
    FROM published p""")
#: An asset's watermarks: the claimed ones (events left the trigger up to them: a time, an id) and
#: the confirmed ones (Airflow stored the events up to them; NULL: none confirmed yet; the ids NULL
#: too for rows from before migration 0014).
ASSET_WATERMARK = _named("ASSET_WATERMARK", """
    SELECT watermark, confirmed, id_watermark, id_confirmed FROM asset_watermarks
    WHERE asset_uri = %(asset_uri)s""")
#: Claim an event: move an asset's watermarks from ``previous`` and ``previous_id`` (NULL: none
#: stored yet) forward to ``watermark`` and ``id_watermark`` (never back: a repeat from the
#: confirmed ones can end below them) and count the event; returns the claimed watermarks (time,
#: id), or nothing when the stored ones are no longer the previous ones (another copy of the
#: trigger fired first).
ADVANCE_ASSET_WATERMARK = _named("ADVANCE_ASSET_WATERMARK", """
    INSERT INTO asset_watermarks (asset_uri, watermark, id_watermark)
    VALUES (%(asset_uri)s, %(watermark)s, %(id_watermark)s)
    ON CONFLICT (asset_uri) DO UPDATE
        SET watermark = greatest(asset_watermarks.watermark, EXCLUDED.watermark),
            id_watermark = greatest(asset_watermarks.id_watermark, EXCLUDED.id_watermark),
            events = asset_watermarks.events + 1, fired_at = now()
        WHERE asset_watermarks.watermark IS NOT DISTINCT FROM %(previous)s::timestamptz
          AND asset_watermarks.id_watermark IS NOT DISTINCT FROM %(previous_id)s::bigint
    RETURNING watermark, id_watermark""")
#: Move an asset's confirmed watermarks forward to ``watermark`` and ``id_watermark`` (never back,
#: never past the claimed ones; ``id_watermark`` NULL leaves the confirmed id as it is): Airflow
#: stored the events before them (``ReadyMessagesProducer.advance``).
CONFIRM_ASSET_WATERMARK = _named("CONFIRM_ASSET_WATERMARK", """
    UPDATE asset_watermarks SET
        confirmed = CASE WHEN confirmed IS NULL OR confirmed < %(watermark)s::timestamptz
                         THEN least(watermark, %(watermark)s::timestamptz) ELSE confirmed END,
        -- (least and greatest skip NULLs: a NULL must not stand for "any")
        id_confirmed = CASE WHEN %(id_watermark)s::bigint IS NULL OR id_watermark IS NULL THEN id_confirmed
                            ELSE greatest(id_confirmed, least(id_watermark, %(id_watermark)s::bigint)) END
    WHERE asset_uri = %(asset_uri)s
      AND (confirmed IS NULL OR confirmed < %(watermark)s::timestamptz
           OR (%(id_watermark)s::bigint IS NOT NULL
               AND (id_confirmed IS NULL OR id_confirmed < %(id_watermark)s::bigint)))""")
# fmt: on
