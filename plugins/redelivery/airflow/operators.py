"""Operators. ``TierWindowOperator`` runs ``spark_jobs/tier_window.py`` through the Airflow Spark
provider's ``SparkSubmitOperator`` (master from the ``redelivery_spark`` connection) and returns
the run's summary (from ``tier_runs``) as its XCom return value."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from ..settings import REPO_ROOT
from .env import DB_CONN_ID, SPARK_CONN_ID

TIER_APPLICATION = str(REPO_ROOT / "spark_jobs" / "tier_window.py")


def application_database_url() -> str:
    """The application database for tasks: the ``redelivery_db`` Airflow connection when it
    exists, else ``REDELIVERY_DATABASE_URL`` / the embedded PostgreSQL."""
    from airflow.sdk import BaseHook
    from psycopg.conninfo import make_conninfo

    try:
        conn = BaseHook.get_connection(DB_CONN_ID)
    except Exception:  # AirflowNotFoundException: fall back to the process settings
        from .. import db

        return db.database_url()
    return make_conninfo(host=conn.host, port=conn.port or 5432, user=conn.login, password=conn.password or None,
                         dbname=conn.schema or "redelivery")


class TierWindowOperator(SparkSubmitOperator):
    """Apply one tier window with Spark. ``tier``: tier name from the config file; the window end
    is ``params.window_end`` if given, else the run's ``data_interval_end``."""

    def __init__(self, *, tier: str, **kwargs):
        args = [
            "--tier", tier,
            "--window-end", "{{ params.window_end or data_interval_end.isoformat() }}",
            "--window-start", "{{ '' if params.window_end else data_interval_start.isoformat() }}",
            "--run-key", "{{ dag.dag_id }}/{{ run_id }}/{{ ti.try_number }}",
            "--levels", "{{ (params.levels or []) | join(',') }}",
            "--dry-run", "{{ params.dry_run }}",
        ]
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        kwargs.setdefault("name", f"redelivery-tier-{tier}")
        kwargs.setdefault("conf", {"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"})
        super().__init__(application=TIER_APPLICATION, application_args=args, **kwargs)
        self.tier = tier

    def execute(self, context):
        from airflow.sdk import BaseHook

        try:
            BaseHook.get_connection(self._conn_id)
        except Exception as exc:
            raise RuntimeError(
                f"Airflow connection {self._conn_id!r} is missing: define the Spark master, e.g. "
                f"AIRFLOW_CONN_{self._conn_id.upper()}='{{\"conn_type\": \"spark\", \"host\": \"local[2]\"}}'"
            ) from exc
        url = application_database_url()
        python = os.environ.get("PYSPARK_PYTHON", sys.executable)
        self.env_vars = {**(self.env_vars or {}), "REDELIVERY_DATABASE_URL": url, "PYSPARK_PYTHON": python,
                         "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
        self.conf = {**(self.conf or {}), "spark.pyspark.python": python}
        from ..spark.session import driver_java_options

        if driver_java_options() and "spark.driver.extraJavaOptions" not in self.conf:
            self.conf["spark.driver.extraJavaOptions"] = driver_java_options()
        os.environ["PATH"] = self.env_vars["PATH"]  # spark-submit is looked up on this process's PATH
        super().execute(context)
        run_key = self.application_args[self.application_args.index("--run-key") + 1]
        from .. import db

        with db.connect(url) as conn:
            row = conn.execute("SELECT status, summary FROM tier_runs WHERE run_key = %s", (run_key,)).fetchone()
        if row is None or row[0] != "success":
            raise RuntimeError(f"tier run {run_key!r} did not record a successful summary (status: {row and row[0]})")
        summary = row[1]
        self.log.info("tier %s window ending %s moved: %s", self.tier, summary["window_end"], json.dumps(summary))
        for group, moved in summary["by_group"].items():
            self.log.info("group %s: promoted per level %s, lease expired -> retry %s, dead-lettered %s", group,
                          moved["promoted"], moved["retried_after_lease_expiry"], moved["dead_lettered"])
        return summary
