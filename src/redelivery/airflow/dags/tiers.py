"""DAG factory: one DAG per tier of the config file, ``redelivery_tier_<name>``.

A tier whose ``run_span`` holds several windows (the default: an hour of them) runs once per span
(``DeltaTriggerTimetable``: the run starts at the beginning of its span) and its task applies each
window at its end (``TierWindowOperator``, ``redelivery.tiers.batch``): 24 DAG runs a day per tier
instead of one per window. A tier of one window per run (``run_span`` equal to ``window``) runs
every window (``DeltaDataIntervalTimetable``: the run's data interval is the window [start, end)).
No catch-up (a late window promotes everything due by its end, so skipped windows lose nothing);
one active run at a time, or two for a batched tier, so that a manual run (one window) need not
wait for the hour's batch (overlapping windows move nothing twice). Manual runs apply one window
and take Params: window end (default: the run's data interval end, i.e. now), a subset of the
tier's levels, dry run.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, DeltaDataIntervalTimetable, DeltaTriggerTimetable

from redelivery.airflow.operators import TierWindowOperator
from redelivery.airflow.params import params_of
from redelivery.config import RedeliveryConfig, TierConfig, cached_config
from redelivery.rules.levels import format_duration
from redelivery.tiers.run import TierRunRequest

START = datetime(2026, 1, 1, tzinfo=UTC)


def system_dag(
    dag_id: str, *, schedule, tag: str, retry_delay: timedelta, max_active_runs: int = 1, **specific
) -> DAG:
    """A DAG of this system on ``schedule`` (every factory of this folder makes its DAGs here):
    from ``START``, no catch-up, ``max_active_runs`` active runs at a time (one by default),
    tagged ``redelivery`` and ``tag``, each task retried twice ``retry_delay`` apart.
    ``specific``: the DAG's own other arguments (doc_md, params, is_paused_upon_creation)."""
    return DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=START,
        catchup=False,
        max_active_runs=max_active_runs,
        tags=["redelivery", tag],
        default_args={"retries": 2, "retry_delay": retry_delay},
        **specific,
    )


def dag_id(tier: TierConfig) -> str:
    return f"redelivery_tier_{tier.name}"


#: How long a batched tier run may outlive its span (a hung statement, a slow Spark window) before
#: Airflow stops it and its retry applies the windows left.
BATCH_OVERRUN = timedelta(minutes=10)


def tier_schedule(tier: TierConfig):
    """A DAG run per ``run_span`` starting at its beginning, or, for a tier of one window per run,
    a DAG run per window whose data interval is the window."""
    if tier.windows_per_run == 1:
        return DeltaDataIntervalTimetable(timedelta(seconds=tier.window_seconds))
    return DeltaTriggerTimetable(timedelta(seconds=tier.run_span_seconds))


def tier_params(tier: TierConfig) -> dict:
    """A tier DAG's Params: ``TierRunRequest``'s fields a person sets (its one declaration); the
    window end empty for the run's data interval end, the levels narrowed to the tier's own."""
    return params_of(
        TierRunRequest,
        include=("window_end", "levels", "dry_run"),
        defaults={"window_end": None},
        refine={
            "window_end": {"description": "ISO 8601 time with zone. Empty: the run's data interval end "
                           "(now for a manual run)."},
            "levels": {"items": {"type": "integer", "enum": list(tier.levels)},
                       "description": f"Subset of this tier's levels {tier.levels}. Empty: all."},
        },
    )  # fmt: skip


def tier_dag(tier: TierConfig, config: RedeliveryConfig) -> DAG:
    table = config.level_table
    levels_text = ", ".join(f"{lvl} ({format_duration(table.delay(lvl))})" for lvl in tier.levels)
    every = format_duration(tier.run_span_seconds)
    when = (
        f"Every {tier.window} this DAG applies the window ending at the run's `data_interval_end`."
        if tier.windows_per_run == 1
        else f"A run starts every {every} and its task applies its {tier.windows_per_run} windows of "
        f"{tier.window}, each at its end (it holds a worker slot for the {every}). Its log has a line "
        "per window that moved something (quiet ones a line per 10 minutes); a failed window is "
        "covered by the next, and the run fails at its end, naming it."
    )
    doc = f"""
### Tier `{tier.name}`: delay levels {levels_text}

{when} A window promotes every WAITING_RETRY message of these levels due by its end to READY,
turns INFLIGHT messages whose lease (invisible duration) ended into retries or dead letters, and
dead-letters messages whose reconsume times are used up. Re-running a window moves nothing twice.
The `tier_runs` table (the Dead letters page) holds each window's summary: counts per group and
level, and lateness from due time to window end (p50, p99, max). A window of fewer than
`spark_threshold` messages moves in the task; a larger one runs on Spark (`redelivery_spark`).
A manual run applies one window and returns its summary (XCom).
"""
    with system_dag(
        dag_id(tier),
        tag="tier",
        retry_delay=timedelta(seconds=5),
        schedule=tier_schedule(tier),
        # a batch holds its run for an hour: a manual run (one window) must not wait for it to end;
        # overlapping windows move nothing twice
        max_active_runs=1 if tier.windows_per_run == 1 else 2,
        # the system's heartbeat: paused, no retry ever comes back and no lease expiry is handled
        is_paused_upon_creation=False,
        doc_md=doc,
        params=tier_params(tier),
    ) as dag:
        span = timedelta(seconds=tier.run_span_seconds)
        timeout = None if tier.windows_per_run == 1 else span + BATCH_OVERRUN
        TierWindowOperator(task_id="apply_window", tier=tier.name, execution_timeout=timeout)
    return dag


def tier_dags(config: RedeliveryConfig | None = None) -> dict[str, DAG]:
    """``{dag_id: DAG}`` for every tier of the config file."""
    config = config or cached_config()
    return {dag_id(t): tier_dag(t, config) for t in config.tiers}
