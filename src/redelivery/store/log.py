"""The log's partitions: made ahead of need, dropped when retention allows.

``messages`` is partitioned by range of publish time (``retention.partition`` long, aligned on the
epoch), each partition a table of schema ``redelivery_log`` listed in ``log_partitions`` by the
transaction that attaches it or drops it. A partition is made as a table apart and then attached,
which takes the log in SHARE UPDATE EXCLUSIVE mode only: publishers and consumers go on. Retention
(RocketMQ's ``fileReservedTime``, Kafka's ``retention.ms``) drops a whole partition once it ended
more than ``retention.messages`` ago and no subscription still needs any of its messages; a
subscription that does holds it (``partition_holders``), and the metrics say which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import sql

from redelivery.store import statements as S

LOG_SCHEMA = "redelivery_log"
PARTITION_LOCK = 7_424_004  # advisory lock namespace: making or dropping a partition of the log
#: The advisory lock of a retention run (session-scoped, exclusive); a subscription from the
#: beginning takes it shared for its transaction (``statements.SUBSCRIBE``).
RETENTION_LOCK = {"namespace": PARTITION_LOCK, "key": 1}
#: Advisory lock namespace of each partition's retirement (keyed by the hash of its name): writers of
#: new messages hold it shared, a retention run exclusively (``statements.LOCK_LOG_PARTITION_FOR_*``).
RETIRE_LOCK = 7_424_005
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def span_of(at: datetime, span_seconds: int) -> tuple[datetime, datetime]:
    """``[start, end)`` of the partition span (``span_seconds`` long, aligned on the epoch, UTC)
    holding ``at`` (timezone-aware)."""
    offset = (at - _EPOCH) // timedelta(seconds=span_seconds)
    start = _EPOCH + offset * timedelta(seconds=span_seconds)
    return start, start + timedelta(seconds=span_seconds)


def partition_name(starts_at: datetime) -> str:
    """The table name of the partition that starts at ``starts_at``: ``messages_YYYYMMDDtHHMMSS``
    (UTC)."""
    return "messages_" + starts_at.astimezone(UTC).strftime("%Y%m%dt%H%M%S")


def _table(name: str) -> sql.Composable:
    return sql.Identifier(LOG_SCHEMA, name)


def ensure_partition(conn: psycopg.Connection, at: datetime, span_seconds: int) -> str | None:
    """Make the partition holding publish time ``at`` if there is none; return its name, or None
    when one existed. Its span is ``span_seconds`` aligned on the epoch, cut where a neighbouring
    partition (made with another span) already is. One short transaction of its own under an
    advisory lock (concurrent callers make it once); ``conn`` must not be inside a transaction.
    Nothing stops the log meanwhile: the table is made apart and attached (SHARE UPDATE EXCLUSIVE)."""
    with conn.transaction():
        conn.execute(S.ADVISORY_XACT_LOCK, {"namespace": PARTITION_LOCK, "key": 0})
        if conn.execute(S.LOG_PARTITION_AT, {"at": at}).fetchone() is not None:
            return None
        starts_at, ends_at = span_of(at, span_seconds)
        before, after = conn.execute(S.LOG_PARTITION_NEIGHBOURS, {"at": at}).fetchone()
        starts_at = max(starts_at, before) if before is not None else starts_at
        ends_at = min(ends_at, after) if after is not None else ends_at
        name = partition_name(starts_at)
        conn.execute(S.CREATE_LOG_PARTITION.format(partition=_table(name)))
        conn.execute(
            S.ATTACH_LOG_PARTITION.format(
                partition=_table(name), starts_at=sql.Literal(starts_at), ends_at=sql.Literal(ends_at)
            )
        )
        conn.execute(
            S.REGISTER_LOG_PARTITION, {"partition_name": name, "starts_at": starts_at, "ends_at": ends_at}
        )
    return name


def ensure_partitions_ahead(conn: psycopg.Connection, span_seconds: int, at: datetime | None = None) -> list:
    """The partitions of the current span and the next one (the maintenance job makes them before
    any publish needs them); returns the names made."""
    now = at or conn.execute(S.DB_NOW).fetchone()[0]
    made = [
        ensure_partition(conn, when, span_seconds) for when in (now, now + timedelta(seconds=span_seconds))
    ]
    return [name for name in made if name]


class PartitionChanged(Exception):
    """The log's partition of a publish time changed while a publisher waited for its retirement
    lock (retention dropped it): the publishing transaction rolls back and runs again."""


def lock_partition_for_publish(conn: psycopg.Connection, at: datetime | None) -> tuple[datetime, str | None]:
    """Inside a publishing transaction, before any message is written: (publish time, name of the
    log's partition that holds it, or None when there is none yet). The partition's retirement lock
    is held shared until the transaction ends, so retention never looks at a partition while an
    uncommitted publish writes into it, nor detaches it under one (issue 27: a message committed
    into a partition being detached was hidden from the receive that moved the offset past it, and
    dropped). Waits while a retention run retires that partition; raises ``PartitionChanged`` when
    it was dropped meanwhile (roll back, then publish again: a partition is made for the time)."""
    lock = conn.execute(S.LOCK_LOG_PARTITION_FOR_PUBLISH, {"at": at, "namespace": RETIRE_LOCK})
    publish_time = conn.execute(S.PUBLISH_TIME, {"at": at})  # after the wait; in a pipeline, with it
    locked, (published_at, partition) = lock.fetchone(), publish_time.fetchone()
    if partition != (locked[0] if locked else None):
        raise PartitionChanged(f"the log's partition of {published_at.isoformat()} changed; publish again")
    return published_at, partition


@dataclass(frozen=True)
class Partition:
    """One partition of the log: its table's name, its ``[starts_at, ends_at)`` of publish times
    (``starts_at`` None: from the beginning of time, the partition migration 0012 made), whether
    it is attached to the log, and whether a detach of it was cut off halfway."""

    name: str
    starts_at: datetime | None
    ends_at: datetime
    attached: bool
    detach_pending: bool

    def bounds(self) -> dict[str, sql.Composable]:
        """Its bounds as SQL literals (``MINVALUE`` / '-infinity' for a partition from the
        beginning)."""
        if self.starts_at is None:
            return {"starts_at": sql.SQL("MINVALUE"), "ends_at": sql.Literal(self.ends_at)}
        return {"starts_at": sql.Literal(self.starts_at), "ends_at": sql.Literal(self.ends_at)}


def partitions(conn: psycopg.Connection) -> list[Partition]:
    """Every partition of the log, oldest first."""
    return [Partition(*row) for row in conn.execute(S.LOG_PARTITIONS)]


def partition_holders(conn: psycopg.Connection, partition: Partition) -> list[tuple[str, str]]:
    """(topic, group) of each subscription that still needs a message of ``partition``: its consume
    offset is below one of its topic's messages there, or it has a delivery row of one of them.
    Read from the partition's own table: true before and after a detach."""
    starts_at = sql.SQL("'-infinity'") if partition.starts_at is None else sql.Literal(partition.starts_at)
    statement = S.PARTITION_HOLDERS.format(
        partition=_table(partition.name), starts_at=starts_at, ends_at=sql.Literal(partition.ends_at)
    )
    return [(topic, group) for topic, group in conn.execute(statement)]


@dataclass
class RetentionResult:
    """What a retention run did: ``dropped`` partitions (names), ``held`` {(topic, group): the
    partitions past retention it keeps}, ``reattached`` partitions a writer needed again while
    they were being detached."""

    dropped: list[str] = field(default_factory=list)
    held: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    reattached: list[str] = field(default_factory=list)


def expired(conn: psycopg.Connection, retention_seconds: int, at: datetime | None = None) -> list[Partition]:
    """The partitions that ended more than ``retention_seconds`` before ``at`` (default: the
    database clock), oldest first."""
    now = at or conn.execute(S.DB_NOW).fetchone()[0]
    return [p for p in partitions(conn) if p.ends_at <= now - timedelta(seconds=retention_seconds)]


def drop_expired_partitions(
    conn: psycopg.Connection, retention_seconds: int, at: datetime | None = None
) -> RetentionResult:
    """Drop every partition past retention that no subscription needs (``conn`` in autocommit,
    outside a transaction: a concurrent detach cannot run inside one).

    For each, under its retirement lock (exclusive; every publisher into it holds it shared, so
    the publishes writing into it have committed before the first check sees the partition, and no
    new one writes into it until it is dropped or attached again): check its holders; detach it
    CONCURRENTLY (waiting for every transaction that may still read it, while the log goes on);
    check again on its own table, now that no new reader can find it, so that a writer that needed
    it meanwhile (a redrive reviving one of its dead letters, a subscription from the beginning) is
    seen; then drop it and forget it in one transaction, or
    attach it again. A detach cut off halfway is finished first (FINALIZE), and a partition left
    detached by a run cut off before its drop is checked and dropped or attached again the same
    way: nothing unfinished is ever dropped. Retention runs take turns with each other and with a
    subscription from the beginning (``RETENTION_LOCK``, a session advisory lock: the backend of a
    run whose client died holds it until its detach is done), so each reads the partitions' state
    after the one before it finished. The session waits as long as the detach must (no
    ``statement_timeout`` or ``lock_timeout`` of the user's cancels it halfway: PostgreSQL keeps
    one partition at most pending detach, and a cancelled one would stop every later detach)."""
    conn.execute(S.ADVISORY_LOCK, RETENTION_LOCK)
    saved = conn.execute(S.SESSION_TIMEOUTS).fetchone()
    conn.execute(S.SET_SESSION_TIMEOUTS, {"statement_timeout": "0", "lock_timeout": "0"})
    try:
        for pending in [p for p in partitions(conn) if p.detach_pending]:  # before any new detach
            conn.execute(S.FINALIZE_LOG_PARTITION_DETACH.format(partition=_table(pending.name)))
        return _drop_expired(conn, retention_seconds, at)
    finally:
        conn.execute(S.SET_SESSION_TIMEOUTS, {"statement_timeout": saved[0], "lock_timeout": saved[1]})
        conn.execute(S.ADVISORY_UNLOCK, RETENTION_LOCK)


def _drop_expired(conn: psycopg.Connection, retention_seconds: int, at: datetime | None) -> RetentionResult:
    result = RetentionResult()
    for partition in expired(conn, retention_seconds, at):  # none pending detach: finished before
        lock = {"namespace": RETIRE_LOCK, "partition_name": partition.name}
        conn.execute(S.LOCK_LOG_PARTITION_FOR_RETENTION, lock)  # its publishers committed, new ones wait
        try:
            _retire(conn, partition, result)
        finally:
            conn.execute(S.UNLOCK_LOG_PARTITION_FOR_RETENTION, lock)
    return result


def _retire(conn: psycopg.Connection, partition: Partition, result: RetentionResult) -> None:
    """Drop one partition past retention unless a subscription holds it (see
    ``drop_expired_partitions``), under its retirement lock: no message is being written into it."""
    table = _table(partition.name)
    if partition.attached:
        held = partition_holders(conn, partition)
        if held:
            for holder in held:
                result.held.setdefault(holder, []).append(partition.name)
            return
        conn.execute(S.DETACH_LOG_PARTITION.format(partition=table))
    # detached: no reader can find it any more; a redrive that wrote into it meanwhile left a
    # delivery row, which holds it
    held = partition_holders(conn, partition)
    if held:
        conn.execute(S.ATTACH_LOG_PARTITION.format(partition=table, **partition.bounds()))
        result.reattached.append(partition.name)
        for holder in held:
            result.held.setdefault(holder, []).append(partition.name)
        return
    with conn.transaction():
        conn.execute(S.DROP_LOG_PARTITION.format(partition=table))
        conn.execute(S.FORGET_LOG_PARTITION, {"partition_name": partition.name})
    result.dropped.append(partition.name)
