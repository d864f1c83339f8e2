"""Building the SparkSession of a job: local mode by default, any master through spark-submit."""

from __future__ import annotations

import os
import sys

from ..settings import get_settings


def get_spark(app_name: str, master: str | None = None):
    """A SparkSession for ``app_name``. Under spark-submit the master comes from the command line;
    run directly, ``master`` or ``SPARK_MASTER`` or ``local[2]`` is used. The PostgreSQL JDBC
    driver (``REDELIVERY_JDBC_JAR``) is added when it exists."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if "spark.master" not in os.environ.get("SPARK_SUBMIT_OPTS", "") and not os.environ.get("SPARK_ENV_LOADED"):
        builder = builder.master(master or os.environ.get("SPARK_MASTER", "local[2]"))
    jar = get_settings().jdbc_jar
    if jar.exists():
        builder = builder.config("spark.jars", str(jar))
    builder = (builder.config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"]))
    return builder.getOrCreate()
