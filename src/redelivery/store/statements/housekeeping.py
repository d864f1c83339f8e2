"""Retention (bounded deletes of old records) and the asset watchers' watermarks."""

from __future__ import annotations

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
# fmt: on
