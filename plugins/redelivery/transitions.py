"""The set-based state changes of the state machine (RocketMQ 5 PushConsumer, seeds/001).

Every change is one SQL statement over many rows, guarded by the state it expects
(``WHERE state = 'WAITING_RETRY' AND due_at <= window end`` ...). A transition that was already
made, by an earlier run of the same window or by a run overlapping this one, matches no row: row
locks plus PostgreSQL's re-check of the ``WHERE`` clause after a lock wait make every message move
at most once. Payloads never leave PostgreSQL: a dead letter is copied from ``messages`` to its
group's DLQ table inside the database.

A tier window is applied in message-id ranges (``plan_ranges``), each range in one transaction
(``apply_window_range``): that is what the Spark job runs in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg import sql

from .errors import InvalidNameError, UnknownGroupError

DLQ_TABLE_LOCK = 7_424_002  # advisory lock namespace for creating a group's DLQ table
LEASE_EXPIRED_ERROR = "lease expired: no ack or nack within the invisible duration"
LATENESS_BUCKET_MS = 100

# Copies the rows a CTE called "moved" returns into dlq_messages; "moved" must return
# message_id, group_id, topic_id, delivery_count, reconsume_times, first_failure_at,
# last_failure_at, last_error, reason. The statement returns (group_id, reason, count).
_DLQ_INSERT = """
, inserted AS (
    INSERT INTO dlq_messages (group_id, message_id, topic_id, origin_message_id, key, body, content_type,
                              properties, published_at, reason, last_error, delivery_count, reconsume_times,
                              first_failure_at, last_failure_at, dead_lettered_at)
    SELECT mv.group_id, mv.message_id, mv.topic_id, coalesce(m.origin_message_id, m.id), m.key, m.body,
           m.content_type, m.properties, m.published_at, mv.reason::dlq_reason, mv.last_error,
           mv.delivery_count, mv.reconsume_times, mv.first_failure_at, mv.last_failure_at,
           coalesce(%(dead_lettered_at)s::timestamptz, now())
    FROM moved mv JOIN messages m ON m.id = mv.message_id
    RETURNING group_id, reason
)
SELECT group_id, reason::text, count(*) FROM inserted GROUP BY 1, 2
"""

_RETURNING_MOVED = """
    RETURNING d.message_id, d.group_id, d.topic_id, d.delivery_count, d.reconsume_times,
              d.first_failure_at, d.last_failure_at, d.last_error"""


def dlq_table_name(group_name: str) -> str:
    """The DLQ table of a group: ``dlq_<group>`` (a partition of ``dlq_messages``).

    Raises ``InvalidNameError`` if the name could not be a safe identifier (it is also quoted)."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,58}", group_name):
        raise InvalidNameError(f"group name {group_name!r} cannot name a DLQ table")
    return f"dlq_{group_name}"


def ensure_dlq_tables(conn: psycopg.Connection, group_ids: set[int]) -> list[str]:
    """Create the DLQ table (partition) of each group that has none yet; return the tables made.

    Each creation is its own short transaction under an advisory lock, so concurrent callers make
    a table once. Call it outside the transaction that dead-letters."""
    created = []
    for group_id in sorted(group_ids):
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (DLQ_TABLE_LOCK, group_id))
            if conn.execute("SELECT 1 FROM dlq_tables WHERE group_id = %s", (group_id,)).fetchone():
                continue
            row = conn.execute("SELECT name FROM consumer_groups WHERE id = %s", (group_id,)).fetchone()
            if row is None:
                raise UnknownGroupError(f"no consumer group with id {group_id}")
            table = dlq_table_name(row[0])
            conn.execute(
                sql.SQL("CREATE TABLE {} PARTITION OF dlq_messages FOR VALUES IN ({})").format(
                    sql.Identifier(table), sql.Literal(group_id)
                )
            )
            conn.execute("INSERT INTO dlq_tables (group_id, table_name) VALUES (%s, %s)", (group_id, table))
            created.append(table)
    return created


def groups_without_dlq_table(conn: psycopg.Connection) -> set[int]:
    rows = conn.execute(
        "SELECT id FROM consumer_groups g WHERE NOT EXISTS (SELECT 1 FROM dlq_tables t WHERE t.group_id = g.id)"
    ).fetchall()
    return {r[0] for r in rows}


# --------------------------------------------------------------------------------------------
# Tier window


@dataclass
class WindowResult:
    """What one range (or a whole window, once merged) moved.

    ``promoted``: {(group_id, level): n}; ``retried``: {group_id: n} leases expired into a retry;
    ``dead_lettered``: {(group_id, reason): n}; ``lateness``: {bucket: [n, max_seconds]} where a
    bucket is ``LATENESS_BUCKET_MS`` wide and lateness = window end - due time."""

    promoted: dict = field(default_factory=dict)
    retried: dict = field(default_factory=dict)
    dead_lettered: dict = field(default_factory=dict)
    lateness: dict = field(default_factory=dict)

    def merge(self, other: "WindowResult") -> "WindowResult":
        for mine, theirs in ((self.promoted, other.promoted), (self.retried, other.retried),
                             (self.dead_lettered, other.dead_lettered)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        for bucket, (n, top) in other.lateness.items():
            count, best = self.lateness.get(bucket, (0, 0.0))
            self.lateness[bucket] = (count + n, max(best, top))
        return self


_CANDIDATES = """
    (d.state = 'WAITING_RETRY' AND d.delay_level = ANY(%(levels)s::smallint[]) AND d.due_at <= %(window_end)s)
    OR (d.state = 'INFLIGHT' AND d.invisible_until <= %(window_end)s)
"""


def plan_ranges(conn: psycopg.Connection, levels: list[int], window_end: datetime, partitions: int) -> list[tuple[int, int]]:
    """Split the window's candidates into at most ``partitions`` message-id ranges ``[lo, hi)`` of
    about equal size (quantiles of the candidate ids). Empty list when nothing is due."""
    fractions = [i / partitions for i in range(1, partitions)]
    row = conn.execute(
        f"""SELECT min(message_id), max(message_id),
                   percentile_disc(%(fractions)s::float8[]) WITHIN GROUP (ORDER BY message_id)
            FROM deliveries d WHERE {_CANDIDATES}""",
        {"levels": levels, "window_end": window_end, "fractions": fractions},
    ).fetchone()
    low, high, cuts = row
    if low is None:
        return []
    bounds = sorted({low, *(cuts or []), high + 1})
    return list(zip(bounds[:-1], bounds[1:]))


def dlq_groups_needed(conn: psycopg.Connection, levels: list[int], window_end: datetime) -> set[int]:
    """Groups without a DLQ table that this window would dead-letter into (usually none)."""
    missing = groups_without_dlq_table(conn)
    if not missing:
        return set()
    rows = conn.execute(
        """SELECT DISTINCT d.group_id FROM deliveries d JOIN consumer_groups g ON g.id = d.group_id
           WHERE d.group_id = ANY(%(missing)s) AND g.max_reconsume_times <> -1 AND (
                 (d.state = 'INFLIGHT' AND d.invisible_until <= %(window_end)s
                  AND d.reconsume_times >= g.max_reconsume_times)
              OR (d.state = 'WAITING_RETRY' AND d.delay_level = ANY(%(levels)s::smallint[])
                  AND d.due_at <= %(window_end)s AND d.reconsume_times > g.max_reconsume_times))""",
        {"missing": list(missing), "levels": levels, "window_end": window_end},
    ).fetchall()
    return {r[0] for r in rows}


def apply_window_range(
    conn: psycopg.Connection,
    *,
    levels: list[int],
    delays: list[int],
    window_end: datetime,
    low: int,
    high: int,
    dry_run: bool = False,
) -> WindowResult:
    """Apply a tier window to message ids in ``[low, high)`` in one transaction.

    1. INFLIGHT messages whose lease (invisible_until) ended by ``window_end`` count as a failed
       delivery: back to WAITING_RETRY at the next level (due = lease end + that level's delay),
       or to the DLQ (reason LEASE_EXPIRED) when their reconsume times are used up.
    2. WAITING_RETRY messages at one of ``levels`` due by ``window_end`` go to READY, or to the
       DLQ (MAX_DELIVERIES_EXCEEDED) if the group's max reconsume times was lowered below theirs.

    ``delays`` is the level table in seconds (level i waits ``delays[i-1]``). With ``dry_run``
    the transaction is rolled back and the result says what would have moved."""
    params = {
        "levels": levels, "delays": delays, "top": len(delays), "window_end": window_end,
        "low": low, "high": high, "dead_lettered_at": window_end, "lease_error": LEASE_EXPIRED_ERROR, "bucket_ms": LATENESS_BUCKET_MS,
    }
    in_range = "d.message_id >= %(low)s AND d.message_id < %(high)s AND g.id = d.group_id"
    can_retry = "(g.max_reconsume_times = -1 OR d.reconsume_times < g.max_reconsume_times)"
    result = WindowResult()
    with conn.transaction(force_rollback=dry_run):
        for group_id, n in conn.execute(
            f"""WITH retried AS (
                  UPDATE deliveries d SET state = 'WAITING_RETRY',
                      reconsume_times = d.reconsume_times + 1,
                      delay_level = least(d.reconsume_times + 1, %(top)s),
                      due_at = d.invisible_until + make_interval(
                          secs => (%(delays)s::int[])[least(d.reconsume_times + 1, %(top)s)]),
                      last_error = %(lease_error)s, last_failure_at = d.invisible_until,
                      first_failure_at = coalesce(d.first_failure_at, d.invisible_until),
                      invisible_until = NULL, updated_at = now()
                  FROM consumer_groups g
                  WHERE {in_range} AND d.state = 'INFLIGHT' AND d.invisible_until <= %(window_end)s AND {can_retry}
                  RETURNING d.group_id)
                SELECT group_id, count(*) FROM retried GROUP BY 1""",
            params,
        ):
            result.retried[group_id] = n
        for group_id, reason, n in conn.execute(
            f"""WITH moved AS (
                  UPDATE deliveries d SET state = 'DLQ', last_error = %(lease_error)s,
                      last_failure_at = d.invisible_until,
                      first_failure_at = coalesce(d.first_failure_at, d.invisible_until),
                      invisible_until = NULL, due_at = NULL, updated_at = now()
                  FROM consumer_groups g
                  WHERE {in_range} AND d.state = 'INFLIGHT' AND d.invisible_until <= %(window_end)s
                    AND NOT {can_retry}
                  {_RETURNING_MOVED}, 'LEASE_EXPIRED' AS reason)
                {_DLQ_INSERT}""",
            params,
        ):
            result.dead_lettered[(group_id, reason)] = n
        for group_id, level, bucket, n, top in conn.execute(
            f"""WITH promoted AS (
                  UPDATE deliveries d SET state = 'READY', updated_at = now()
                  FROM consumer_groups g
                  WHERE {in_range} AND d.state = 'WAITING_RETRY' AND d.delay_level = ANY(%(levels)s::smallint[])
                    AND d.due_at <= %(window_end)s
                    AND (g.max_reconsume_times = -1 OR d.reconsume_times <= g.max_reconsume_times)
                  RETURNING d.group_id, d.delay_level,
                            extract(epoch FROM %(window_end)s - d.due_at)::float8 AS lateness)
                SELECT group_id, delay_level, floor(lateness * 1000 / %(bucket_ms)s)::int, count(*), max(lateness)
                FROM promoted GROUP BY 1, 2, 3""",
            params,
        ):
            result.promoted[(group_id, level)] = result.promoted.get((group_id, level), 0) + n
            count, best = result.lateness.get(bucket, (0, 0.0))
            result.lateness[bucket] = (count + n, max(best, top))
        for group_id, reason, n in conn.execute(
            f"""WITH moved AS (
                  UPDATE deliveries d SET state = 'DLQ', due_at = NULL, updated_at = now()
                  FROM consumer_groups g
                  WHERE {in_range} AND d.state = 'WAITING_RETRY' AND d.delay_level = ANY(%(levels)s::smallint[])
                    AND d.due_at <= %(window_end)s AND g.max_reconsume_times <> -1
                    AND d.reconsume_times > g.max_reconsume_times
                  {_RETURNING_MOVED}, 'MAX_DELIVERIES_EXCEEDED' AS reason)
                {_DLQ_INSERT}""",
            params,
        ):
            key = (group_id, reason)
            result.dead_lettered[key] = result.dead_lettered.get(key, 0) + n
    return result


def lateness_percentiles(lateness: dict) -> dict:
    """p50, p99 and max lateness in seconds from the bucketed histogram (p50/p99 are bucket upper
    bounds, so at most ``LATENESS_BUCKET_MS`` high; max is exact). Empty histogram: all None."""
    total = sum(n for n, _ in lateness.values())
    if total == 0:
        return {"p50": None, "p99": None, "max": None}
    out = {"max": round(max(top for _, top in lateness.values()), 3)}
    for name, q in (("p50", 0.50), ("p99", 0.99)):
        target, seen = q * total, 0
        for bucket in sorted(lateness):
            seen += lateness[bucket][0]
            if seen >= target:
                out[name] = round(min((bucket + 1) * LATENESS_BUCKET_MS / 1000, out["max"]), 3)
                break
    return {"p50": out["p50"], "p99": out["p99"], "max": out["max"]}
