"""The tier window: plan, lease expiry, promotion, tier runs and their lateness."""

from __future__ import annotations

from redelivery.store.statements._shared import (
    _DLQ_COPY,
    _DUE,
    _EXPIRED,
    _HISTOGRAM_ADD,
    _IN_RANGE,
    _LAST_FAILURE,
    _LEASE_FAILED,
    _LEASE_FAILURE,
    _PROMOTED_COUNTS,
    CAN_RETRY,
    NEXT_DELAY,
    NEXT_LEVEL,
    POLICIES_CTE,
    POLICY_JOIN,
    _attempt,
    _moved,
    _named,
    counted,
    parked,
)

# The statements keep the layout of SQL, not of Python.
# fmt: off

# ---- tier window ----------------------------------------------------------------------------------

#: A subscription's breaker is not open now (closed, or half-open: its probe needs messages READY).
_NOT_OPEN = "coalesce(p.open_until <= now(), true)"
_LEASE_PARKED = _attempt("d.invisible_until", "'parked'", _LEASE_FAILURE)

#: Quantile cut points of the message ids a window would touch (``plan_ranges``).
PLAN_WINDOW_RANGES = _named("PLAN_WINDOW_RANGES", f"""
    SELECT min(message_id), max(message_id),
           percentile_disc(%(fractions)s::float8[]) WITHIN GROUP (ORDER BY message_id)
    FROM deliveries d WHERE ({_DUE}) OR ({_EXPIRED})""")
#: How many deliveries a window would touch.
WINDOW_CANDIDATES = _named("WINDOW_CANDIDATES", f"""
    SELECT count(*) FROM deliveries d WHERE ({_DUE}) OR ({_EXPIRED})""")
#: DLQs without a table that a window would dead-letter into.
WINDOW_DLQS_NEEDED = _named("WINDOW_DLQS_NEEDED", f"""
    WITH {POLICIES_CTE}
    SELECT DISTINCT p.dlq_id FROM deliveries d JOIN policies p ON {POLICY_JOIN}
    WHERE p.dlq_id = ANY(%(missing)s::int[]) AND p.max_times <> -1 AND (
          ({_EXPIRED} AND d.reconsume_times >= p.max_times)
       OR ({_DUE} AND d.reconsume_times > p.max_times))""")
#: An ended lease counts for its subscription's breaker (one configured: ``rule ? 'breaker'``) as an
#: answer's failure does (COUNT_OUTCOMES), when its rule counts ended leases: the rows of CTE
#: ``{0}`` (topic_id, group_id, last_failure_at: the lease's end) added to ``breaker_outcomes`` (a
#: consumer that hangs on a dependency is as telling as one that fails fast). Never while open
#: (those are parked), and half-open only a lease that ended after the open period (a probe's, not
#: one handed out before the opening). Into this backend's own shard (4 and up; answers use 0 to
#: 3): no answer and no other range waits for the row this range's transaction holds.
_TALLY_ENDED_LEASES = f"""tallied AS (
      INSERT INTO breaker_outcomes AS o (topic_id, group_id, second, shard, succeeded, failed)
      SELECT r.topic_id, r.group_id, date_trunc('second', now()), 4 + pg_backend_pid() %% 32000, 0, count(*)
      FROM {{0}} r JOIN policies p ON p.topic_id = r.topic_id AND p.group_id = r.group_id
      WHERE p.rule ? 'breaker' AND {counted('p.rule', _LEASE_FAILURE)}
        AND NOT coalesce(p.open_until > now(), false)
        AND r.last_failure_at >= coalesce(p.open_until, '-infinity')
      GROUP BY 1, 2
      ON CONFLICT (topic_id, group_id, second, shard) DO UPDATE SET failed = o.failed + excluded.failed)"""
#: A lease that ended while its subscription's breaker is open, when an ended lease counts
#: (``parked``): waiting again as the retry it would have been, its reconsume times unchanged,
#: ``parked`` in its history (FAIL_PARK's rule); a half-open breaker's probe counted
#: (_TALLY_ENDED_LEASES: its hung probe opens it again).
EXPIRE_LEASES_PARK = _named("EXPIRE_LEASES_PARK", f"""
    WITH {POLICIES_CTE}, parked AS (
      UPDATE deliveries d SET state = 'WAITING_RETRY', delay_level = {NEXT_LEVEL},
          due_at = d.invisible_until + make_interval(secs => {NEXT_DELAY}),
          last_error = %(lease_error)s, last_failure_at = d.invisible_until,
          first_failure_at = coalesce(d.first_failure_at, d.invisible_until),
          attempts = {_LEASE_PARKED}, invisible_until = NULL, updated_at = now()
      FROM policies p
      WHERE {_IN_RANGE} AND {_EXPIRED} AND {parked(_LEASE_FAILURE)}
      RETURNING d.group_id, d.topic_id, d.last_failure_at),
    {_TALLY_ENDED_LEASES.format("parked")}
    SELECT group_id, count(*) FROM parked GROUP BY 1""")
#: A lease that ended is a failed delivery: the retry is due its policy's wait after the lease end
#: (counted for its breaker: _TALLY_ENDED_LEASES).
EXPIRE_LEASES_RETRY = _named("EXPIRE_LEASES_RETRY", f"""
    WITH {POLICIES_CTE}, retried AS (
      UPDATE deliveries d SET state = 'WAITING_RETRY',
          reconsume_times = d.reconsume_times + 1, delay_level = {NEXT_LEVEL},
          due_at = d.invisible_until + make_interval(secs => {NEXT_DELAY}),
          last_error = %(lease_error)s, last_failure_at = d.invisible_until,
          first_failure_at = coalesce(d.first_failure_at, d.invisible_until),
          attempts = {_LEASE_FAILED}, invisible_until = NULL, updated_at = now()
      FROM policies p
      WHERE {_IN_RANGE} AND {_EXPIRED} AND {CAN_RETRY} AND NOT {parked(_LEASE_FAILURE)}
      RETURNING d.group_id, d.topic_id, d.last_failure_at),
    {_TALLY_ENDED_LEASES.format("retried")}
    SELECT group_id, count(*) FROM retried GROUP BY 1""")
#: A lease that ended when no retry is left: the delivery row goes, its dead letter to the DLQ
#: (counted for its breaker: _TALLY_ENDED_LEASES).
EXPIRE_LEASES_DEAD_LETTER = _named("EXPIRE_LEASES_DEAD_LETTER", f"""
    WITH {POLICIES_CTE}, moved AS (
      DELETE FROM deliveries d USING policies p
      WHERE {_IN_RANGE} AND {_EXPIRED} AND NOT {CAN_RETRY} AND NOT {parked(_LEASE_FAILURE)}
      {_moved("d.invisible_until", _LEASE_FAILURE, _LEASE_FAILED)}),
    {_TALLY_ENDED_LEASES.format("moved")},
    {_DLQ_COPY}""")
#: Due retries of subscriptions without a ready-backlog cap (PROMOTE_CAPPED does the others); a
#: subscription whose breaker is open keeps them waiting (``_NOT_OPEN``).
PROMOTE = _named("PROMOTE", f"""
    WITH {POLICIES_CTE}, promoted AS (
      UPDATE deliveries d SET state = 'READY', ready_at = now(), updated_at = now()
      FROM policies p
      WHERE {_IN_RANGE} AND {_DUE} AND p.cap IS NULL AND {_NOT_OPEN}
        AND (p.max_times = -1 OR d.reconsume_times <= p.max_times)
      {_PROMOTED_COUNTS}""")
#: Due retries whose policy's max reconsume times was lowered below theirs while they waited.
DEAD_LETTER_OVER_MAX = _named("DEAD_LETTER_OVER_MAX", f"""
    WITH {POLICIES_CTE}, moved AS (
      DELETE FROM deliveries d USING policies p
      WHERE {_IN_RANGE} AND {_DUE} AND p.max_times <> -1 AND d.reconsume_times > p.max_times
      {_moved("d.last_failure_at", _LAST_FAILURE, "d.attempts")}),
    {_DLQ_COPY}""")
#: Due retries of one capped subscription (topic_id, g), oldest due first, at most ``room``; but
#: every due head of an ordered subscription's key (a keyed row that is not BLOCKED is its key's
#: head), room or not: the messages behind it are counted already, and if they fill the cap nothing
#: else could make room (publish refused, receive empty, the head never delivered again). The
#: backlog may pass the cap by one a held key.
PROMOTE_CAPPED = _named("PROMOTE_CAPPED", f"""
    WITH {POLICIES_CTE}, heads AS (
      SELECT d.message_id FROM deliveries d
      WHERE d.group_id = %(group_id)s AND d.topic_id = %(topic_id)s AND {_DUE} AND d.key IS NOT NULL
      FOR UPDATE),
    keyless AS (
      SELECT d.message_id FROM deliveries d
      WHERE d.group_id = %(group_id)s AND d.topic_id = %(topic_id)s AND {_DUE} AND d.key IS NULL
      ORDER BY d.due_at, d.message_id LIMIT greatest(%(room)s - (SELECT count(*) FROM heads), 0) FOR UPDATE),
    chosen AS (SELECT message_id FROM heads UNION ALL SELECT message_id FROM keyless),
    promoted AS (
      UPDATE deliveries d SET state = 'READY', ready_at = now(), updated_at = now()
      FROM policies p, chosen c
      WHERE d.topic_id = %(topic_id)s AND d.group_id = %(group_id)s AND d.message_id = c.message_id
        AND {POLICY_JOIN} AND {_DUE} AND {_NOT_OPEN}
        AND (p.max_times = -1 OR d.reconsume_times <= p.max_times)
      {_PROMOTED_COUNTS}""")
DUE_COUNT = _named("DUE_COUNT", f"""
    SELECT count(*) FROM deliveries d
    WHERE d.group_id = %(group_id)s AND d.topic_id = %(topic_id)s AND {_DUE}""")

TIER_RUN_START = _named("TIER_RUN_START", """
    INSERT INTO tier_runs (run_key, tier, levels, window_start, window_end, dry_run)
    VALUES (%(run_key)s, %(tier)s, %(levels)s::smallint[], %(window_start)s, %(window_end)s, %(dry_run)s)
    ON CONFLICT (run_key) DO UPDATE SET tier = EXCLUDED.tier, levels = EXCLUDED.levels,
        window_start = EXCLUDED.window_start, window_end = EXCLUDED.window_end,
        dry_run = EXCLUDED.dry_run, status = 'running', started_at = now(),
        finished_at = NULL, summary = NULL""")
#: ``status`` 'success' with the summary, or 'failed' (summary NULL).
#: A run that is not a dry run is one observation of its tier's run-duration histogram
#: (``bucket_*``, ``observed_sum``: its duration, seconds), in the same transaction.
TIER_RUN_FINISH = _named("TIER_RUN_FINISH", f"""
    WITH finished AS (
      UPDATE tier_runs SET status = %(status)s, finished_at = now(), summary = %(summary)s::jsonb
      WHERE run_key = %(run_key)s RETURNING tier, dry_run)
    {_HISTOGRAM_ADD.format(metric="run_duration", rows="FROM finished WHERE NOT dry_run")}""")
#: The lateness of a tier run's transaction's promotions (``bucket_*``, ``observed_sum`` in seconds:
#: ``tiers.window.count_moves``), after its ADD_GROUP_TOTALS.
ADD_RETRY_LATENESS = _named("ADD_RETRY_LATENESS", f"""
    WITH finished AS (SELECT %(tier)s::text AS tier)
    {_HISTOGRAM_ADD.format(metric="retry_lateness", rows="FROM finished")}""")
#: Messages waiting at levels a table of ``level_count`` levels does not have: (level, count).
WAITING_BEYOND_LEVELS = _named("WAITING_BEYOND_LEVELS", """
    SELECT delay_level, count(*) FROM deliveries
    WHERE state = 'WAITING_RETRY' AND delay_level > %(level_count)s::int GROUP BY 1 ORDER BY 1""")
TIER_RUN_RESULT = _named("TIER_RUN_RESULT", """
    SELECT status, summary FROM tier_runs WHERE run_key = %(run_key)s""")
LATEST_TIER_RUNS = _named("LATEST_TIER_RUNS", """
    SELECT DISTINCT ON (tier) tier, window_end, status, summary->>'promoted', summary->>'dead_lettered',
           summary->'lateness_seconds'->>'p99'
    FROM tier_runs ORDER BY tier, finished_at DESC NULLS LAST""")
# fmt: on
