"""Building the SparkSession of a job: local mode by default, any master through spark-submit.

Spark's start is most of a small tier run's time (about 11 s here, 6 s of it the driver JVM
loading classes). ``build_cds_archive`` records the classes a driver loads into a JDK class-data
sharing archive under REDELIVERY_HOME once (``make`` set-up does it); drivers started with
``driver_java_options()`` map it instead of loading classes one by one (about 3-4 s less).
``-Xshare:auto``: a missing or stale archive is ignored, never an error.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from ..settings import REPO_ROOT, get_settings


def cds_archive() -> Path:
    """Where the archive of this Spark and Java version lives."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.split('"')
    version = java[1] if len(java) > 1 else "unknown"
    return (
        get_settings().home.resolve() / f"spark-{pyspark.__version__}-java-{version}-{platform.machine()}.jsa"
    )


def driver_java_options() -> str:
    """JVM options for a Spark driver: the class-data sharing archive when it exists."""
    archive = cds_archive()
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto" if archive.exists() else ""


def runs_driver_here(master: str) -> bool:
    """Whether a spark-submit to ``master`` starts its driver on this machine with this Python
    (local mode, or a standalone master in client mode), rather than in a cluster (YARN, Kubernetes)
    whose machines have their own paths."""
    return master.startswith(("local", "spark://"))


def submit_environment(master: str, database_url: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``(env_vars, conf)`` for a spark-submit of one of ``spark_jobs/`` to ``master``: the one
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


def build_cds_archive(force: bool = False) -> Path:
    """Run a small Spark job that exercises what the jobs use and save the driver's loaded classes.
    Returns the archive path. Raises ``subprocess.CalledProcessError`` if spark-submit fails."""
    archive = cds_archive()
    if archive.exists() and not force:
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.unlink(missing_ok=True)
    env_vars, _ = submit_environment("local[2]")
    env = {**os.environ, **env_vars}
    done = subprocess.run(
        [
            "spark-submit",
            "--master",
            "local[2]",
            "--driver-java-options",
            f"-XX:ArchiveClassesAtExit={archive}",
            str(REPO_ROOT / "spark_jobs" / "cds_warmup.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        archive.unlink(missing_ok=True)
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return archive


def get_spark(app_name: str, master: str | None = None):
    """A SparkSession for ``app_name``. Under spark-submit the master comes from the command line;
    run directly, ``master`` or ``SPARK_MASTER`` or ``local[2]`` is used. The PostgreSQL JDBC
    driver (``REDELIVERY_JDBC_JAR``) is added when it exists."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if "SPARK_SUBMIT_OPTS" not in os.environ and not os.environ.get("SPARK_ENV_LOADED"):
        builder = builder.master(master or os.environ.get("SPARK_MASTER", "local[2]"))
        if driver_java_options():  # only when this process starts the driver JVM itself
            builder = builder.config("spark.driver.extraJavaOptions", driver_java_options())
    jar = get_settings().jdbc_jar
    if jar.exists():
        builder = builder.config("spark.jars", str(jar))
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
    )
    return builder.getOrCreate()
