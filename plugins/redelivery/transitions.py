"""The set-based state changes of the state machine (RocketMQ 5 PushConsumer, seeds/001).

Every change is one SQL statement over many rows, guarded by the state it expects
(``WHERE state = 'WAITING_RETRY' AND due_at <= window end`` ...). A transition that was already
made, by an earlier run of the same window or by a run overlapping this one, matches no row: row
locks plus PostgreSQL's re-check of the ``WHERE`` clause after a lock wait make every message move
at most once. Payloads never leave PostgreSQL: a dead letter is copied from ``messages`` into its
DLQ table inside the database.

Policies reach SQL as a small table, one row per subscription (``policy_table``): the delays and
routing levels of retries 1..K, the collision-avoidance factor, max reconsume times, the DLQ and
the ready-backlog cap. The client's nacks and the tier job's lease expiries use the same
expressions, so both follow the same policy.

A tier window is applied in message-id ranges (``plan_ranges``), each range in one transaction
(``apply_window_range``): that is what the Spark job runs in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg import sql

from .config import RedeliveryConfig
from .policies import NAME_PATTERN, EffectivePolicy

DLQ_TABLE_LOCK = 7_424_002  # advisory lock namespace: creating a DLQ table
BACKLOG_LOCK = 7_424_003  # advisory lock namespace: a topic's ready backlog (flow control)
DLQ_SCHEMA = "redelivery_dlq"
LEASE_EXPIRED_ERROR = "lease expired: no ack or nack within the invisible duration"
LATENESS_BUCKET_MS = 100

# The policy of each subscription, from the parameters built by policy_table().
POLICIES_CTE = """policies AS (
    SELECT * FROM unnest(%(p_topic)s::int[], %(p_group)s::int[], %(p_max)s::int[], %(p_delays)s::text[],
                         %(p_levels)s::text[], %(p_jitter)s::float8[], %(p_dlq)s::int[], %(p_cap)s::int[])
        AS p(topic_id, group_id, max_times, delays, levels, jitter, dlq_id, cap))"""
POLICY_JOIN = "p.topic_id = d.topic_id AND p.group_id = d.group_id"
CAN_RETRY = "(p.max_times = -1 OR d.reconsume_times < p.max_times)"
# Retry n = d.reconsume_times + 1: its routing level, and its wait in seconds with Artemis collision
# avoidance (wait + wait * factor * U[0,1) with a random sign, seeds/004).
NEXT_LEVEL = "(p.levels::int[])[least(d.reconsume_times + 1, cardinality(p.levels::int[]))]"
NEXT_DELAY = """((p.delays::float8[])[least(d.reconsume_times + 1, cardinality(p.delays::float8[]))]
                 * (1 + p.jitter * (CASE WHEN random() < 0.5 THEN -1 ELSE 1 END) * random()))"""


def attempt(at: str, outcome: str, error: str) -> str:
    """SQL appending one failed delivery to ``d.attempts`` (bounded history)."""
    return (f"append_attempt(d.attempts, jsonb_build_object('at', {at}, 'delivery', d.delivery_count, "
            f"'outcome', {outcome}, 'error', {error}))")


# Copies the rows a CTE called "moved" returns into dlq_messages; "moved" must return
# message_id, group_id, topic_id, dlq_id, delivery_count, reconsume_times, first_failure_at,
# last_failure_at, last_error, attempts, reason. The statement returns (group_id, reason, count).
DLQ_INSERT = """
, inserted AS (
    INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, key, body, content_type,
                              properties, published_at, reason, last_error, delivery_count, reconsume_times,
                              first_failure_at, last_failure_at, dead_lettered_at, attempts)
    SELECT mv.dlq_id, mv.group_id, mv.message_id, mv.topic_id, coalesce(m.origin_message_id, m.id), m.key, m.body,
           m.content_type, m.properties, m.published_at, mv.reason::dlq_reason, mv.last_error,
           mv.delivery_count, mv.reconsume_times, mv.first_failure_at, mv.last_failure_at,
           coalesce(%(dead_lettered_at)s::timestamptz, now()), mv.attempts
    FROM moved mv JOIN messages m ON m.id = mv.message_id
    RETURNING group_id, reason
)
SELECT group_id, reason::text, count(*) FROM inserted GROUP BY 1, 2
"""
RETURNING_MOVED = """
    RETURNING d.message_id, d.group_id, d.topic_id, p.dlq_id, d.delivery_count, d.reconsume_times,
              d.first_failure_at, d.last_failure_at, d.last_error, d.attempts"""


# ---- policies -----------------------------------------------------------------------------------


def effective_policies(conn: psycopg.Connection, config: RedeliveryConfig,
                       pairs: list[tuple[int, int]] | None = None) -> dict[tuple[int, int], EffectivePolicy]:
    """``{(topic_id, group_id): EffectivePolicy}`` for every subscription (or only ``pairs``)."""
    rows = conn.execute(
        """SELECT s.topic_id, s.group_id, t.name, g.name, g.max_reconsume_times
           FROM subscriptions s JOIN topics t ON t.id = s.topic_id JOIN consumer_groups g ON g.id = s.group_id
           WHERE %(all)s OR (s.topic_id, s.group_id) IN (SELECT * FROM unnest(%(t)s::int[], %(g)s::int[]))""",
        {"all": pairs is None, "t": [p[0] for p in pairs or []], "g": [p[1] for p in pairs or []]}).fetchall()
    return {(t, g): config.policy_for(topic, group, own_max) for t, g, topic, group, own_max in rows}


def policy_table(conn: psycopg.Connection, config: RedeliveryConfig, policies: dict) -> dict:
    """The SQL parameters of ``POLICIES_CTE`` for ``policies`` (from ``effective_policies``).
    Registers each DLQ name (not its table: that comes with the first dead letter)."""
    names = sorted({p.dlq_name for p in policies.values()})
    ids: dict[str, int] = {}
    if names:
        conn.execute("INSERT INTO dead_letter_queues (name) SELECT unnest(%s::text[]) ON CONFLICT (name) DO NOTHING",
                     (names,))
        ids = dict(conn.execute("SELECT name, id FROM dead_letter_queues WHERE name = ANY(%s)", (names,)).fetchall())
    table = {k: [] for k in ("p_topic", "p_group", "p_max", "p_delays", "p_levels", "p_jitter", "p_dlq", "p_cap")}
    routing = config.level_table
    for (topic_id, group_id), policy in policies.items():
        delays, levels = policy.schedule(routing)
        table["p_topic"].append(topic_id)
        table["p_group"].append(group_id)
        table["p_max"].append(policy.max_reconsume_times)
        table["p_delays"].append("{" + ",".join(repr(float(d)) for d in delays) + "}")
        table["p_levels"].append("{" + ",".join(str(lvl) for lvl in levels) + "}")
        table["p_jitter"].append(policy.jitter)
        table["p_dlq"].append(ids[policy.dlq_name])
        table["p_cap"].append(policy.max_ready_backlog)
    return table


# ---- DLQ tables ---------------------------------------------------------------------------------


def ensure_dlq_tables(conn: psycopg.Connection, dlq_ids: set[int]) -> list[str]:
    """Create the table of each DLQ in ``dlq_ids`` that has none yet (a partition of dlq_messages
    in schema redelivery_dlq named after the DLQ); return the names made.

    Each creation is its own short transaction under an advisory lock, so concurrent callers make a
    table once. Call it before the transaction that dead-letters."""
    created = []
    for dlq_id in sorted(dlq_ids):
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (DLQ_TABLE_LOCK, dlq_id))
            name, made = conn.execute("SELECT name, table_created_at FROM dead_letter_queues WHERE id = %s",
                                      (dlq_id,)).fetchone()
            if made is not None:
                continue
            if not NAME_PATTERN.match(name):  # the CHECK constraint says the same; never build SQL from it unchecked
                raise ValueError(f"DLQ name {name!r} cannot name a table")
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} PARTITION OF dlq_messages FOR VALUES IN ({})").format(
                sql.Identifier(DLQ_SCHEMA, name), sql.Literal(dlq_id)))
            conn.execute("UPDATE dead_letter_queues SET table_created_at = now() WHERE id = %s", (dlq_id,))
            created.append(name)
    return created


def missing_dlq_tables(conn: psycopg.Connection) -> set[int]:
    return {r[0] for r in conn.execute("SELECT id FROM dead_letter_queues WHERE table_created_at IS NULL")}


# ---- tier window --------------------------------------------------------------------------------


@dataclass
class WindowResult:
    """What one range (or a whole window, once merged) moved.

    ``promoted``: {(group_id, level): n}; ``retried``: {group_id: n} leases expired into a retry;
    ``dead_lettered``: {(group_id, reason): n}; ``lateness``: {bucket: (n, max_seconds)} where a
    bucket is ``LATENESS_BUCKET_MS`` wide and lateness = window end - due time; ``held_back``:
    {group_id: n} due messages left waiting by a ready-backlog cap."""

    promoted: dict = field(default_factory=dict)
    retried: dict = field(default_factory=dict)
    dead_lettered: dict = field(default_factory=dict)
    lateness: dict = field(default_factory=dict)
    held_back: dict = field(default_factory=dict)

    def merge(self, other: "WindowResult") -> "WindowResult":
        for mine, theirs in ((self.promoted, other.promoted), (self.retried, other.retried),
                             (self.dead_lettered, other.dead_lettered), (self.held_back, other.held_back)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        for bucket, (n, top) in other.lateness.items():
            count, best = self.lateness.get(bucket, (0, 0.0))
            self.lateness[bucket] = (count + n, max(best, top))
        return self

    def add_promoted(self, rows) -> None:
        for group_id, level, bucket, n, top in rows:
            self.promoted[(group_id, level)] = self.promoted.get((group_id, level), 0) + n
            count, best = self.lateness.get(bucket, (0, 0.0))
            self.lateness[bucket] = (count + n, max(best, top))


_CANDIDATES = """
    (d.state = 'WAITING_RETRY' AND d.delay_level = ANY(%(levels)s::smallint[]) AND d.due_at <= %(window_end)s)
    OR (d.state = 'INFLIGHT' AND d.invisible_until <= %(window_end)s)
"""
_DUE = "d.state = 'WAITING_RETRY' AND d.delay_level = ANY(%(levels)s::smallint[]) AND d.due_at <= %(window_end)s"
_EXPIRED = "d.state = 'INFLIGHT' AND d.invisible_until <= %(window_end)s"
_PROMOTED_RETURNING = """RETURNING d.group_id, d.delay_level,
                            extract(epoch FROM %(window_end)s - d.due_at)::float8 AS lateness)
                SELECT group_id, delay_level, floor(lateness * 1000 / %(bucket_ms)s)::int, count(*), max(lateness)
                FROM promoted GROUP BY 1, 2, 3"""


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


def dlq_tables_needed(conn: psycopg.Connection, levels: list[int], window_end: datetime, policies: dict) -> set[int]:
    """DLQs without a table that this window would dead-letter into (usually none)."""
    missing = missing_dlq_tables(conn)
    if not missing:
        return set()
    rows = conn.execute(
        f"""WITH {POLICIES_CTE}
            SELECT DISTINCT p.dlq_id FROM deliveries d JOIN policies p ON {POLICY_JOIN}
            WHERE p.dlq_id = ANY(%(missing)s) AND p.max_times <> -1 AND (
                  ({_EXPIRED} AND d.reconsume_times >= p.max_times)
               OR ({_DUE} AND d.reconsume_times > p.max_times))""",
        {**policies, "missing": list(missing), "levels": levels, "window_end": window_end}).fetchall()
    return {r[0] for r in rows}


def apply_window_range(
    conn: psycopg.Connection,
    *,
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
       (reason LEASE_EXPIRED) when their reconsume times are used up.
    2. WAITING_RETRY messages at one of ``levels`` due by ``window_end`` go to READY (subscriptions
       with a ready-backlog cap excepted: see ``promote_capped``), or to the DLQ
       (MAX_DELIVERIES_EXCEEDED) if their policy's max reconsume times is now below theirs.

    ``policies``: parameters from ``policy_table``. With ``dry_run`` the transaction is rolled back
    and the result says what would have moved."""
    params = {**policies, "levels": levels, "window_end": window_end, "low": low, "high": high,
              "dead_lettered_at": window_end, "lease_error": LEASE_EXPIRED_ERROR, "bucket_ms": LATENESS_BUCKET_MS}
    in_range = f"d.message_id >= %(low)s AND d.message_id < %(high)s AND {POLICY_JOIN}"
    failed = attempt("d.invisible_until", "'lease_expired'", "%(lease_error)s::text")
    result = WindowResult()
    with conn.transaction(force_rollback=dry_run):
        for group_id, n in conn.execute(
            f"""WITH {POLICIES_CTE}, retried AS (
                  UPDATE deliveries d SET state = 'WAITING_RETRY',
                      reconsume_times = d.reconsume_times + 1, delay_level = {NEXT_LEVEL},
                      due_at = d.invisible_until + make_interval(secs => {NEXT_DELAY}),
                      last_error = %(lease_error)s, last_failure_at = d.invisible_until,
                      first_failure_at = coalesce(d.first_failure_at, d.invisible_until),
                      attempts = {failed}, invisible_until = NULL, updated_at = now()
                  FROM policies p
                  WHERE {in_range} AND {_EXPIRED} AND {CAN_RETRY}
                  RETURNING d.group_id)
                SELECT group_id, count(*) FROM retried GROUP BY 1""", params):
            result.retried[group_id] = n
        for group_id, reason, n in conn.execute(
            f"""WITH {POLICIES_CTE}, moved AS (
                  UPDATE deliveries d SET state = 'DLQ', last_error = %(lease_error)s,
                      last_failure_at = d.invisible_until,
                      first_failure_at = coalesce(d.first_failure_at, d.invisible_until),
                      attempts = {failed}, invisible_until = NULL, due_at = NULL, updated_at = now()
                  FROM policies p
                  WHERE {in_range} AND {_EXPIRED} AND NOT {CAN_RETRY}
                  {RETURNING_MOVED}, 'LEASE_EXPIRED' AS reason)
                {DLQ_INSERT}""", params):
            result.dead_lettered[(group_id, reason)] = n
        result.add_promoted(conn.execute(
            f"""WITH {POLICIES_CTE}, promoted AS (
                  UPDATE deliveries d SET state = 'READY', updated_at = now()
                  FROM policies p
                  WHERE {in_range} AND {_DUE} AND p.cap IS NULL
                    AND (p.max_times = -1 OR d.reconsume_times <= p.max_times)
                  {_PROMOTED_RETURNING}""", params))
        for group_id, reason, n in conn.execute(
            f"""WITH {POLICIES_CTE}, moved AS (
                  UPDATE deliveries d SET state = 'DLQ', due_at = NULL, updated_at = now()
                  FROM policies p
                  WHERE {in_range} AND {_DUE} AND p.max_times <> -1 AND d.reconsume_times > p.max_times
                  {RETURNING_MOVED}, 'MAX_DELIVERIES_EXCEEDED' AS reason)
                {DLQ_INSERT}""", params):
            key = (group_id, reason)
            result.dead_lettered[key] = result.dead_lettered.get(key, 0) + n
    return result


def promote_capped(conn: psycopg.Connection, *, levels: list[int], policies: dict, window_end: datetime,
                   dry_run: bool = False) -> WindowResult:
    """Promote the due messages of subscriptions with a ready-backlog cap, oldest due first, up to
    the room under the cap; the rest stay WAITING_RETRY for a later window (nothing lost, nothing
    early). One transaction per subscription, serialised with publishers by an advisory lock."""
    result = WindowResult()
    for topic_id, group_id, cap in zip(policies["p_topic"], policies["p_group"], policies["p_cap"]):
        if cap is None:
            continue
        params = {**policies, "levels": levels, "window_end": window_end, "t": topic_id, "g": group_id,
                  "bucket_ms": LATENESS_BUCKET_MS}
        with conn.transaction(force_rollback=dry_run):
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (BACKLOG_LOCK, topic_id))
            ready = conn.execute("SELECT count(*) FROM deliveries WHERE group_id = %s AND topic_id = %s AND state = 'READY'",
                                 (group_id, topic_id)).fetchone()[0]
            params["room"] = max(cap - ready, 0)
            result.add_promoted(conn.execute(
                f"""WITH {POLICIES_CTE}, chosen AS (
                      SELECT d.message_id FROM deliveries d
                      WHERE d.group_id = %(g)s AND d.topic_id = %(t)s AND {_DUE}
                      ORDER BY d.due_at, d.message_id LIMIT %(room)s FOR UPDATE),
                    promoted AS (
                      UPDATE deliveries d SET state = 'READY', updated_at = now()
                      FROM policies p, chosen c
                      WHERE d.message_id = c.message_id AND d.group_id = %(g)s AND {POLICY_JOIN} AND {_DUE}
                        AND (p.max_times = -1 OR d.reconsume_times <= p.max_times)
                      {_PROMOTED_RETURNING}""", params))
            left = conn.execute(f"SELECT count(*) FROM deliveries d WHERE d.group_id = %(g)s AND d.topic_id = %(t)s AND {_DUE}",
                                params).fetchone()[0]
            if left:
                result.held_back[group_id] = result.held_back.get(group_id, 0) + left
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
