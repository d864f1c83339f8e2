"""Process-wide settings, read from environment variables (prefix ``REDELIVERY_``).

=====================  ================================================================
variable               meaning
=====================  ================================================================
REDELIVERY_DATABASE_URL  PostgreSQL URL (``postgresql://user:pw@host:port/db``). Unset: inside
                         Airflow the connection ``redelivery_db`` (``store.db.database_url``);
                         elsewhere the embedded PostgreSQL under ``REDELIVERY_HOME`` (started).
REDELIVERY_HOME          state folder (embedded data directory, Airflow home, demo output).
                         Default: ``~/.redelivery``; the checkout's Makefile sets ``./.redelivery``.
REDELIVERY_CONFIG        YAML file with tiers and policies. Default: none, the defaults of
                         ``redelivery.config.RedeliveryConfig``; the checkout's Makefile sets
                         ``./config/redelivery.yaml``.
REDELIVERY_PG_PORT       TCP port of the embedded PostgreSQL on 127.0.0.1. Default 54329.
REDELIVERY_CONNECT_TIMEOUT Seconds a connection to the state store may take (libpq's
                         ``connect_timeout``, at least 2) before it fails "cannot reach the state
                         store". Default 10; 0: libpq's none (psycopg waits 130 s). A URL's or a
                         connection's own ``connect_timeout`` (or ``PGCONNECT_TIMEOUT``) wins.
REDELIVERY_READ_TIMEOUT  Seconds a statement of a read-only surface (``stats``, the operator page,
                         ``/redelivery/metrics`` and ``redelivery metrics``, the CLI's reads) may run
                         (PostgreSQL's ``statement_timeout``) before it is cancelled and the
                         surface says the state store did not answer. Default 30; 0: none.
REDELIVERY_SPARK         Where Spark jobs run when a caller asks for a session: ``connect`` (default:
                         the project's own Spark Connect server, started on first use),
                         ``sc://host:port/;token=...`` (any Spark Connect server), or a master
                         such as ``local[2]`` (a classic session in this process).
REDELIVERY_SPARK_CONNECT_PORT  Port of the project's Spark Connect server. Default 15002.
REDELIVERY_SPARK_CONNECT_BIND  Address it listens on. Default 127.0.0.1.
REDELIVERY_SPARK_CONNECT_TOKEN Its token. Default: generated once into
                         ``REDELIVERY_HOME/spark-connect/token`` (mode 0600).
REDELIVERY_SPARK_CONNECT_MEMORY Its driver's heap (Spark's ``--driver-memory``: ``512m``, ``4g``).
                         Default 4g; it serves every session, and a heap it runs out of makes it
                         exit (``-XX:+ExitOnOutOfMemoryError``) and start again on next use.
REDELIVERY_SPARK_CONNECT_MASTER The master of the project's Spark Connect server. Default
                         ``local[<cores>,3]``; ``spark://host:7077`` puts its executors on a cluster.
REDELIVERY_SPARK_EXECUTOR_PYTHON The Python of Spark's executors (``spark.pyspark.python``): a
                         path on the workers (``/opt/venv/bin/python``) or in an archive
                         (``./env/bin/python``). Default: none, Spark's own (``PYSPARK_PYTHON``,
                         else ``python3``), except for ``local[...]`` masters: this interpreter.
REDELIVERY_SPARK_ARCHIVES Comma-separated archives Spark unpacks in the executors' working
                         directory (``spark.archives``), e.g. ``/path/env.tar.gz#env``.
REDELIVERY_SPARK_PY_FILES Comma-separated ``.py`` / ``.zip`` files for the executors' path.
REDELIVERY_SPARK_CONF    Extra Spark conf as a JSON object (``{"spark.executor.memory": "2g"}``).
REDELIVERY_SPARK_SHIP_PACKAGE Whether every job ships this redelivery package to its executors
                         (a zip of it, which Spark unpacks as an archive). Default true; false:
                         the executors' own installed redelivery must be the driver's version.
=====================  ================================================================
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="REDELIVERY_", extra="ignore")

    database_url: str | None = None
    home: Path = Path("~/.redelivery").expanduser()
    config: Path | None = None
    pg_port: int = 54329
    connect_timeout: int = Field(10, ge=0)
    read_timeout: float = Field(30.0, ge=0)
    spark: str = "connect"
    spark_connect_port: int = 15002
    spark_connect_bind: str = "127.0.0.1"
    spark_connect_token: str | None = None
    spark_connect_memory: str = Field("4g", pattern=r"^[1-9][0-9]*[mMgG]$")
    spark_connect_master: str | None = None
    spark_executor_python: str | None = None
    spark_archives: str | None = None
    spark_py_files: str | None = None
    spark_conf: dict[str, str | int | float | bool] = Field(default_factory=dict)
    spark_ship_package: bool = True

    @property
    def config_path(self) -> Path | None:
        """``REDELIVERY_CONFIG``, or None: the defaults of ``redelivery.config.RedeliveryConfig``."""
        return self.config


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process (read once from the environment)."""
    return Settings()
