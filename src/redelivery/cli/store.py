"""Which state store the ``redelivery`` command uses, and why: one store wherever you stand.

In this order (``find``): ``REDELIVERY_DATABASE_URL``; else the Airflow connection
``redelivery_db`` of this host, read from ``AIRFLOW_CONN_REDELIVERY_DB`` (its JSON form without
importing Airflow) or, where Airflow is installed and configured (``airflow_configured``), by
Airflow itself (its secrets backends and its database); else, where no store is configured at all,
the embedded PostgreSQL of ``REDELIVERY_HOME``, started when it is not running, saying so on
stderr when its data directory is new (a new, empty store is never made silently). An Airflow
whose connection cannot be read raises ``DatabaseUnavailableError``: which store is meant cannot
be known, so none is started. A connection naming this home's own embedded server (what
``redelivery airflow-env`` exports) starts it as the embedded one would be.

``use`` makes it ``redelivery.store.db.database_url``'s answer for the command's process, found
once; ``--verbose`` (the ``redelivery`` command's own option) prints which store and why, one line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from psycopg.conninfo import conninfo_to_dict

from redelivery.airflow.env import DB_CONN_ID, connection_url
from redelivery.cli.common import app
from redelivery.errors import DatabaseUnavailableError
from redelivery.settings import get_settings
from redelivery.store import db, embedded

#: The environment variable of the connection ``redelivery_db``, as Airflow reads it.
CONN_VARIABLE = f"AIRFLOW_CONN_{DB_CONN_ID.upper()}"
CONNECTION = f"the Airflow connection {DB_CONN_ID!r}"


@dataclass(frozen=True)
class Store:
    """A state store and why it is the one: ``url`` (libpq; None: the embedded server, not
    started), ``source`` (``"REDELIVERY_DATABASE_URL"``, ``CONNECTION``, ``"the embedded
    PostgreSQL"``), ``why`` (where it was found), ``new`` (an embedded data directory just made)."""

    url: str | None
    source: str
    why: str
    new: bool = False

    @property
    def shown(self) -> str:
        """The URL with its password masked."""
        return masked(self.url) if self.url else embedded.masked_url()

    def line(self) -> str:
        return f"state store {self.shown}: {self.source} ({self.why})"

    def fix(self) -> str:
        """Where to fix it, for a state store that cannot serve."""
        if self.source == CONNECTION:
            return f"check {CONNECTION}: {self.why}"
        if self.source == "REDELIVERY_DATABASE_URL":
            return "check REDELIVERY_DATABASE_URL"
        return f"the embedded PostgreSQL: its password is in {embedded.password_file()}"


def masked(url: str) -> str:
    """``postgresql://user:***@host:port/database`` of a libpq URL or connection string."""
    info = conninfo_to_dict(url)
    login = info.get("user", "") + (":***" if info.get("password") else "")
    where = f"{info.get('host', '')}" + (f":{info['port']}" if info.get("port") else "")
    return f"postgresql://{login}{'@' if login else ''}{where}/{info.get('dbname', '')}"


def airflow_configured() -> str | None:
    """Where this host's Airflow is configured (``AIRFLOW_HOME``, a metadata database in the
    environment, or ``~/airflow/airflow.cfg``) when Airflow is installed; else None."""
    if importlib.util.find_spec("airflow") is None:
        return None
    if os.environ.get("AIRFLOW_HOME"):
        return f"AIRFLOW_HOME={os.environ['AIRFLOW_HOME']}"
    if os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        return "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
    default = Path("~/airflow/airflow.cfg").expanduser()
    return str(default) if default.exists() else None


def airflow_connection() -> tuple[dict, str] | None:
    """The fields of the connection ``redelivery_db`` (host, port, login, password, schema,
    extra) and where they were found; None when this host defines none. Raises
    ``DatabaseUnavailableError`` when the variable is not a connection or Airflow cannot read it."""
    raw = os.environ.get(CONN_VARIABLE, "")
    if raw.lstrip().startswith("{"):  # Airflow's JSON form: its fields as they are
        try:
            fields = json.loads(raw)
            extra = fields.get("extra") or {}
            fields["extra"] = json.loads(extra) if isinstance(extra, str) else extra
        except (ValueError, AttributeError) as exc:
            raise DatabaseUnavailableError(f"{CONN_VARIABLE} is not a connection's JSON: {exc}") from None
        return fields, f"{CONN_VARIABLE} in the environment"
    where = airflow_configured()
    if not raw and where is None:
        return None
    try:  # the URI form, the secrets backends, the metadata database: each as Airflow reads it
        with contextlib.redirect_stdout(sys.stderr):  # Airflow's log lines: never a command's output
            from airflow.configuration import ensure_secrets_loaded

            # Airflow's own lookup logs a backend that fails and goes on: "not defined", and a new store
            found = (backend.get_connection(conn_id=DB_CONN_ID) for backend in ensure_secrets_loaded())
            conn = next(filter(None, found), None)
    except Exception as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:300]  # no SQLAlchemy help
        raise DatabaseUnavailableError(
            f"Airflow is configured on this host ({where}) but {CONNECTION} cannot be read from it "
            f"({reason}): fix Airflow's configuration, or set REDELIVERY_DATABASE_URL to the state store"
        ) from None
    if conn is None:
        return None
    fields = {"host": conn.host, "port": conn.port, "login": conn.login, "password": conn.password,
              "schema": conn.schema, "extra": conn.extra_dejson}  # fmt: skip
    return (
        fields,
        f"{CONN_VARIABLE} in the environment" if raw else f"Airflow's database or secrets ({where})",
    )


def _this_homes_server(fields: dict) -> bool:
    """Whether the connection names this REDELIVERY_HOME's embedded server (its port, its user and
    the password of its password file, which is never made here)."""
    file = embedded.password_file()
    return (
        fields.get("host") in ("127.0.0.1", "localhost")
        and str(fields.get("port")) == str(get_settings().pg_port)
        and fields.get("login") == embedded.SUPERUSER
        and file.exists()
        and fields.get("password") == file.read_text().strip()
    )


def find(start: bool = True) -> Store:
    """The state store of this process (the module's order); ``start``: start the embedded server
    when it is the one (else its ``url`` is None). Raises ``DatabaseUnavailableError``."""
    if get_settings().database_url:
        return Store(
            get_settings().database_url, "REDELIVERY_DATABASE_URL", "set in the environment: it wins"
        )
    found = airflow_connection()
    if found is not None:
        fields, why = found
        if _this_homes_server(fields):
            url = embedded.ensure_running() if start else None
            return Store(url, CONNECTION, f"{why}: this REDELIVERY_HOME's embedded PostgreSQL")
        url = connection_url(**{k: fields.get(k) for k in ("host", "port", "login", "password", "schema")},
                             extra=fields.get("extra"))  # fmt: skip
        return Store(url, CONNECTION, why)
    home = get_settings().home
    why = f"no REDELIVERY_DATABASE_URL, no Airflow connection {DB_CONN_ID!r} here; REDELIVERY_HOME={home}"
    if not start:
        return Store(None, "the embedded PostgreSQL", why)
    new = embedded.is_new()
    return Store(embedded.ensure_running(), "the embedded PostgreSQL", why, new=new)


_verbose = False


def tell(store: Store) -> None:
    """With ``--verbose``: which state store, and why (one line on stderr)."""
    if _verbose:
        typer.echo(f"redelivery: {store.line()}", err=True)


@functools.cache
def _found() -> Store:
    store = find()
    if store.new:  # never silently: where a store was meant to be configured, this one is empty
        typer.echo(
            f"redelivery: no state store is configured here ({store.why}): made a new, empty embedded "
            f"PostgreSQL in {embedded.data_directory()}",
            err=True,
        )
    tell(store)
    return store


def found() -> Store | None:
    """The store this process found (None before, or when finding it failed)."""
    return _found() if _found.cache_info().currsize else None


def use() -> None:
    """From now on, in this process, ``db.database_url()`` is the store ``find`` finds, once."""
    db.inside_airflow(lambda: _found().url)


@app.callback()
def options(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="say which state store is used, and why (stderr)")
    ] = False,
) -> None:
    """Batch retry and dead-letter queues for data pipelines."""
    global _verbose
    _verbose = verbose
    if get_settings().database_url:  # db.database_url answers it without asking ``use``'s search
        tell(find())
