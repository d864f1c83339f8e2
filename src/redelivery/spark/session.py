"""Building the SparkSession of a job: the warm Spark Connect server by default, a classic
session on any master, or what spark-submit set up; and the environment of a spark-submit."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from redelivery.settings import get_settings
from redelivery.spark.jvm import driver_java_options


def runs_driver_here(master: str) -> bool:
    """Whether a spark-submit to ``master`` starts its driver on this machine with this Python
    (local mode, or a standalone master in client mode), rather than in a cluster (YARN, Kubernetes)
    whose machines have their own paths."""
    return master.startswith(("local", "spark://"))


def submit_environment(master: str, database_url: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``(env_vars, conf)`` for a spark-submit of one of ``redelivery/spark/jobs/`` to ``master``: the one
    place that says what every submit needs. ``env_vars``: ``REDELIVERY_DATABASE_URL`` (when given)
    and, for a driver on this machine, ``PYSPARK_PYTHON`` and a ``PATH`` that finds this
    environment's ``spark-submit``. ``conf``: no UI, UTC session time zone, Python workers on this
    interpreter (driver on this machine) and the class-data sharing archive when it exists."""
    env: dict[str, str] = {}
    conf = {"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"}
    if database_url:
        env["REDELIVERY_DATABASE_URL"] = database_url
    if runs_driver_here(master):
        python = os.environ.get("PYSPARK_PYTHON", sys.executable)
        env["PYSPARK_PYTHON"] = python
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
        conf["spark.pyspark.python"] = python
        if driver_java_options():
            conf["spark.driver.extraJavaOptions"] = driver_java_options()
    return env, conf


def under_spark_submit() -> bool:
    """Whether this process is a driver started by spark-submit (its session comes from there)."""
    return "SPARK_SUBMIT_OPTS" in os.environ or bool(os.environ.get("SPARK_ENV_LOADED"))


def get_spark(app_name: str, master: str | None = None):
    """A SparkSession for ``app_name``.

    Under spark-submit: the session spark-submit set up. Otherwise ``master`` or the
    ``REDELIVERY_SPARK`` setting decides: ``connect`` (default) is the project's warm Spark
    Connect server, started on first use; an ``sc://`` URL is any Spark Connect server; anything
    else (``local[2]``, ``spark://host:7077``) is a classic session with its driver in this
    process. Raises ``SparkConnectError`` when the project's server cannot start."""
    target = master or get_settings().spark
    if not under_spark_submit() and (target == "connect" or target.startswith("sc://")):
        from pyspark.sql.connect.session import SparkSession  # (a classic session may run beside it)

        from redelivery.spark import connect_server

        remote = connect_server.ensure_running() if target == "connect" else target
        return SparkSession.builder.remote(remote).appName(app_name).getOrCreate()
    return classic_session(app_name, None if under_spark_submit() else target)


def classic_session(app_name: str, master: str | None):
    """A classic SparkSession (a JVM driver in this process): the one spark-submit made, or one
    on ``master``."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
        if driver_java_options():  # only when this process starts the driver JVM itself
            builder = builder.config("spark.driver.extraJavaOptions", driver_java_options())
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
    )
    return builder.getOrCreate()


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def functions_for(df):
    """``pyspark.sql.functions`` for ``df``'s kind of session: a process that holds a classic and a
    Spark Connect session at once (tests) must build each one's columns with its own module."""
    if type(df).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect import functions

        return functions
    from pyspark.sql import functions

    return functions
