"""Operators. ``TierWindowOperator`` runs ``spark_jobs/tier_window.py`` through the Airflow Spark
provider's ``SparkSubmitOperator`` (master from the ``redelivery_spark`` connection) and returns
the run's summary (from ``tier_runs``) as its XCom return value."""

from __future__ import annotations

import json

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from .. import statements as S
from ..settings import REPO_ROOT
from ..spark.session import submit_environment
from .env import SPARK_CONN_ID
from .hooks import RedeliveryHook

TIER_APPLICATION = str(REPO_ROOT / "spark_jobs" / "tier_window.py")


def spark_master(conn_id: str = SPARK_CONN_ID) -> str:
    """The master of the Spark connection ``conn_id`` (its host, e.g. ``local[2]``). Raises
    ``RuntimeError`` saying how to define it when the connection is missing."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise RuntimeError(
            f"Airflow connection {conn_id!r} is missing: define the Spark master, e.g. "
            f'AIRFLOW_CONN_{conn_id.upper()}=\'{{"conn_type": "spark", "host": "local[2]"}}\''
        ) from exc
    return conn.host or "yarn"


class TierWindowOperator(SparkSubmitOperator):
    """Apply one tier window with Spark. ``tier``: tier name from the config file; the window end
    is ``params.window_end`` if given, else the run's ``data_interval_end``."""

    def __init__(self, *, tier: str, **kwargs):
        args = [
            "--tier",
            tier,
            "--window-end",
            "{{ params.window_end or data_interval_end.isoformat() }}",
            "--window-start",
            "{{ '' if params.window_end else data_interval_start.isoformat() }}",
            "--run-key",
            "{{ dag.dag_id }}/{{ run_id }}/{{ ti.try_number }}",
            "--levels",
            "{{ (params.levels or []) | join(',') }}",
            "--dry-run",
            "{{ params.dry_run }}",
        ]
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        kwargs.setdefault("name", f"redelivery-tier-{tier}")
        super().__init__(application=TIER_APPLICATION, application_args=args, **kwargs)
        self.tier = tier

    def execute(self, context):
        hook = RedeliveryHook()
        url = hook.get_database_url()
        env_vars, conf = submit_environment(spark_master(self._conn_id), url)
        self.env_vars = {**env_vars, **(self.env_vars or {})}
        self.conf = {**conf, **(self.conf or {})}
        super().execute(context)
        run_key = self.application_args[self.application_args.index("--run-key") + 1]
        with hook.get_conn() as conn:
            row = conn.execute(S.TIER_RUN_RESULT, {"run_key": run_key}).fetchone()
        if row is None or row[0] != "success":
            raise RuntimeError(
                f"tier run {run_key!r} did not record a successful summary (status: {row and row[0]})"
            )
        summary = row[1]
        self.log.info(
            "tier %s window ending %s moved: %s", self.tier, summary["window_end"], json.dumps(summary)
        )
        for group, moved in summary["by_group"].items():
            self.log.info(
                "group %s: promoted per level %s, lease expired -> retry %s, dead-lettered %s",
                group,
                moved["promoted"],
                moved["retried_after_lease_expiry"],
                moved["dead_lettered"],
            )
        if summary.get("unresolved_subscriptions"):  # every other subscription moved; this one needs a fix
            problems = "; ".join(
                f"{p['topic']}/{p['group']}: {p['error']}" for p in summary["unresolved_subscriptions"]
            )
            raise RuntimeError(f"subscriptions left alone, their policy cannot be resolved: {problems}")
        return summary
