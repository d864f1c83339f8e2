"""The tier window job: promote due retries, expire leases, dead-letter used-up messages.

The driver plans message-id ranges of about equal size (``tiers.window.plan_ranges``); every Spark
task applies one range in one PostgreSQL transaction (``tiers.window.apply_window_range``). The
payloads never leave the database. The run and its summary are recorded in ``tier_runs``.
"""

from __future__ import annotations

import functools
import time
import warnings
from bisect import bisect_left
from datetime import UTC, datetime
from typing import Annotated

from psycopg.types.json import Jsonb
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from redelivery.config import RedeliveryConfig, cached_config
from redelivery.errors import InvalidLevelError, InvalidWindowError
from redelivery.fields import AwareTime
from redelivery.messaging import breaking
from redelivery.messaging.waiting import wake
from redelivery.spark.tasks import default_parallelism, run_in_tasks
from redelivery.store import db
from redelivery.store import statements as S
from redelivery.store.catalog import check_level_table, effective_policies, ensure_dlq_tables, policy_table
from redelivery.tiers.window import (
    LATENESS_BUCKET_MS,
    RUN_DURATION_BOUNDS,
    WindowResult,
    apply_window_range,
    count_window,
    dlq_tables_needed,
    histogram_params,
    lateness_percentiles,
    plan_window,
    promote_capped,
)


def apply_range(
    url: str,
    tier: str,
    levels: list[int],
    policies: dict,
    window_end: datetime,
    dry_run: bool,
    bounds: tuple[int, int],
) -> WindowResult:
    """One range in one transaction, on its own connection (a Spark task, or this process). A
    transaction that PostgreSQL aborts as a deadlock victim changed nothing and runs again."""
    low, high = bounds
    with db.connect(url, autocommit=True) as conn:

        def apply() -> WindowResult:
            if dry_run:  # DLQ tables a dry run would need are made and rolled back with it
                with conn.transaction(force_rollback=True):
                    ensure_dlq_tables(conn, dlq_tables_needed(conn, levels, window_end, policies))
                    return apply_window_range(
                        conn,
                        tier=tier,
                        levels=levels,
                        policies=policies,
                        window_end=window_end,
                        low=low,
                        high=high,
                        dry_run=True,
                    )
            return apply_window_range(
                conn, tier=tier, levels=levels, policies=policies, window_end=window_end, low=low, high=high
            )

        return db.retry_lock_conflicts(apply)


class TierRunRequest(BaseModel):
    """One tier window to apply: tier ``tier``'s window ``[window_start, window_end)``
    (timezone-aware; ``window_start`` is recorded, never used to select), ``levels`` a subset of
    the tier's (default, empty or None: all of them), recorded under ``run_key`` in ``tier_runs``
    (re-using a key overwrites that run's record). A dry run counts and changes nothing. The same
    request is what the Airflow operator, the engine hook and the spark-submit entry point pass (as
    JSON), and the one declaration of its fields: the tier DAGs' Params and ``redelivery tier
    run``'s options are derived from it (``redelivery.fields``).
    Raises pydantic's ``ValidationError`` (a ``ValueError``) for a missing, unknown or ill-typed
    field or a naive time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tier: str = Field(min_length=1, title="Tier", description="A tier of the config file.")
    window_end: AwareTime = Field(
        title="Window end",
        description="ISO 8601 time with zone: every message due by then moves.",
    )
    run_key: str = Field(
        min_length=1, max_length=1000, title="Run key", description="The run's record in tier_runs."
    )
    window_start: AwareTime | None = Field(
        default=None, title="Window start", description="ISO 8601 time with zone, recorded only."
    )
    levels: Annotated[list[int], BeforeValidator(lambda v: [] if v is None else v)] = Field(
        default_factory=list,
        title="Levels",
        description="A subset of the tier's delay levels. Empty: all of them.",
        json_schema_extra={"uniqueItems": True},
    )
    dry_run: bool = Field(
        default=False, title="Dry run", description="Report what would move, change nothing."
    )


def run_tier_window(
    *,
    spark=None,
    url: str | None = None,
    config: RedeliveryConfig | None = None,
    max_partitions: int | None = None,
    spark_threshold: int | None = None,
    **request,
) -> dict:
    """Deprecated (issue 39; goes in the next release): call
    ``run_tier(TierRunRequest(**request), ...)``, the one way to apply a window. Applies tier
    ``tier``'s window ending at ``window_end`` and returns its summary. ``request``: the fields of
    ``TierRunRequest``; the other arguments and what is raised as in ``run_tier``. Warns
    ``DeprecationWarning``."""
    warnings.warn(
        "redelivery.tiers.run.run_tier_window is deprecated: call run_tier(TierRunRequest(**request), ...)",
        DeprecationWarning,
        stacklevel=2,
    )
    return run_tier(
        TierRunRequest(**request),
        spark=spark,
        url=url,
        config=config,
        max_partitions=max_partitions,
        spark_threshold=spark_threshold,
    )


def run_tier(
    request: TierRunRequest,
    *,
    spark=None,
    url: str | None = None,
    config: RedeliveryConfig | None = None,
    max_partitions: int | None = None,
    spark_threshold: int | None = None,
) -> dict:
    """Apply one tier window (``request``) and return its summary.

    ``spark``: a SparkSession (classic or Spark Connect), or a function that makes one, whose tasks
    apply the ranges in parallel when the window has at least ``spark_threshold`` candidates
    (default: the config's ``spark_threshold``; 0: always, the caller counted already); otherwise,
    or with ``spark=None``, the ranges run one after another in this process and no session is
    made. Re-running a window, or overlapping runs, never move a message twice. A subscription
    whose policy cannot be resolved (a config changed after it was made) is left alone and listed
    in the summary's ``unresolved_subscriptions``; every other one moves.

    Raises before changing anything: ``ConfigError`` for an unknown tier, or when messages wait at
    levels the config's table lacks; ``InvalidLevelError`` for a level outside the tier;
    ``InvalidWindowError`` for a window that ends after the database's clock (it would promote
    retries early, or expire leases that have not ended).

    Summary: ``{"tier", "levels", "window_start", "window_end", "dry_run", "promoted",
    "retried_after_lease_expiry", "dead_lettered", "held_back_by_backlog_cap", "by_group": {group:
    {"promoted": {level: n}, "promoted_by_topic": {topic: n}, "retried_after_lease_expiry": n,
    "dead_lettered": {reason: n}, "held_back_by_backlog_cap": n}}, "unresolved_subscriptions":
    [{"topic", "group", "error"}],
    "lateness_seconds": {"p50", "p99", "max"}, "lateness_histogram": {"bucket_ms", "counts":
    {bucket start ms: n}}, "partitions", "duration_seconds", "engine"}``; lateness is window end
    minus due time, in seconds; ``engine`` is ``"spark"`` or ``"in-process"``.
    """
    config = config or cached_config()
    levels = tier_levels(config, request.tier, request.levels)
    url = url or db.database_url()
    started = time.perf_counter()
    with db.connect(url, autocommit=True) as conn:
        _check_window(conn, config, request.window_end)
        start = {"run_key": request.run_key, "tier": request.tier, "levels": levels}
        conn.execute(
            S.TIER_RUN_START,
            {
                **start,
                "window_start": request.window_start,
                "window_end": request.window_end,
                "dry_run": request.dry_run,
            },
        )
        try:
            threshold = config.spark_threshold if spark_threshold is None else spark_threshold
            summary, seconds = _apply(
                conn, url, config, request, levels, spark, threshold, max_partitions, started
            )
            finish = {"status": "success", "summary": Jsonb(summary), "run_key": request.run_key}
            conn.execute(S.TIER_RUN_FINISH, {**finish, **_duration(seconds)})
            return summary
        except BaseException:
            finish = {"status": "failed", "summary": None, "run_key": request.run_key}
            conn.execute(S.TIER_RUN_FINISH, {**finish, **_duration(time.perf_counter() - started)})
            raise


def tier_levels(config: RedeliveryConfig, tier: str, levels: list[int] | None) -> list[int]:
    """The levels a run of ``tier`` applies, sorted: ``levels`` (a subset of the tier's) or all of
    the tier's. Raises ``ConfigError`` for an unknown tier, ``InvalidLevelError`` for a level
    outside it."""
    tier_cfg = config.tier(tier)
    chosen = sorted(set(levels)) if levels else sorted(tier_cfg.levels)
    stray = [lvl for lvl in chosen if lvl not in tier_cfg.levels]
    if stray:
        raise InvalidLevelError(f"levels {stray} are not in tier {tier!r} (its levels: {tier_cfg.levels})")
    return chosen


def _check_window(conn, config: RedeliveryConfig, window_end: datetime) -> None:
    """Refuse before any write: an unmigrated schema, a window ending after the database's clock,
    waiting levels the config's table lacks."""
    db.check_schema(conn)  # SchemaNotMigratedError, not an UndefinedTable halfway
    now = conn.execute(S.DB_NOW).fetchone()[0]
    if window_end > now:
        raise InvalidWindowError(
            f"window end {window_end.isoformat()} is after the database's clock ({now.isoformat()}): "
            "promoting now would deliver retries early"
        )
    check_level_table(conn, config)


def _apply(
    conn, url, config, request: TierRunRequest, levels, spark, threshold, max_partitions, started
) -> tuple[dict, float]:
    """The window's ranges (in Spark tasks or here), then capped promotion: (the summary, the
    seconds since ``started`` it reports)."""
    problems: dict = {}
    window_end, dry_run = request.window_end, request.dry_run
    effective = effective_policies(conn, config, problems=problems)
    policies = policy_table(conn, config, effective)
    if not dry_run:
        ensure_dlq_tables(conn, dlq_tables_needed(conn, levels, window_end, policies))
    if spark is not None and threshold > 0 and count_window(conn, levels, window_end) < threshold:
        spark = None  # a Spark round trip would cost more than the statements
    if callable(spark):
        spark = spark()
    partitions = max_partitions or (2 * default_parallelism(spark) if spark is not None else 1)
    ranges = plan_window(conn, levels, window_end, partitions)
    task = functools.partial(apply_range, url, request.tier, levels, policies, window_end, dry_run)
    parts = run_in_tasks(spark, task, ranges) if spark is not None else [task(b) for b in ranges]
    parts.append(
        promote_capped(
            conn, tier=request.tier, levels=levels, policies=policies, window_end=window_end, dry_run=dry_run
        )
    )
    total = WindowResult()
    for part in parts:
        total.merge(part)
    if total.promoted_by_topic and not dry_run:  # committed: their waiting consumers may receive them
        wake(conn, [(topic_id, group_id, n) for (group_id, topic_id), n in total.promoted_by_topic.items()])
    # every breaker takes its next state once a window (half-open once its open time passed, ended
    # leases counted, answers a crash left uncounted by a transition): every tier's, so that a
    # paused tier leaves none stuck (each evaluation is a lock and a statement, idempotent)
    watched = {key: p.breaker for key, p in sorted(effective.items()) if p.breaker is not None}
    transitions = [] if dry_run else breaking.evaluate_all(conn, watched)
    seconds = time.perf_counter() - started
    summary = _summary(conn, total, request, levels, len(ranges), seconds)
    summary["breaker_transitions"] = [
        {"topic_id": t.topic_id, "group_id": t.group_id, "from": t.from_state, "to": t.to_state}
        for t in transitions
    ]
    summary["engine"] = "spark" if spark is not None and ranges else "in-process"
    summary["unresolved_subscriptions"] = [
        {"topic": topic, "group": group, "error": error} for (topic, group), error in sorted(problems.items())
    ]
    return summary, seconds


def _duration(seconds: float) -> dict:
    """One observation of the tier's run-duration histogram (TIER_RUN_FINISH adds it unless the
    run is a dry run): ``seconds`` from the start of ``run_tier_window`` to its record's end."""
    return histogram_params(RUN_DURATION_BOUNDS, {bisect_left(RUN_DURATION_BOUNDS, seconds): 1}, seconds)


def _summary(conn, total: WindowResult, request: TierRunRequest, levels, partitions, seconds) -> dict:
    names = dict(conn.execute(S.GROUP_NAMES).fetchall())
    topics = dict(conn.execute(S.TOPIC_NAMES).fetchall()) if total.promoted_by_topic else {}
    by_group: dict = {}

    def entry(group_id):
        return by_group.setdefault(
            names.get(group_id, str(group_id)),
            {
                "promoted": {},
                "promoted_by_topic": {},
                "retried_after_lease_expiry": 0,
                "dead_lettered": {},
                "held_back_by_backlog_cap": 0,
                "parked_after_lease_expiry": 0,
            },
        )

    for (group_id, level), n in sorted(total.promoted.items()):
        entry(group_id)["promoted"][str(level)] = n
    for (group_id, topic_id), n in sorted(total.promoted_by_topic.items()):
        entry(group_id)["promoted_by_topic"][topics.get(topic_id, str(topic_id))] = n
    for group_id, n in total.retried.items():
        entry(group_id)["retried_after_lease_expiry"] = n
    for (group_id, reason), n in total.dead_lettered.items():
        entry(group_id)["dead_lettered"][reason] = n
    for group_id, n in total.held_back.items():
        entry(group_id)["held_back_by_backlog_cap"] = n
    for group_id, n in total.parked.items():
        entry(group_id)["parked_after_lease_expiry"] = n
    iso = lambda t: t.astimezone(UTC).isoformat() if t else None  # noqa: E731
    return {
        "tier": request.tier,
        "levels": levels,
        "window_start": iso(request.window_start),
        "window_end": iso(request.window_end),
        "dry_run": request.dry_run,
        "promoted": sum(total.promoted.values()),
        "retried_after_lease_expiry": sum(total.retried.values()),
        "dead_lettered": sum(total.dead_lettered.values()),
        "held_back_by_backlog_cap": sum(total.held_back.values()),
        "parked_after_lease_expiry": sum(total.parked.values()),
        "by_group": by_group,
        "lateness_seconds": lateness_percentiles(total.lateness),
        "lateness_histogram": {
            "bucket_ms": LATENESS_BUCKET_MS,
            "counts": {str(b * LATENESS_BUCKET_MS): n for b, (n, _) in sorted(total.lateness.items())},
        },
        "partitions": partitions,
        "duration_seconds": round(seconds, 3),
    }
