"""``EngineHook``: where a tier run or a redrive runs, chosen once per run, and the run itself.

The choice: work below the config's ``spark_threshold`` messages runs in the Airflow task (one
guarded statement per range or batch, no Spark); larger work runs as Spark tasks, where the
connection ``redelivery_spark`` says:

- type ``spark_connect`` (the Spark provider's: host, port, login as user id, token as password,
  ``use_ssl`` in its extra): a Spark Connect session made in the task from the provider's
  ``SparkConnectHook`` URL. The project's own server (localhost, the configured port) is started
  when it is not running;
- type ``spark`` (host = a master: ``local[2]``, ``spark://...``, ``k8s://...``, ``yarn``): a
  spark-submit of the package's entry point (``redelivery.jobs``) through the provider's
  ``SparkSubmitHook``. The request travels as JSON (a tier run) or by run key in the state store
  (a redrive: a list of message ids can pass Linux's 128 KiB limit on one argument), and the
  summary comes back from the run's record (``tier_runs``, ``redrive_runs``). The driver runs
  here in client mode (the provider's default; any master) on this Python with the database URL
  in spark-submit's environment, or in the cluster with the connection's extra ``"deploy-mode":
  "cluster"`` (YARN, Kubernetes) on the executors' Python, the URL without its password
  (``spark_submit``).

``EngineHook.choose`` names the three ``IN_TASK``, ``SPARK_CONNECT`` and ``SPARK_SUBMIT``
(``"in-task"``, ``"spark-connect"``, ``"spark-submit"``). A tier run's summary carries ``engine``:
``"spark-submit"`` after a spark-submit, else ``run_tier``'s own (``"spark"`` when its ranges ran
as Spark Connect tasks, else ``"in-process"``); a redrive's record carries ``"spark-submit"`` after
a spark-submit, and no ``engine`` otherwise.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from airflow.sdk import BaseHook

from redelivery.airflow.env import SPARK_CONN_ID
from redelivery.airflow.hooks import RedeliveryHook
from redelivery.config import RedeliveryConfig, cached_config
from redelivery.dead_letters import count
from redelivery.jobs import application
from redelivery.redrive import RedriveRequest, open_run, redrive, run_record
from redelivery.settings import get_settings
from redelivery.spark import deploy
from redelivery.spark.session import driver_here, submit_environment
from redelivery.store import statements as S
from redelivery.tiers.run import TierRunRequest, run_tier, tier_levels
from redelivery.tiers.window import count_window

IN_TASK, SPARK_CONNECT, SPARK_SUBMIT = "in-task", "spark-connect", "spark-submit"


def spark_connection(conn_id: str = SPARK_CONN_ID):
    """The Spark connection ``conn_id``. Raises ``RuntimeError`` saying how to define it when it
    is missing or of another type."""
    from airflow.exceptions import AirflowNotFoundException

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


def connect_url(conn_id: str) -> str:
    """The Spark Connect URL of connection ``conn_id``, as the Spark provider's ``SparkConnectHook``
    builds it (user id, token, ``use_ssl``). pyspark sends a token only over TLS, or in the clear
    to ``localhost``: to another host without ``use_ssl`` the token goes as an ``authorization``
    header instead (a server in a private network, as in docker-compose.yaml)."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    url = SparkConnectHook(conn_id=conn_id).get_connection_url()
    host = re.match(r"sc://([^:/]+)", url).group(1)
    if host != "localhost" and not re.search(r"use_ssl=true", url, re.IGNORECASE):
        url = re.sub(r"token=([^;]*)", r"authorization=Bearer%20\1", url)
    return url


class EngineHook(BaseHook):
    """Runs tier windows (``run_tier``) and redrives (``run_redrive``) where their size and the
    Spark connection ``spark_conn_id`` say (module docstring), on the application database of
    ``database``. ``on_kill`` stops a spark-submit.

    :param spark_conn_id: the Spark connection (type ``spark_connect``: a Spark Connect server;
        ``spark``: a spark-submit to its master; default ``redelivery_spark``).
    :param database: the state store's hook (default ``RedeliveryHook()``).
    :param config: the configuration (default: the config file's, ``cached_config()``).
    """

    conn_name_attr = "spark_conn_id"
    default_conn_name = SPARK_CONN_ID
    hook_name = "redelivery engine"

    def __init__(
        self,
        spark_conn_id: str = SPARK_CONN_ID,
        database: RedeliveryHook | None = None,
        config: RedeliveryConfig | None = None,
    ) -> None:
        super().__init__()
        self.spark_conn_id = spark_conn_id
        self.database = database or RedeliveryHook()
        self.config = config or cached_config()
        self._submit_hook = None

    def choose(self, messages: int) -> str:
        """``IN_TASK`` for fewer than the config's ``spark_threshold`` messages, else
        ``SPARK_CONNECT`` or ``SPARK_SUBMIT`` by the connection's type (``RuntimeError`` when it is
        missing or of another type)."""
        if messages < self.config.spark_threshold:
            return IN_TASK
        kind = spark_connection(self.spark_conn_id).conn_type
        return SPARK_CONNECT if kind == "spark_connect" else SPARK_SUBMIT

    def session(self, app_name: str):
        """A Spark Connect session on the connection's server (started first when it is the
        project's own), given the package's zip and the archives of the connection's extras
        (``deploy.deployment``; the executors' Python is the server's own)."""
        from pyspark.sql.connect.session import SparkSession

        from redelivery.spark import connect_server

        url = connect_url(self.spark_conn_id)
        if re.match(rf"sc://(localhost|127\.0\.0\.1):{get_settings().spark_connect_port}/", url):
            connect_server.ensure_running()
        deployment = deploy.deployment(spark_connection(self.spark_conn_id).extra_dejson)
        builder = SparkSession.builder.remote(url).appName(app_name)
        for key, value in deploy.connect_conf(deployment).items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        deploy.ship(spark, deployment)
        return spark

    def run_tier(self, request: TierRunRequest) -> dict:
        """Apply one tier window (``redelivery.tiers.run.run_tier``) and return its summary, with
        ``engine`` (module docstring). Raises what ``run_tier`` raises, before anything changes;
        ``RuntimeError`` when a spark-submit did not record a successful run."""
        url = self.database.get_ready_url()  # a store that cannot serve: one line, before any change
        levels = tier_levels(self.config, request.tier, request.levels)
        with self.database.get_conn() as conn:
            engine = self.choose(count_window(conn, levels, request.window_end))
        if engine == SPARK_SUBMIT:
            self._submit(
                "tier_window", ["--request", request.model_dump_json()], f"redelivery-tier-{request.tier}"
            )
            with self.database.get_conn() as conn:
                row = conn.execute(S.TIER_RUN_RESULT, {"run_key": request.run_key}).fetchone()
            if row is None or row[0] != "success":
                status = row and row[0]
                raise RuntimeError(
                    f"tier run {request.run_key!r} did not record a successful summary ({status})"
                )
            return {**row[1], "engine": SPARK_SUBMIT}
        return self._with_session(
            engine,
            f"redelivery-tier-{request.tier}",
            lambda spark: run_tier(request, spark=spark, url=url, config=self.config, spark_threshold=0),
        )

    def run_redrive(
        self,
        request: RedriveRequest,
        run_key: str,
        triggered_by: str | None,
        log: Callable[[str], object],
        should_stop: Callable[[], bool],
        wait: Callable[[float], object],
    ) -> dict:
        """Redrive what ``request`` selects under ``run_key`` (``redelivery.redrive.redrive``) and
        return its audit record (with ``engine`` after a spark-submit). A dry run, or one with
        ``max_messages``, runs in the task. Raises what ``redrive`` raises; ``RuntimeError`` when a
        spark-submit did not finish the run."""
        url = self.database.get_ready_url()  # a store that cannot serve: one line, before any change
        engine = IN_TASK
        if not request.dry_run and request.max_messages is None:
            with self.database.get_conn() as conn:
                engine = self.choose(count(conn, request))
        if engine == SPARK_SUBMIT:
            open_run(request, run_key=run_key, triggered_by=triggered_by, url=url)  # read by key
            self._submit(
                "dlq_redrive", ["--run-key", run_key, "--spark-threshold", "0"], "redelivery-dlq-redrive"
            )
            with self.database.get_conn() as conn:
                record = run_record(conn, run_key)
            if record["status"] != "success":
                raise RuntimeError(f"redrive {run_key!r} did not finish (status {record['status']})")
            return {**record, "engine": SPARK_SUBMIT}
        return self._with_session(
            engine,
            "redelivery-dlq-redrive",
            lambda spark: redrive(
                request,
                run_key=run_key,
                triggered_by=triggered_by,
                url=url,
                log=log,
                spark=spark,
                spark_threshold=0 if spark is not None else None,
                should_stop=should_stop,
                wait=wait,
                config=self.config,
            ),
        )

    def on_kill(self) -> None:
        if self._submit_hook is not None:
            self._submit_hook.on_kill()

    def _with_session(self, engine: str, app_name: str, work: Callable) -> dict:
        """``work(spark)`` with a Spark Connect session for ``SPARK_CONNECT`` (stopped after),
        else with None."""
        if engine != SPARK_CONNECT:
            return work(None)
        spark = self.session(app_name)
        try:
            return work(spark)
        finally:
            spark.stop()

    def _submit(self, job: str, args: list[str], name: str) -> None:
        """spark-submit of entry point ``job`` to the connection's master, through the provider
        (``spark_submit``)."""
        self._submit_hook, env = spark_submit(
            self.spark_conn_id, job, args, name, self.database.get_database_url()
        )
        self._submit_hook.submit(application(job), **({"env": env} if env is not None else {}))


def spark_submit(conn_id: str, job: str, args: list[str], name: str, database_url: str | None):
    """``(hook, env)``: the Spark provider's ``SparkSubmitHook`` for entry point ``job`` on Spark
    connection ``conn_id`` (its master and ``deploy-mode`` extra, as the provider reads them; its
    other extras: ``deploy.deployment``), and the environment of spark-submit's process to pass to
    ``hook.submit`` (None: the provider's). A driver here (client mode, the provider's default)
    gets the database URL in that environment, never as ``env_vars``, which the provider puts on
    the command line on YARN and Kubernetes; a driver in the cluster gets it as ``env_vars``,
    without its password (``session.submit_environment``). Raises ``RuntimeError`` for a missing
    connection, ``ValueError`` (one line) for a bad extra or a deploy mode Spark refuses."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    connection = spark_connection(conn_id)
    deployment = deploy.deployment(connection.extra_dejson)
    target = SparkSubmitHook(conn_id=conn_id)._connection  # the master and mode the provider will use
    master, mode = target["master"], target["deploy_mode"]
    env, conf = submit_environment(master, database_url, deployment, mode)
    here = driver_here(master, mode)
    py_files, archives = deploy.submit_files(deployment)
    hook = SparkSubmitHook(
        conn_id=conn_id, conf=conf, env_vars=None if here else env, name=name, application_args=args,
        py_files=py_files, archives=archives,
    )  # fmt: skip
    return hook, {**os.environ, **env} if here else None
