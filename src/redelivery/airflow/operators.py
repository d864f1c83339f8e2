"""The two operators of the system DAGs. Each stores its arguments, checks its run's conf, builds
its request from the run, hands it to ``EngineHook`` (which chooses once where it runs: in the
task, on Spark Connect or by spark-submit, ``airflow.engine``) and returns the hook's result (XCom).
"""

from __future__ import annotations

import json
import threading

from airflow.sdk import BaseOperator

from redelivery.airflow.assets import emit_promotions, promotions_alias
from redelivery.airflow.engine import EngineHook
from redelivery.airflow.env import SPARK_CONN_ID
from redelivery.airflow.params import check_run_conf
from redelivery.redrive import RedriveRequest
from redelivery.tiers.run import TierRunRequest


def tier_request(tier: str, context) -> TierRunRequest:
    """The window a tier DAG run applies: ``params.window_end`` if given (then no window start),
    else the run's data interval; ``params.levels`` (empty: all the tier's); ``params.dry_run``;
    run key ``<dag id>/<run id>/<try number>`` (a retried task records a run of its own)."""
    params = context["params"]
    ti = context["ti"]
    return TierRunRequest(
        tier=tier,
        window_end=params.get("window_end") or context["data_interval_end"],
        window_start=None if params.get("window_end") else context["data_interval_start"],
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


class TierWindowOperator(BaseOperator):
    """Apply one tier window (``tier_request``: the run's data interval, or its Params) and return
    the summary (``redelivery.tiers.run.run_tier``) with ``engine`` saying where it ran.
    ``conn_id``: the Spark connection for large windows.

    Its outlet is the alias ``redelivery_promotions``: a run that promoted messages emits one
    asset event per subscription, on ``redelivery://<topic>/<group>`` (``airflow.assets``), extra
    ``{"promoted": n, "tier", "window_end"}``; a dry run emits nothing. A subscription whose policy
    cannot be resolved fails the task (after every other one moved)."""

    def __init__(self, *, tier: str, conn_id: str = SPARK_CONN_ID, **kwargs):
        kwargs.setdefault("outlets", [promotions_alias()])
        super().__init__(**kwargs)
        self.tier, self.conn_id = tier, conn_id
        self._engine: EngineHook | None = None

    def execute(self, context) -> dict:
        check_run_conf(context)  # a conf key no Param declares: fail before the first move
        request = tier_request(self.tier, context)
        self._engine = EngineHook(self.conn_id)
        summary = self._engine.run_tier(request)
        self.log.info("tier %s window ending %s: %s", self.tier, summary["window_end"], json.dumps(summary))
        for topic, group, n in emit_promotions(context, summary):
            self.log.info("asset event for %s/%s: %s promoted", topic, group, n)
        if summary.get("unresolved_subscriptions"):  # every other subscription moved; this one needs a fix
            problems = "; ".join(
                f"{p['topic']}/{p['group']}: {p['error']}" for p in summary["unresolved_subscriptions"]
            )
            raise RuntimeError(f"subscriptions left alone, their policy cannot be resolved: {problems}")
        return summary

    def on_kill(self) -> None:
        if self._engine is not None:
            self._engine.on_kill()


class RedriveOperator(BaseOperator):
    """Runs the redrive the DAG run's Params ask for (``redrive_request``) under the run key
    ``dlq_redrive/<run id>``, so a retried or cleared task resumes its run, and returns its audit
    record (``redelivery.redrive.redrive``; ``engine`` after a spark-submit). Marking the task
    failed stops it between batches (Airflow calls ``on_kill``, then kills the task 5 s later if it
    is still running; a batch is one transaction either way). ``conn_id``: the Spark connection for
    selections of at least the config's ``spark_threshold`` (no max)."""

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
