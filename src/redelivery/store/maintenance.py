"""Retention: delete the records that would otherwise grow forever (publish batch ids, staged rows
of publishes that never finished, tier runs, settle markers, redrive runs with their audit), each
older than its ``retention`` setting, a bounded number of rows per statement."""

from __future__ import annotations

import psycopg

from redelivery.config import RedeliveryConfig
from redelivery.store import statements as S

#: (record kind, statement, retention setting)
CLEANUPS = (
    ("publish_batches", S.CLEANUP_PUBLISH_BATCHES, "publish_batches"),
    ("publish_parts", S.CLEANUP_PUBLISH_PARTS, "publish_staging"),
    ("publish_staging", S.CLEANUP_PUBLISH_STAGING, "publish_staging"),
    ("tier_runs", S.CLEANUP_TIER_RUNS, "tier_runs"),
    ("settle_parts", S.CLEANUP_SETTLE_PARTS, "settle_markers"),
    ("redrive_runs", S.CLEANUP_REDRIVE_RUNS, "redrive_runs"),
)


def cleanup(conn: psycopg.Connection, config: RedeliveryConfig, limit: int = 10_000) -> dict[str, int]:
    """Delete every record older than its retention; return ``{kind: rows deleted}``. Each
    statement deletes at most ``limit`` rows in its own transaction (``conn`` in autocommit), so a
    long backlog never holds locks for long."""
    deleted = {}
    for kind, statement, setting in CLEANUPS:
        params, total = {"seconds": config.retention.seconds(setting), "limit": limit}, 0
        while True:
            count = conn.execute(statement, params).rowcount
            total += count
            if count < limit:
                break
        deleted[kind] = total
    return deleted
