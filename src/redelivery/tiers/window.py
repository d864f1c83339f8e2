"""The tier window: promote due retries, expire leases, dead-letter used-up messages, in bulk.

A window is applied in message-id ranges (``plan_ranges``), each range in one transaction
(``apply_window_range``): that is what the Spark job runs in parallel. Every change is one
statement of ``statements`` guarded by the state it expects, so a range applied twice, or by two
overlapping runs, moves each message at most once. Payloads never leave PostgreSQL: a dead letter
is copied from ``messages`` into its DLQ table inside the database.

Policies reach SQL as a small table, one row per subscription (``catalog.policy_table``): the
client's nacks and the tier job's lease expiries use the same expressions, so both follow the same
policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import psycopg

from redelivery.store import statements as S
from redelivery.store.catalog import (
    add_group_totals,
    lock_backlog,
    lock_breakers,
    missing_dlq_tables,
    ready_count,
)

LEASE_EXPIRED_ERROR = "lease expired: no ack or nack within the invisible duration"
LATENESS_BUCKET_MS = 100
#: Bucket upper bounds (seconds) of each tier's cumulative histograms (``redelivery.metrics``): the
#: lateness of promoted retries (tier windows are 10 s to 10 min long) and the duration of tier
#: runs. Changing them restarts those histograms (a counter reset to Prometheus).
LATENESS_BOUNDS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)
RUN_DURATION_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


@dataclass
class WindowResult:
    """What one range (or a whole window, once merged) moved.

    ``promoted``: {(group_id, level): n}; ``retried``: {group_id: n} leases expired into a retry;
    ``dead_lettered``: {(group_id, reason): n}; ``lateness``: {bucket: (n, max_seconds)} where a
    bucket is ``LATENESS_BUCKET_MS`` wide and lateness = window end - due time; ``held_back``:
    {group_id: n} due messages left waiting by a ready-backlog cap; ``promoted_by_topic``:
    {(group_id, topic_id): n}, the promotions per subscription (its asset events);
    ``lateness_counts``: {i: n} promotions per bucket of ``LATENESS_BOUNDS`` (i: the first bound at
    least the lateness; ``len(LATENESS_BOUNDS)``: above them all) and ``lateness_sum`` their
    lateness in seconds; ``parked``: {group_id: n} leases that ended while their breaker was open,
    waiting again with no attempt spent (issue 41)."""

    promoted: dict = field(default_factory=dict)
    retried: dict = field(default_factory=dict)
    dead_lettered: dict = field(default_factory=dict)
    lateness: dict = field(default_factory=dict)
    held_back: dict = field(default_factory=dict)
    promoted_by_topic: dict = field(default_factory=dict)
    lateness_counts: dict = field(default_factory=dict)
    lateness_sum: float = 0.0
    parked: dict = field(default_factory=dict)

    def merge(self, other: WindowResult) -> WindowResult:
        for mine, theirs in (
            (self.promoted, other.promoted),
            (self.retried, other.retried),
            (self.dead_lettered, other.dead_lettered),
            (self.held_back, other.held_back),
            (self.promoted_by_topic, other.promoted_by_topic),
            (self.lateness_counts, other.lateness_counts),
            (self.parked, other.parked),
        ):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        self.lateness_sum += other.lateness_sum
        for bucket, (n, top) in other.lateness.items():
            count, best = self.lateness.get(bucket, (0, 0.0))
            self.lateness[bucket] = (count + n, max(best, top))
        return self

    def add_promoted(self, rows) -> None:
        for group_id, level, bucket, n, top, topic_id, total, le in rows:
            self.promoted[(group_id, level)] = self.promoted.get((group_id, level), 0) + n
            subscription = (group_id, topic_id)
            self.promoted_by_topic[subscription] = self.promoted_by_topic.get(subscription, 0) + n
            count, best = self.lateness.get(bucket, (0, 0.0))
            self.lateness[bucket] = (count + n, max(best, top))
            self.lateness_counts[le] = self.lateness_counts.get(le, 0) + n
            self.lateness_sum += total

    def add_dead_lettered(self, rows) -> None:
        for group_id, reason, n in rows:
            self.dead_lettered[(group_id, reason)] = self.dead_lettered.get((group_id, reason), 0) + n


def plan_ranges(
    conn: psycopg.Connection, statement: str, params: dict, partitions: int
) -> list[tuple[int, int]]:
    """Split the message ids a job will touch into at most ``partitions`` ranges ``[lo, hi)`` of
    about equal size. ``statement`` (PLAN_WINDOW_RANGES or PLAN_REDRIVE_RANGES) returns the min,
    the max and the quantile cut points of those ids. Empty list when there are none."""
    fractions = [i / partitions for i in range(1, partitions)]
    low, high, cuts = conn.execute(statement, {**params, "fractions": fractions}).fetchone()
    if low is None:
        return []
    bounds = sorted({low, *(cuts or []), high + 1})
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def window_params(policies: dict, levels: list[int], window_end: datetime) -> dict:
    """The parameters every window statement shares."""
    return {
        **policies,
        "levels": levels,
        "window_end": window_end,
        "dead_lettered_at": window_end,
        "lease_error": LEASE_EXPIRED_ERROR,
        "bucket_ms": LATENESS_BUCKET_MS,
        "lateness_le": list(LATENESS_BOUNDS),
    }


def histogram_params(bounds, counts: dict[int, int], total: float) -> dict:
    """The parameters of a histogram observation (ADD_RETRY_LATENESS, TIER_RUN_FINISH): ``counts``
    {bucket index: n} (index ``len(bounds)``: above every bound) as an array, ``total`` the sum of
    the observations in seconds."""
    return {
        "bucket_bounds": list(bounds),
        "bucket_counts": [counts.get(i, 0) for i in range(len(bounds) + 1)],
        "observed_sum": float(total),
    }


def count_moves(conn: psycopg.Connection, tier: str, result: WindowResult) -> None:
    """Add what one transaction of a tier run moved to the totals that never decrease (the groups'
    promoted and dead-lettered, the tier's lateness histogram): the transaction's last statements,
    so the group rows (in id order) and then the histogram row are locked after every delivery row.
    The numbers are what the guarded statements moved: a re-run or an overlapping run adds only
    its own moves."""
    promoted: dict[int, int] = {}
    dead: dict[int, int] = {}
    for (group_id, _), n in result.promoted.items():
        promoted[group_id] = promoted.get(group_id, 0) + n
    for (group_id, _), n in result.dead_lettered.items():
        dead[group_id] = dead.get(group_id, 0) + n
    add_group_totals(conn, promoted=promoted, dead_lettered=dead)
    if result.lateness_counts:
        params = histogram_params(LATENESS_BOUNDS, result.lateness_counts, result.lateness_sum)
        conn.execute(S.ADD_RETRY_LATENESS, {"tier": tier, **params})


def plan_window(
    conn: psycopg.Connection, levels: list[int], window_end: datetime, partitions: int
) -> list[tuple[int, int]]:
    """Message-id ranges of about equal size over the window's candidates."""
    return plan_ranges(conn, S.PLAN_WINDOW_RANGES, {"levels": levels, "window_end": window_end}, partitions)


def count_window(conn: psycopg.Connection, levels: list[int], window_end: datetime) -> int:
    """How many deliveries the window would touch (due retries and ended leases)."""
    return conn.execute(S.WINDOW_CANDIDATES, {"levels": levels, "window_end": window_end}).fetchone()[0]


def dlq_tables_needed(
    conn: psycopg.Connection, levels: list[int], window_end: datetime, policies: dict
) -> set[int]:
    """DLQs without a table that this window would dead-letter into (usually none)."""
    missing = missing_dlq_tables(conn)
    if not missing:
        return set()
    rows = conn.execute(
        S.WINDOW_DLQS_NEEDED,
        {**policies, "missing": list(missing), "levels": levels, "window_end": window_end},
    ).fetchall()
    return {r[0] for r in rows}


def apply_window_range(
    conn: psycopg.Connection,
    *,
    tier: str,
    levels: list[int],
    policies: dict,
    window_end: datetime,
    low: int,
    high: int,
    dry_run: bool = False,
) -> WindowResult:
    """Apply a tier window to message ids in ``[low, high)`` in one transaction.

    1. INFLIGHT messages whose lease (invisible_until) ended by ``window_end`` count as a failed
       delivery: back to WAITING_RETRY as their policy says (due = lease end + wait), or to the DLQ
       (reason LEASE_EXPIRED) when their reconsume times are used up; parked, with no attempt
       spent, while their subscription's breaker is open (its lock held shared first: ``lock_breakers``).
    2. WAITING_RETRY messages at one of ``levels`` due by ``window_end`` go to READY (subscriptions
       with a ready-backlog cap excepted: see ``promote_capped``), or to the DLQ
       (MAX_DELIVERIES_EXCEEDED) if their policy's max reconsume times is now below theirs.

    The same transaction adds its moves to the totals of ``count_moves`` (``tier``: the tier
    whose lateness histogram counts the promotions). ``policies``: parameters from
    ``policy_table``. With ``dry_run`` the transaction is rolled back and the result says what would
    have moved."""
    params = {**window_params(policies, levels, window_end), "low": low, "high": high}
    result = WindowResult()
    with conn.transaction(force_rollback=dry_run):
        lock_breakers(conn, policies["p_topic"], policies["p_group"])
        for group_id, n in conn.execute(S.EXPIRE_LEASES_PARK, params):
            result.parked[group_id] = n
        for group_id, n in conn.execute(S.EXPIRE_LEASES_RETRY, params):
            result.retried[group_id] = n
        result.add_dead_lettered(
            conn.execute(S.EXPIRE_LEASES_DEAD_LETTER, {**params, "reason": "LEASE_EXPIRED"})
        )
        result.add_promoted(conn.execute(S.PROMOTE, params))
        result.add_dead_lettered(
            conn.execute(S.DEAD_LETTER_OVER_MAX, {**params, "reason": "MAX_DELIVERIES_EXCEEDED"})
        )
        if not dry_run:  # rolled back anyway: no group row locked for nothing
            count_moves(conn, tier, result)
    return result


def promote_capped(
    conn: psycopg.Connection,
    *,
    tier: str,
    levels: list[int],
    policies: dict,
    window_end: datetime,
    dry_run: bool = False,
) -> WindowResult:
    """Promote the due messages of subscriptions with a ready-backlog cap, oldest due first, up to
    the room under the cap; the rest stay WAITING_RETRY for a later window (nothing lost, nothing
    early). One transaction per subscription, serialised with publishers by an advisory lock; each
    adds its promotions to the totals (``count_moves``)."""
    result = WindowResult()
    for topic, group_id, cap in zip(policies["p_topic"], policies["p_group"], policies["p_cap"], strict=True):
        if cap is None:
            continue
        params = {**window_params(policies, levels, window_end), "topic_id": topic, "group_id": group_id}
        part = WindowResult()
        with conn.transaction(force_rollback=dry_run):
            lock_backlog(conn, topic)
            params["room"] = max(cap - ready_count(conn, group_id, topic), 0)
            part.add_promoted(conn.execute(S.PROMOTE_CAPPED, params))
            left = conn.execute(S.DUE_COUNT, params).fetchone()[0]
            if left:
                part.held_back[group_id] = left
            if not dry_run:
                count_moves(conn, tier, part)
        result.merge(part)
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
