"""Process-wide settings, read from environment variables (prefix ``REDELIVERY_``): the field
``spark_conf`` is ``REDELIVERY_SPARK_CONF``. Each field's description says what it does, and a
``default_text`` says the default where the value alone would not (computed, or unset with a
meaning); ``redelivery.reference`` renders them into docs/configuration.md (a test keeps the page
equal to them, so a new setting cannot be left out of it).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="REDELIVERY_", extra="ignore")

    database_url: str | None = Field(
        None,
        description="any PostgreSQL: `postgresql://user:pw@host:5432/db`; session settings in its `options` "
        "(or libpq's `PGOPTIONS`), e.g. `?options=-c%20statement_timeout%3D30000`, are kept; the "
        "`redelivery` schema's search_path and READ COMMITTED are set after them",
        json_schema_extra={
            "default_text": "unset: inside Airflow the connection `redelivery_db` (an error naming it when "
            "it is not defined); elsewhere (the CLI, the demo, a script) the embedded PostgreSQL of "
            "`REDELIVERY_HOME`, started when it is not running"
        },
    )
    home: Path = Field(
        Path("~/.redelivery").expanduser(),
        description="the state folder: the embedded PostgreSQL's data directory and password, Airflow "
        "home, the Spark CDS archive, the Spark Connect server's logs and token, the demo's output",
        json_schema_extra={"default_text": "`~/.redelivery` (the checkout's Makefile sets `./.redelivery`)"},
    )
    config: Path | None = Field(
        None,
        description="the config file (YAML, below): tiers, policies, producer, retention",
        json_schema_extra={
            "default_text": "unset: the defaults of `redelivery.config.RedeliveryConfig` (the checkout's "
            "Makefile sets `./config/redelivery.yaml`)"
        },
    )
    pg_port: int = Field(54329, description="TCP port of the embedded PostgreSQL on 127.0.0.1")
    connect_timeout: int = Field(
        10,
        ge=0,
        description="seconds a connection to the state store may take (libpq's `connect_timeout`, at "
        'least 2) before it fails "cannot reach the state store"; 0: libpq\'s none (psycopg waits 130 s). '
        "A URL's or a connection's own `connect_timeout` (or `PGCONNECT_TIMEOUT`) wins",
    )
    read_timeout: float = Field(
        30.0,
        ge=0,
        description="seconds a statement of a read-only surface (`stats`, the operator page, "
        "`/redelivery/metrics` and `redelivery metrics`, the CLI's reads) may run (PostgreSQL's "
        "`statement_timeout`) before it is cancelled and the surface says the state store did not "
        "answer; 0: none",
    )
    spark: str = Field(
        "connect",
        description="where a caller's Spark session comes from: `connect` (the project's Spark Connect "
        "server, started on first use), `sc://host:port/;token=...` (any Spark Connect server), or a "
        "master such as `local[2]` (a classic session in the process)",
    )
    spark_connect_port: int = Field(15002, description="port of the project's Spark Connect server")
    spark_connect_bind: str = Field("127.0.0.1", description="the address that server listens on")
    spark_connect_token: str | None = Field(
        None,
        description="that server's token",
        json_schema_extra={
            "default_text": "generated once into `REDELIVERY_HOME/spark-connect/token` (mode 0600)"
        },
    )
    spark_connect_memory: str = Field(
        "4g",
        pattern=r"^[1-9][0-9]*[mMgG]$",
        description="that server's driver heap (Spark's `--driver-memory`: `512m`, `4g`); it serves every "
        "session, and out of heap it exits (`-XX:+ExitOnOutOfMemoryError`) rather than hang, and the "
        "next caller starts it again",
    )
    spark_connect_master: str | None = Field(
        None,
        description="the master of the project's Spark Connect server (`spark://host:7077`: its "
        "executors on a cluster)",
        json_schema_extra={"default_text": "`local[<cores>,3]`"},
    )
    spark_executor_python: str | None = Field(
        None,
        description="the Python of Spark's executors (`spark.pyspark.python`): a path on the workers "
        "(`/opt/venv/bin/python`) or in an archive (`./env/bin/python`)",
        json_schema_extra={
            "default_text": "unset: Spark's own (`PYSPARK_PYTHON` of the driver's environment, else "
            "`python3` on the executors' `PATH`); for a `local[...]` master this interpreter"
        },
    )
    spark_archives: str | None = Field(
        None,
        description="comma-separated archives Spark unpacks in the executors' working directory "
        "(`spark.archives`; `hdfs:///envs/redelivery-env.tar.gz#env`: a packed environment)",
    )
    spark_py_files: str | None = Field(
        None, description="comma-separated `.py` / `.zip` files for the executors' path"
    )
    spark_conf: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description='more Spark conf, a JSON object (`{"spark.executor.memory": "2g"}`); it may name a '
        "secret, never hold one (it goes on a command line)",
    )
    spark_ship_package: bool = Field(
        True,
        description="ship the driver's redelivery package with every job (a zip of about 250 KB, which "
        "Spark unpacks as an archive); `false`: the executors' own installed redelivery must be the "
        "driver's version",
    )

    @property
    def config_path(self) -> Path | None:
        """``REDELIVERY_CONFIG``, or None: the defaults of ``redelivery.config.RedeliveryConfig``."""
        return self.config


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings of this process (read once from the environment)."""
    return Settings()
