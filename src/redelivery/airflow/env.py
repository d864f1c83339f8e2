"""The Airflow environment of this project: where AIRFLOW_HOME, the DAGs and Airflow's own
metadata database are (a database ``airflow`` on the same PostgreSQL, separate from the
application's), and the default connections.

``redelivery airflow-env`` prints these as shell ``export`` lines; the Makefile and the tests use
them. Values already set in the environment win, so a real deployment configures Airflow as usual.
The DAGs folder is ``./dags`` of the directory the command runs in (``--dags-folder`` to change);
the plugins folder is ``plugins`` beside it (the checkout's ``plugins/``: its file registers the
plugin only where no entry point does, ``redelivery.airflow.plugin.registered_by_entry_point``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from redelivery.settings import get_settings
from redelivery.spark import connect_server
from redelivery.store import embedded
from redelivery.store.db import sqlalchemy_url

#: Airflow connection naming the application database (redelivery or postgres type;
#: ``hooks.RedeliveryHook``). Inside Airflow it is the state store (REDELIVERY_DATABASE_URL, set
#: explicitly, wins): without either, what needs the state store fails naming the connection.
DB_CONN_ID = "redelivery_db"
#: Airflow connection naming where Spark jobs run: spark_connect type (a Spark Connect server) or
#: spark type (host = a master for spark-submit, e.g. local[2]).
SPARK_CONN_ID = "redelivery_spark"


#: LocalExecutor workers per CPU core: tasks mostly wait on PostgreSQL, Spark or HTTP.
WORKERS_PER_CORE = 4


def local_parallelism() -> int:
    """Task slots for a LocalExecutor on this machine: ``WORKERS_PER_CORE`` per CPU core this
    process may use, at least 8 (8 on 2 cores, where Airflow's default starts 32 processes): the
    four tiers' batched runs and the standing redrives' ticks hold a slot each for their span, and
    the other DAGs need theirs."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(8, WORKERS_PER_CORE * cores)


def airflow_environ(dags_folder: Path | None = None) -> dict[str, str]:
    """Environment variables for running Airflow on this project (defaults only): Airflow's home
    under ``REDELIVERY_HOME``, the DAGs of ``dags_folder`` (default: ``./dags``) and the plugins
    folder beside it (``plugins``), the LocalExecutor, the Spark connection, and ``REDELIVERY_HOME``
    / ``REDELIVERY_CONFIG`` themselves, so that every Airflow process reads the same state store
    and config. Without ``REDELIVERY_DATABASE_URL`` (the embedded server), also Airflow's metadata
    database there and the connection ``redelivery_db`` to its application database
    (``embedded_connection``)."""
    settings = get_settings()
    home = settings.home.resolve()
    venv_bin = str(Path(sys.executable).parent)
    dags = (dags_folder or Path("dags")).resolve()
    values = {
        "AIRFLOW_HOME": str(home / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(dags.parent / "plugins"),
        "REDELIVERY_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # LocalExecutor forks [core] parallelism workers at start (Airflow's default: 32)
        "AIRFLOW__CORE__PARALLELISM": str(local_parallelism()),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # the project's warm Spark Connect server (started on first use); its token is made once
        f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}": json.dumps(
            {
                "conn_type": "spark_connect",
                "host": "localhost",
                "port": settings.spark_connect_port,
                "password": connect_server.token(),
            }
        ),
        "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
    }
    if settings.config_path is not None:
        values["REDELIVERY_CONFIG"] = str(settings.config_path.resolve())
    if not settings.database_url:  # else an external application database: Airflow's metadata lives elsewhere
        # the embedded server's password comes from REDELIVERY_HOME (made on first use, mode 0600);
        # SQLAlchemy's psycopg 3 dialect: redelivery's own driver (psycopg2 is not a dependency)
        values["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = sqlalchemy_url(embedded.url("airflow"))
        # the state store inside Airflow: without this connection a task fails naming it
        values[f"AIRFLOW_CONN_{DB_CONN_ID.upper()}"] = json.dumps(embedded_connection())
    return {k: os.environ.get(k, v) if k != "PATH" else v for k, v in values.items()}


def embedded_connection() -> dict:
    """The connection ``redelivery_db`` (type redelivery) of the embedded server's application
    database, with its password (from REDELIVERY_HOME, made on first use)."""
    return {
        "conn_type": "redelivery",
        "host": "127.0.0.1",
        "port": get_settings().pg_port,
        "login": embedded.SUPERUSER,
        "password": embedded.password(),
        "schema": embedded.APP_DATABASE,
    }


def connection_url(host: str | None, port: int | str | None, login: str | None, password: str | None,
                   schema: str | None, extra: dict | None = None) -> str:  # fmt: skip
    """A libpq connection string for an Airflow connection of type redelivery or postgres, from
    its fields (host, port, login, password, schema = database name, default ``redelivery``); the
    extras that are libpq keywords (``sslmode``, ``connect_timeout``...) are kept, the others left
    out. Imports no Airflow (the CLI reads ``AIRFLOW_CONN_REDELIVERY_DB`` with it)."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    keywords = {option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()}
    kept = {k: str(v) for k, v in (extra or {}).items() if k in keywords}
    return make_conninfo(
        host=host, port=port or 5432, user=login, password=password or None, dbname=schema or "redelivery",
        **kept,
    )  # fmt: skip


def shell_exports(dags_folder: Path | None = None) -> str:
    """``airflow_environ(dags_folder)`` as shell ``export`` lines."""
    import shlex

    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in airflow_environ(dags_folder).items())
