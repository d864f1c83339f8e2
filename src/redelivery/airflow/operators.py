"""The operators of the system DAGs. Each stores its arguments, checks its run's conf, builds
its request from the run, hands it to ``EngineHook`` (which chooses once where it runs: in the
task, on Spark Connect or by spark-submit, ``airflow.engine``) and returns the hook's result (XCom).
A scheduled tier run that spans several windows (``TierConfig.run_span``) applies them in turn
(``redelivery.tiers.batch``) and returns nothing: its windows are in ``tier_runs`` and its log.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime, timedelta

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from redelivery.airflow.engine import EngineHook
from redelivery.airflow.env import SPARK_CONN_ID
from redelivery.airflow.hooks import RedeliveryHook
from redelivery.airflow.params import check_run_conf
from redelivery.config import TierConfig
from redelivery.redrive import RedriveRequest
from redelivery.standing import run_ticks, tick
from redelivery.tiers.batch import BatchReport, apply_windows, window_ends
from redelivery.tiers.run import TierRunRequest


def tier_request(tier: str, context, window_seconds: int) -> TierRunRequest:
    """The window a tier DAG run applies: ``params.window_end`` if given (then no window start),
    else the run's data interval (an empty one, a trigger timetable's, ends a window of
    ``window_seconds``); ``params.levels`` (empty: all the tier's); ``params.dry_run``; run key
    ``<dag id>/<run id>/<try number>`` (a retried task records a run of its own)."""
    params = context["params"]
    ti = context["ti"]
    start, end = context["data_interval_start"], context["data_interval_end"]
    if start == end:
        start = end - timedelta(seconds=window_seconds)
    return TierRunRequest(
        tier=tier,
        window_end=params.get("window_end") or end,
        window_start=None if params.get("window_end") else start,
        levels=params.get("levels") or [],
        dry_run=bool(params.get("dry_run")),
        run_key=f"{ti.dag_id}/{ti.run_id}/{ti.try_number}",
    )


def redrive_request(params: dict) -> RedriveRequest:
    """The redrive the dlq_redrive Params ask for: the Params are ``RedriveRequest``'s fields
    (pydantic validates them once more; an absent one takes its default, a list given as None is
    empty)."""
    values = {k: params[k] for k in RedriveRequest.model_fields if k in params}
    lists = {k: [] for k, v in values.items() if v is None and k in ("reasons", "message_ids")}
    return RedriveRequest(**{**values, **lists})


def batched(tier: TierConfig, context) -> bool:
    """Whether this run applies a batch of windows: a scheduled run of a tier whose ``run_span``
    holds more than one window. A manual run (and ``dag.test``) applies one window."""
    run_type = context["dag_run"].run_type
    return tier.windows_per_run > 1 and getattr(run_type, "value", run_type) == "scheduled"


def batch_windows(tier: TierConfig, context) -> list:
    """The ends of the windows a batched run applies: those of ``(run_after, run_after +
    run_span]`` (``tiers.batch.window_ends``), the next run's starting where this one's end."""
    run_after = context["dag_run"].run_after
    return window_ends(tier.window_seconds, run_after, run_after + timedelta(seconds=tier.run_span_seconds))


class TierWindowOperator(BaseOperator):
    """Apply tier ``tier``'s windows; ``conn_id``: the Spark connection for large windows.

    A scheduled run of a tier whose ``run_span`` holds several windows applies each window at its
    end, in turn, for the run's span (``batch_windows``; ``redelivery.tiers.batch``), records each
    in ``tier_runs`` under ``<dag id>/<run id>/<try>/<window end>``, logs the windows that moved
    something (the quiet ones a line per 10 minutes), and returns nothing (no XCom). A window that
    fails is logged and covered by the next; the task fails at the end of its span, without a
    retry, when a window failed or a subscription's policy could not be resolved (every other one
    moved). A retried try applies what is left of the span, the windows it missed at once. Pausing
    the DAG stops the batch before its next window (the run ends; the next, once unpaused,
    promotes all that came due meanwhile).

    Any other run (manual, or a tier of one window per run) applies one window (``tier_request``:
    the run's data interval, or its Params) and returns its summary (``run_tier``) with ``engine``
    saying where it ran. A subscription whose policy cannot be resolved fails the task (after every
    other one moved).

    :param tier: a tier of the config file.
    :param conn_id: the Spark connection a window of at least ``spark_threshold`` messages runs on.
    """

    def __init__(self, *, tier: str, conn_id: str = SPARK_CONN_ID, **kwargs):
        super().__init__(**kwargs)
        self.tier, self.conn_id = tier, conn_id
        self._engine: EngineHook | None = None
        self._stop = threading.Event()

    def execute(self, context) -> dict | None:
        check_run_conf(context)  # a conf key no Param declares: fail before the first move
        self._engine = EngineHook(self.conn_id)
        tier = self._engine.config.tier(self.tier)
        if batched(tier, context):
            return self._apply_batch(tier, context)
        summary = self._engine.run_tier(tier_request(self.tier, context, tier.window_seconds))
        self.log.info("tier %s window ending %s: %s", self.tier, summary["window_end"], json.dumps(summary))
        if summary.get("unresolved_subscriptions"):  # every other subscription moved; this one needs a fix
            problems = "; ".join(
                f"{p['topic']}/{p['group']}: {p['error']}" for p in summary["unresolved_subscriptions"]
            )
            # a configuration to fix: a retry would fail the same way
            raise AirflowFailException(
                f"subscriptions left alone, their policy cannot be resolved: {problems}"
            )
        return summary

    def _apply_batch(self, tier: TierConfig, context) -> None:
        ends, ti = batch_windows(tier, context), context["ti"]
        key = f"{ti.dag_id}/{ti.run_id}/{ti.try_number}"

        def apply(start, end) -> dict:
            request = TierRunRequest(
                tier=self.tier, window_start=start, window_end=end, run_key=f"{key}/{end.isoformat()}"
            )
            return self._engine.run_tier(request)

        self.log.info(
            "tier %s: %d windows of %s s ending %s to %s",
            self.tier, len(ends), tier.window_seconds, ends[0].isoformat(), ends[-1].isoformat(),
        )  # fmt: skip
        paused, gone = dag_paused(ti, self.log.warning), orphaned()
        report = apply_windows(
            ends, tier.window_seconds, apply, wait=self._stop.wait, log=self.log.info,
            paused=lambda: gone() or paused(),
        )  # fmt: skip
        self.log.info("tier %s batch: %s", self.tier, json.dumps(report.as_dict()))
        if self._stop.is_set():
            raise RuntimeError(f"stopped by Airflow after {report.windows} of {len(ends)} windows")
        if report.failed or report.unresolved:
            raise AirflowFailException(batch_failure(report, len(ends)))

    def on_kill(self) -> None:
        self._stop.set()
        if self._engine is not None:
            self._engine.on_kill()


def orphaned():
    """A check that this task lost its supervisor (its parent process: a worker killed with its
    Airflow, a node going down): a task that spans an hour stops instead of going on unwatched."""
    parent = os.getppid()
    return lambda: os.getppid() != parent


def dag_paused(ti, log=None):
    """Whether the task's DAG is paused now, asked through the task SDK (the execution API, no
    credentials; Airflow 3.2 and later, else never paused): a paused tier stops within a window,
    as it did when a DAG run was a window. An answer that does not come counts as not paused: a
    hiccup of the API server must not stop the retries. ``log`` (a logger's ``warning``) hears of
    the first question that failed, and of each failure of another kind."""
    if not hasattr(ti, "get_dag"):
        return lambda: False
    failures: set[str] = set()

    def paused() -> bool:
        try:
            return bool(ti.get_dag(ti.dag_id).is_paused)
        except Exception as exc:  # the next window asks again
            kind = type(exc).__name__
            if log is not None and kind not in failures:
                failures.add(kind)
                log("cannot ask whether the DAG is paused (%s: %s): the batch goes on", kind, exc)
            return False

    return paused


def batch_failure(report: BatchReport, windows: int) -> str:
    """The one line a batched run fails with: its failed windows (the first three) and the
    subscriptions whose policy could not be resolved."""
    parts = []
    if report.failed:
        named = "; ".join(f"{end.isoformat()}: {error}" for end, error in report.failed[:3])
        parts.append(f"{len(report.failed)} of {windows} windows failed, each covered by the next ({named})")
    if report.unresolved:
        named = "; ".join(f"{sub}: {error}" for sub, error in sorted(report.unresolved.items()))
        parts.append(f"subscriptions left alone, their policy cannot be resolved: {named}")
    return "; ".join(parts)


class RedriveOperator(BaseOperator):
    """Runs the redrive the DAG run's Params ask for (``redrive_request``) under the run key
    ``dlq_redrive/<run id>``, so a retried or cleared task resumes its run, and returns its audit
    record (``redelivery.redrive.redrive``; ``engine`` after a spark-submit). Marking the task
    failed stops it between batches (Airflow calls ``on_kill``, then kills the task 5 s later if it
    is still running; a batch is one transaction either way).

    :param conn_id: the Spark connection a selection of at least the config's ``spark_threshold``
        dead letters runs on (``redelivery_spark`` by default).
    """

    def __init__(self, *, conn_id: str = SPARK_CONN_ID, **kwargs):
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self._stop = threading.Event()
        self._engine: EngineHook | None = None

    def execute(self, context) -> dict:
        check_run_conf(context)  # a misspelt key must never widen a redrive: fail before any move
        request = redrive_request(context["params"])
        self._engine = EngineHook(self.conn_id)
        return self._engine.run_redrive(
            request,
            run_key=f"dlq_redrive/{context['run_id']}",
            triggered_by=getattr(context["dag_run"], "triggering_user_name", None),
            log=self.log.info,
            should_stop=self._stop.is_set,
            wait=self._stop.wait,
        )

    def on_kill(self) -> None:
        self._stop.set()
        if self._engine is not None:
            self._engine.on_kill()


#: A scheduled run of ``redelivery_standing_redrives`` ticks for this long (seconds).
STANDING_RUN_SPAN_SECONDS = 3600


class StandingRedriveOperator(BaseOperator):
    """Runs the standing redrives' ticks (``redelivery.standing``): a scheduled run ticks every
    ``standing.TICK_SECONDS`` for ``STANDING_RUN_SPAN_SECONDS`` from its start (one DAG run an hour,
    as a batched tier's), logs each run and each policy stopped, and returns nothing; pausing the
    DAG ends it before the next tick. Any other run (manual) runs one tick and returns its report
    (XCom). Both write the config file's policies into the state store first. Marking the task
    failed stops a run between batches (every message in one place; the next tick goes on with
    it)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._stop = threading.Event()

    def execute(self, context) -> dict | None:
        check_run_conf(context)
        url = RedeliveryHook().get_ready_url()
        run_type = context["dag_run"].run_type
        if getattr(run_type, "value", run_type) != "scheduled":
            done = tick(
                url, sync_config=True, log=self.log.info, should_stop=self._stop.is_set, wait=self._stop.wait
            )
            return done.as_dict()
        until = context["dag_run"].run_after + timedelta(seconds=STANDING_RUN_SPAN_SECONDS)
        gone, paused = orphaned(), dag_paused(context["ti"], self.log.warning)
        ticks = run_ticks(
            until, url=url, clock=lambda: datetime.now(UTC), wait=self._stop.wait,
            stop=lambda: self._stop.is_set() or gone(), log=self.log.info, paused=paused,
        )  # fmt: skip
        self.log.info("standing redrives: %d ticks", ticks)
        if self._stop.is_set():
            raise RuntimeError(f"stopped by Airflow after {ticks} ticks")
        return None

    def on_kill(self) -> None:
        self._stop.set()
