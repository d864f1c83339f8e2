"""DAG factory: one DAG per tier of the config file, ``redelivery_tier_<name>``.

Each DAG runs every tier window (``DeltaDataIntervalTimetable``: the run's data interval is the
window [start, end), Airflow 3 would otherwise give a zero-length interval), one active run at a
time, no catch-up (a late window's run promotes everything due by its end, so skipped windows lose
nothing). Manual runs take Params: window end (default: the run's data interval end, i.e. now),
a subset of the tier's levels, dry run.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, DeltaDataIntervalTimetable

from redelivery.airflow.operators import TierWindowOperator
from redelivery.airflow.params import params_of
from redelivery.config import RedeliveryConfig, TierConfig, cached_config
from redelivery.rules.levels import format_duration
from redelivery.tiers.run import TierRunRequest

START = datetime(2026, 1, 1, tzinfo=UTC)


def system_dag(dag_id: str, *, schedule, tag: str, retry_delay: timedelta, **specific) -> DAG:
    """A DAG of this system on ``schedule`` (every factory of this folder makes its DAGs here):
    from ``START``, no catch-up, one active run at a time, tagged ``redelivery`` and ``tag``, each
    task retried twice ``retry_delay`` apart. ``specific``: the DAG's own other arguments (doc_md,
    params, is_paused_upon_creation)."""
    return DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["redelivery", tag],
        default_args={"retries": 2, "retry_delay": retry_delay},
        **specific,
    )


def dag_id(tier: TierConfig) -> str:
    return f"redelivery_tier_{tier.name}"


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
    doc = f"""
### Tier `{tier.name}`: delay levels {levels_text}

Every {tier.window} this DAG applies the window ending at the run's
`data_interval_end`. It promotes every WAITING_RETRY message of these levels due by then to READY,
turns INFLIGHT messages whose lease (invisible duration) ended into retries or dead letters, and
dead-letters messages whose reconsume times are used up. Re-running a window moves nothing twice.
The task's return value (XCom) and the `tier_runs` table hold the summary: counts per group and
level, and lateness from due time to window end (p50, p99, max). A window of fewer than
`spark_threshold` messages moves in the task; a larger one runs on Spark (`redelivery_spark`).
"""
    with system_dag(
        dag_id(tier),
        tag="tier",
        retry_delay=timedelta(seconds=5),
        schedule=DeltaDataIntervalTimetable(timedelta(seconds=tier.window_seconds)),
        # the system's heartbeat: paused, no retry ever comes back and no lease expiry is handled
        is_paused_upon_creation=False,
        doc_md=doc,
        params=tier_params(tier),
    ) as dag:
        TierWindowOperator(task_id="apply_window", tier=tier.name)
    return dag


def tier_dags(config: RedeliveryConfig | None = None) -> dict[str, DAG]:
    """``{dag_id: DAG}`` for every tier of the config file."""
    config = config or cached_config()
    return {dag_id(t): tier_dag(t, config) for t in config.tiers}
