"""Retention: keep the log's partitions made ahead of need and drop those past
``retention.messages`` that no group needs (``redelivery.store.log``), and delete the records that
would otherwise grow forever (dead letters when ``retention.dead_letters`` is set, publish batch
ids, staged rows of publishes that never finished, tier runs, settle markers, redrive runs with
their audit, breaker transitions), each older than its ``retention`` setting, a bounded number of
rows per statement."""

from __future__ import annotations

from datetime import datetime

import psycopg

from redelivery.config import RedeliveryConfig
from redelivery.store import db, log
from redelivery.store import statements as S

#: (record kind, statement, retention setting)
CLEANUPS = (
    ("dead_letters", S.CLEANUP_DEAD_LETTERS, "dead_letters"),
    ("publish_batches", S.CLEANUP_PUBLISH_BATCHES, "publish_batches"),
    ("publish_parts", S.CLEANUP_PUBLISH_PARTS, "publish_staging"),
    ("publish_staging", S.CLEANUP_PUBLISH_STAGING, "publish_staging"),
    ("tier_runs", S.CLEANUP_TIER_RUNS, "tier_runs"),
    ("settle_parts", S.CLEANUP_SETTLE_PARTS, "settle_markers"),
    ("redrive_runs", S.CLEANUP_REDRIVE_RUNS, "redrive_runs"),
    ("breaker_transitions", S.CLEANUP_BREAKER_TRANSITIONS, "redrive_runs"),
)


def cleanup(
    conn: psycopg.Connection, config: RedeliveryConfig, limit: int = 10_000, at: datetime | None = None
) -> dict[str, int]:
    """Apply every retention; return ``{kind: count}``: the rows deleted of each record kind
    (``dead_letters`` only when ``retention.dead_letters`` is set), then ``log_partitions_made``
    (the current span's and the next one's, when missing), ``log_partitions_dropped`` (past
    ``retention.messages``, no group needing them; ``at`` replaces the database clock for that
    age), ``log_partitions_held`` (past it, kept for a group that still needs them: see
    ``redelivery.metrics``). ``conn`` in autocommit: each statement deletes at most ``limit`` rows
    in its own transaction (a deadlock victim runs again), so a long backlog never holds locks for
    long."""
    retention = config.retention
    done = {}
    for kind, statement, setting in CLEANUPS:  # first: a failing partition drop stops none of them
        seconds = retention.seconds(setting)
        if seconds is None:  # kept: retention.dead_letters unset
            continue
        params, total = {"seconds": seconds, "limit": limit}, 0
        while True:
            count = db.retry_lock_conflicts(lambda p=params, s=statement: _deleted(conn.execute(s, p)))
            total += count
            if count < limit:
                break
        done[kind] = total
    made = log.ensure_partitions_ahead(conn, retention.seconds("partition"), at)
    result = log.drop_expired_partitions(conn, retention.seconds("messages"), at)
    return {
        "log_partitions_made": len(made),
        "log_partitions_dropped": len(result.dropped),
        "log_partitions_held": len({name for names in result.held.values() for name in names}),
        **done,
    }


def _deleted(cursor: psycopg.Cursor) -> int:
    """Rows a cleanup statement deleted (a DELETE's row count, or the count it returns)."""
    return cursor.fetchone()[0] if cursor.description else cursor.rowcount


def empty_state_store(conn: psycopg.Connection) -> None:
    """Delete everything: every table of schema ``redelivery`` emptied (identities and message ids
    restarted), every DLQ table and every partition of the log dropped. For tests and benchmarks
    only; nothing in the product calls it.

    One transaction, after the locks under which partitions and DLQ tables are made and partitions
    retired: a maintenance or tier run making one meanwhile (a test's Airflow sharing the store)
    commits before the tables are listed, or waits and makes it after. A partition made between the
    drops and the truncation stayed as a table ``log_partitions`` no longer listed, refusing every
    later publish of its span (``DuplicateTable``)."""
    from psycopg import sql

    def empty() -> None:
        with conn.transaction():
            conn.execute(S.ADVISORY_XACT_LOCK, {"namespace": log.PARTITION_LOCK, "key": 0})
            conn.execute(S.ADVISORY_XACT_LOCK, log.RETENTION_LOCK)
            conn.execute(S.LOCK_DLQ_MESSAGES)
            for (name,) in conn.execute(S.DLQ_TABLES).fetchall():  # listed or not
                conn.execute(S.DROP_DLQ_TABLE.format(table=sql.Identifier("redelivery_dlq", name)))
            for (name,) in conn.execute(S.LOG_TABLES).fetchall():  # attached or not, recorded or not
                conn.execute(S.DROP_LOG_PARTITION.format(partition=sql.Identifier("redelivery_log", name)))
            tables = [sql.Identifier("redelivery", name) for (name,) in conn.execute(S.STATE_STORE_TABLES)]
            conn.execute(S.TRUNCATE_TABLES.format(tables=sql.SQL(", ").join(tables)))

    db.retry_lock_conflicts(empty)  # a deadlock with a maintenance run's deletes: nothing was emptied
