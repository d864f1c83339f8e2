"""Building the SparkSession of a job: the warm Spark Connect server by default, a classic
session on any master, or what spark-submit set up; and the environment of a spark-submit. Every
session gets what ``redelivery.spark.deploy`` says its executors need."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from redelivery.settings import get_settings
from redelivery.spark import deploy
from redelivery.spark.jvm import driver_java_options


def driver_here(master: str, deploy_mode: str | None = None) -> bool:
    """Whether a spark-submit to ``master`` in ``deploy_mode`` (``client``, the default of
    spark-submit and of the Spark provider, or ``cluster``) starts its driver on this machine, with
    this Python. Raises ``ValueError`` (one line) for a mode Spark would refuse for a Python job:
    anything but client or cluster, cluster mode on a local master or a standalone one (Spark runs
    a Python driver in the cluster on YARN and Kubernetes only)."""
    if deploy_mode not in (None, "", "client", "cluster"):
        raise ValueError(f"deploy-mode must be client or cluster, got {deploy_mode!r}")
    if deploy_mode != "cluster":
        return True
    if master.startswith(("local", "spark://")):
        raise ValueError(
            f"deploy-mode cluster cannot run a Python job on master {master}: Spark runs a Python "
            "driver in the cluster on YARN and Kubernetes only; use deploy-mode client (the default)"
        )
    return False


def submit_environment(
    master: str,
    database_url: str | None = None,
    deployment: deploy.Deployment | None = None,
    deploy_mode: str | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """``(env, conf)`` for a spark-submit of one of ``redelivery/jobs/`` to ``master`` in
    ``deploy_mode`` (None: client): the one place that says what every submit needs (its py-files
    and archives: ``deploy.submit_files``). Raises ``ValueError`` as ``driver_here`` does.

    A driver here (client mode, any master: ``driver_here``): ``env`` is spark-submit's own process
    environment, never a command line (the Spark provider turns ``env_vars`` into ``--conf
    spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` arguments on YARN and
    Kubernetes, so the caller passes it to the process itself): ``REDELIVERY_DATABASE_URL`` whole
    (its tasks get it from the driver, inside the task), a ``PATH`` that finds this environment's
    ``spark-submit``, ``PYSPARK_PYTHON`` for a local master. ``conf``: the driver on this
    interpreter (``spark.pyspark.driver.python``, with the class-data sharing archive when it
    exists), the executors on theirs (``spark.pyspark.python``: ``deploy.executor_python``).

    A driver in the cluster (cluster mode on YARN, Kubernetes): ``env`` is the driver's environment
    there, which the provider puts on spark-submit's command line: ``REDELIVERY_DATABASE_URL``
    without its password (the cluster gives it to every node, e.g. ``PGPASSWORD`` from a secret,
    docs/spark-clusters.md). ``conf``: ``spark.pyspark.python`` for the executors and the
    driver both (spark-submit's ``PythonRunner`` takes it for the driver when no driver Python is
    set), nothing of this machine.

    Both: no UI, the UTC session time zone, then the deployment's conf."""
    deployment = deployment or deploy.deployment()
    here = driver_here(master, deploy_mode)
    env: dict[str, str] = {}
    conf = {"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"}
    if database_url:
        env["REDELIVERY_DATABASE_URL"] = database_url if here else _no_password(database_url)
    python = deploy.executor_python(master, deployment)
    if python:
        conf["spark.pyspark.python"] = python
    if here:
        if deploy.is_local(master):
            env["PYSPARK_PYTHON"] = python
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
        conf["spark.pyspark.driver.python"] = sys.executable
        if driver_java_options():
            conf["spark.driver.extraJavaOptions"] = driver_java_options()
    return env, {**conf, **deployment.conf}


def _no_password(url: str) -> str:
    """``url`` without its password (as libpq ``key=value`` text), or unchanged when it has none."""
    params = conninfo_to_dict(url)
    if params.pop("password", None) is None:
        return url
    return make_conninfo("", **params)


def under_spark_submit() -> bool:
    """Whether this process is a driver started by spark-submit (its session comes from there)."""
    return "SPARK_SUBMIT_OPTS" in os.environ or bool(os.environ.get("SPARK_ENV_LOADED"))


def get_spark(app_name: str, master: str | None = None):
    """A SparkSession for ``app_name``, its executors given what ``redelivery.spark.deploy`` says.

    Under spark-submit: the session spark-submit set up. Otherwise ``master`` or the
    ``REDELIVERY_SPARK`` setting decides: ``connect`` (default) is the project's warm Spark
    Connect server, started on first use; an ``sc://`` URL is any Spark Connect server; anything
    else (``local[2]``, ``spark://host:7077``) is a classic session with its driver in this
    process. Raises ``SparkConnectError`` when the project's server cannot start."""
    target = master or get_settings().spark
    deployment = deploy.deployment()
    if not under_spark_submit() and (target == "connect" or target.startswith("sc://")):
        from pyspark.sql.connect.session import SparkSession  # (a classic session may run beside it)

        from redelivery.spark import connect_server

        remote = connect_server.ensure_running() if target == "connect" else target
        builder = SparkSession.builder.remote(remote).appName(app_name)
        for key, value in deploy.connect_conf(deployment).items():
            builder = builder.config(key, value)
        spark = builder.create()  # (getOrCreate would hand back a session of this process on any server)
    else:
        spark = classic_session(app_name, None if under_spark_submit() else target, deployment)
    deploy.ship(spark, deployment)
    return spark


def classic_session(app_name: str, master: str | None, deployment: deploy.Deployment | None = None):
    """A classic SparkSession (a JVM driver in this process): the one spark-submit made, or one
    on ``master``, its executors on ``deploy.executor_python`` (this interpreter for a local
    master; none given: Spark's own, ``PYSPARK_PYTHON`` else ``python3``), with the deployment's
    archives and conf. The package's zip is added by ``deploy.ship`` (``get_spark`` does it)."""
    from pyspark.sql import SparkSession

    deployment = deployment or deploy.deployment()
    builder = SparkSession.builder.appName(app_name)
    python = None
    if master is not None:
        builder = builder.master(master)
        python = deploy.executor_python(master, deployment)
        if driver_java_options():  # only when this process starts the driver JVM itself
            builder = builder.config("spark.driver.extraJavaOptions", driver_java_options())
        if deployment.archives:
            builder = builder.config("spark.archives", ",".join(deployment.archives))
        if python:
            builder = builder.config("spark.pyspark.python", python)
        for key, value in deployment.conf.items():
            builder = builder.config(key, value)
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    with _pyspark_python(python):  # what a SparkContext reads, once, when it starts
        return builder.getOrCreate()


@contextmanager
def _pyspark_python(python: str | None):
    """``PYSPARK_PYTHON`` set to ``python`` meanwhile (None: left as it is)."""
    before = os.environ.get("PYSPARK_PYTHON")
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = python
    try:
        yield
    finally:
        if python is not None:
            if before is None:
                os.environ.pop("PYSPARK_PYTHON", None)
            else:
                os.environ["PYSPARK_PYTHON"] = before


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def local_checkpoint(df):
    """``df.localCheckpoint(eager=True)``, on ``df``'s own session: pyspark's Connect client binds
    the checkpoint it gets back to the thread's active session
    (``conversion.proto_to_remote_cached_dataframe``), which in a process holding sessions on two
    servers may be the other one's (the plan then names a DataFrame that server never had)."""
    if not is_connect(df):
        return df.localCheckpoint(eager=True)
    from pyspark.sql.connect.session import SparkSession

    holder = SparkSession._active_session  # thread-local
    before = getattr(holder, "session", None)
    holder.session = df.sparkSession
    try:
        return df.localCheckpoint(eager=True)
    finally:
        holder.session = before


def functions_for(df):
    """``pyspark.sql.functions`` for ``df``'s kind of session: a process that holds a classic and a
    Spark Connect session at once (tests) must build each one's columns with its own module."""
    if type(df).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect import functions

        return functions
    from pyspark.sql import functions

    return functions
