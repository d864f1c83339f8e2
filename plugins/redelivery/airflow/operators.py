"""Operators, and the Spark a task runs on, picked from the ``redelivery_spark`` connection.

The connection is either the Spark provider's ``spark_connect`` type (host, port, the token as
its password: a Spark Connect server; the default set-up points it at the project's warm server,
``localhost:15002``, which is started on first use) or its ``spark`` type (host = a master:
``local[2]``, ``spark://host:7077``, ``k8s://...``, ``yarn``: each job is a spark-submit through
the provider's ``SparkSubmitHook``).

``TierWindowOperator`` applies one tier window and returns the run's summary (XCom): a window
with fewer candidates than the config's ``spark_threshold`` moves in the task itself; a larger one
runs its ranges as Spark tasks, in the task's Spark Connect session or in a spark-submit of
``spark_jobs/tier_window.py``.
"""

from __future__ import annotations

import json
from datetime import datetime

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseOperator

from .. import statements as S
from ..config import cached_config
from ..settings import REPO_ROOT, get_settings
from ..spark.session import submit_environment
from ..transitions import count_window
from .assets import emit_promotions, promotions_alias
from .env import SPARK_CONN_ID
from .hooks import RedeliveryHook
from .params import check_run_conf

TIER_APPLICATION = str(REPO_ROOT / "spark_jobs" / "tier_window.py")


def spark_connection(conn_id: str = SPARK_CONN_ID):
    """The Spark connection ``conn_id``. Raises ``RuntimeError`` saying how to define it when it
    is missing or of another type."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise RuntimeError(
            f"Airflow connection {conn_id!r} is missing: define a Spark Connect server, e.g. "
            f'AIRFLOW_CONN_{conn_id.upper()}=\'{{"conn_type": "spark_connect", "host": "localhost", '
            f'"port": 15002, "password": "<token>"}}\', or a master for spark-submit, '
            f'\'{{"conn_type": "spark", "host": "local[2]"}}\''
        ) from exc
    if conn.conn_type not in ("spark", "spark_connect"):
        raise RuntimeError(
            f"Airflow connection {conn_id!r} is of type {conn.conn_type!r}: use spark_connect or spark"
        )
    return conn


def spark_master(conn_id: str = SPARK_CONN_ID) -> str:
    """The master of a ``spark`` connection (its host, e.g. ``local[2]``)."""
    return spark_connection(conn_id).host or "yarn"


def connect_session(conn, app_name: str):
    """A Spark Connect session on the server of ``conn`` (a ``spark_connect`` connection). The
    project's own server (localhost, the configured port) is started when it is not running."""
    from pyspark.sql.connect.session import SparkSession

    from ..spark import connect_server

    host = (conn.host or "localhost").removeprefix("sc://").split(":")[0].strip("/")
    port = conn.port or 15002
    if host in ("localhost", "127.0.0.1") and port == get_settings().spark_connect_port:
        connect_server.ensure_running()
    url = connect_server.connect_url(host, port, conn.password or None)
    return SparkSession.builder.remote(url).appName(app_name).getOrCreate()


class TierWindowOperator(BaseOperator):
    """Apply one tier window. ``tier``: tier name from the config file; the window end is
    ``params.window_end`` if given, else the run's ``data_interval_end``; ``params.levels`` a
    subset of the tier's levels; ``params.dry_run``. Returns the summary
    (``redelivery.spark.tier_job.run_tier_window``) with ``engine`` saying where it ran.

    Its outlet is the alias ``redelivery_promotions``: a run that promoted messages emits one
    asset event per subscription, on ``redelivery://<topic>/<group>`` (``airflow.assets``), extra
    ``{"promoted": n, "tier", "window_end"}``; a dry run emits nothing."""

    template_fields = ("window_end", "window_start", "run_key", "levels", "dry_run")

    def __init__(self, *, tier: str, conn_id: str = SPARK_CONN_ID, **kwargs):
        kwargs.setdefault("outlets", [promotions_alias()])
        super().__init__(**kwargs)
        self.tier, self.conn_id = tier, conn_id
        self.window_end = "{{ params.window_end or data_interval_end.isoformat() }}"
        self.window_start = "{{ '' if params.window_end else data_interval_start.isoformat() }}"
        self.run_key = "{{ dag.dag_id }}/{{ run_id }}/{{ ti.try_number }}"
        self.levels = "{{ (params.levels or []) | join(',') }}"
        self.dry_run = "{{ params.dry_run }}"
        self._submit_hook: SparkSubmitHook | None = None

    def execute(self, context) -> dict:
        from ..spark.tier_job import run_tier_window

        check_run_conf(context)  # a conf key no Param declares: fail before the first move
        window_end = datetime.fromisoformat(self.window_end)
        window_start = datetime.fromisoformat(self.window_start) if self.window_start else None
        levels = [int(x) for x in self.levels.split(",") if x.strip()] or None
        dry_run = str(self.dry_run).lower() == "true"
        conn = spark_connection(self.conn_id)
        hook = RedeliveryHook()
        url = hook.get_database_url()
        config = cached_config()
        chosen = levels or config.tier(self.tier).levels
        with hook.get_conn() as db_conn:
            candidates = count_window(db_conn, chosen, window_end)
        if candidates < config.spark_threshold or conn.conn_type == "spark_connect":
            spark = None
            if conn.conn_type == "spark_connect":  # made only if the window is large enough
                spark = lambda: connect_session(conn, f"redelivery-tier-{self.tier}")  # noqa: E731
            summary = run_tier_window(
                spark_threshold=config.spark_threshold,
                tier=self.tier,
                window_end=window_end,
                window_start=window_start,
                run_key=self.run_key,
                levels=levels,
                dry_run=dry_run,
                spark=spark,
                url=url,
            )
        else:
            summary = self._spark_submit(
                conn, url, window_end, window_start, levels, dry_run, config.spark_threshold
            )
        self.log.info(
            "tier %s window ending %s (%s): %s",
            self.tier,
            summary["window_end"],
            summary.get("engine", "spark-submit"),
            json.dumps(summary),
        )
        for group, moved in summary["by_group"].items():
            self.log.info(
                "group %s: promoted per level %s, lease expired -> retry %s, dead-lettered %s",
                group,
                moved["promoted"],
                moved["retried_after_lease_expiry"],
                moved["dead_lettered"],
            )
        for topic, group, n in emit_promotions(context, summary):
            self.log.info("asset event for %s/%s: %s promoted", topic, group, n)
        if summary.get("unresolved_subscriptions"):  # every other subscription moved; this one needs a fix
            problems = "; ".join(
                f"{p['topic']}/{p['group']}: {p['error']}" for p in summary["unresolved_subscriptions"]
            )
            raise RuntimeError(f"subscriptions left alone, their policy cannot be resolved: {problems}")
        return summary

    def _spark_submit(self, conn, url, window_end, window_start, levels, dry_run, threshold) -> dict:
        """spark-submit of spark_jobs/tier_window.py to the connection's master; the summary is read
        back from ``tier_runs``."""
        env_vars, conf = submit_environment(conn.host or "yarn", url)
        args = [
            "--tier",
            self.tier,
            "--window-end",
            window_end.isoformat(),
            "--run-key",
            self.run_key,
            "--window-start",
            window_start.isoformat() if window_start else "",
            "--levels",
            ",".join(map(str, levels or [])),
            "--dry-run",
            str(dry_run).lower(),
            "--spark-threshold",
            str(threshold),
        ]
        self._submit_hook = SparkSubmitHook(
            conn_id=self.conn_id,
            conf=conf,
            env_vars=env_vars,
            name=f"redelivery-tier-{self.tier}",
            application_args=args,
        )
        self._submit_hook.submit(TIER_APPLICATION)
        with RedeliveryHook().get_conn() as db_conn:
            row = db_conn.execute(S.TIER_RUN_RESULT, {"run_key": self.run_key}).fetchone()
        if row is None or row[0] != "success":
            raise RuntimeError(
                f"tier run {self.run_key!r} did not record a successful summary (status: {row and row[0]})"
            )
        return {**row[1], "engine": "spark-submit"}

    def on_kill(self) -> None:
        if self._submit_hook is not None:
            self._submit_hook.on_kill()
