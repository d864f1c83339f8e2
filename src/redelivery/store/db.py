"""Connections to the state store and its schema migrations (Alembic, ``migrations/``)."""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tenacity import (
    Retrying,
    before_sleep_log,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random,
    wait_random_exponential,
)

from redelivery.errors import DatabaseUnavailableError, SchemaNotMigratedError
from redelivery.settings import get_settings
from redelivery.store import embedded
from redelivery.store import statements as S

SCHEMA = "redelivery"
T = TypeVar("T")

#: Inside one of Airflow's processes: how the state store is found there (``inside_airflow``).
_airflow_database_url: Callable[[], str] | None = None
#: Set by Airflow in a task's process before the task runs (its context, exported).
AIRFLOW_TASK_VARIABLE = "AIRFLOW_CTX_DAG_ID"


def inside_airflow(resolve: Callable[[], str] | None) -> None:
    """From now on, in this process, ``database_url()`` without ``REDELIVERY_DATABASE_URL`` is
    ``resolve()`` (a URL, or an error naming what to define), never the embedded PostgreSQL;
    None undoes it. The provider's plugin calls it when Airflow loads it (see ``database_url``);
    the ``redelivery`` command too, with its own search (``redelivery.cli.store``: the Airflow
    connection of the host, else the embedded server)."""
    global _airflow_database_url
    _airflow_database_url = resolve


def database_url() -> str:
    """The application database's libpq URL: ``REDELIVERY_DATABASE_URL``; else, inside Airflow,
    the Airflow connection ``redelivery_db`` (``RedeliveryHook``), which raises
    ``DatabaseUnavailableError`` naming it when it is not defined; else (the CLI, the demo, tests,
    a script on one's own machine) the embedded PostgreSQL, started when it is not running.

    How this module knows it runs inside Airflow without importing Airflow (the ``store`` layer
    sits below it): Airflow says so. It calls each plugin's ``on_load`` when it loads its plugins,
    in every one of its processes that does (the api-server, the scheduler, the dag-processor)
    and in each task's process before the task runs (the task's context brings in the plugins'
    macros), and the provider's plugin registers the connection's lookup here
    (``inside_airflow``). Importing ``redelivery.airflow`` is not enough (a notebook or a test
    may use its assets without running in Airflow), and Airflow's task variables alone are not
    either (the api-server and the triggerer have none, and only Airflow can read a connection
    defined in its UI); they remain a net: a task's process where the plugin did not load raises
    ``DatabaseUnavailableError`` instead of starting a second PostgreSQL in the worker."""
    configured = get_settings().database_url
    if configured:
        return configured
    if _airflow_database_url is not None:
        return _airflow_database_url()
    if os.environ.get(AIRFLOW_TASK_VARIABLE):
        raise DatabaseUnavailableError(
            "inside an Airflow task without the redelivery plugin loaded: set REDELIVERY_DATABASE_URL "
            "in Airflow's environment, or give the Client RedeliveryHook().get_database_url() "
            "(the Airflow connection 'redelivery_db')"
        )
    return embedded.ensure_running()


#: Session settings every connection needs, given to libpq after the user's own (a later ``-c``
#: wins): the schema's search_path, and READ COMMITTED, whose fresh snapshot after a lock wait the
#: statements rely on (a topic delete after waiting for its publishers, re-checks of guarded rows),
#: and UTF8 as the client encoding, which the COPY's text (pgpq writes UTF-8) and a small publish's
#: parameters are sent in, whatever the database's encoding.
SESSION_OPTIONS = (
    rf"-c search_path={SCHEMA},public -c default_transaction_isolation=read\ committed"
    " -c client_encoding=UTF8"
)


def connect(url: str | None = None, **kwargs) -> psycopg.Connection:
    """A psycopg 3 connection to ``url`` (default ``database_url()``) with ``SESSION_OPTIONS``:
    the ``redelivery`` schema first on the search_path, READ COMMITTED whatever the role's or
    database's default. The user's own session options (the URL's ``options``, else libpq's
    ``PGOPTIONS``, e.g. ``-c statement_timeout=30000``) are kept. It waits at most
    ``connect_timeout`` seconds (``connect_timeouts``: the URL's, ``kwargs``', else
    ``REDELIVERY_CONNECT_TIMEOUT``). Raises ``psycopg.Error``: ``psycopg.errors.ConnectionTimeout``
    naming the host, the port and the seconds when the server did not answer in time."""
    url = url or database_url()
    kwargs = {**connect_timeouts(url), **kwargs}
    try:
        return psycopg.connect(url, options=session_options(url), **kwargs)
    except psycopg.errors.ConnectionTimeout as exc:  # psycopg's says neither where nor how long
        raise psycopg.errors.ConnectionTimeout(timed_out(url, kwargs.get("connect_timeout"))) from exc


def connect_timeouts(url: str) -> dict:
    """``{"connect_timeout": seconds}`` of ``REDELIVERY_CONNECT_TIMEOUT`` for a connection to
    ``url``, or ``{}`` when the URL or ``PGCONNECT_TIMEOUT`` gives one, or the setting is 0."""
    seconds = get_settings().connect_timeout
    given = "connect_timeout" in conninfo_to_dict(url) or os.environ.get("PGCONNECT_TIMEOUT")
    return {} if given or not seconds else {"connect_timeout": seconds}


def timed_out(url: str, seconds: int | None) -> str:
    """The one line of a connection to ``url`` that got no answer within ``seconds``."""
    info = conninfo_to_dict(url)
    host = info.get("host") or info.get("hostaddr") or os.environ.get("PGHOST") or "localhost"
    port = info.get("port") or os.environ.get("PGPORT") or "5432"
    seconds = seconds or info.get("connect_timeout") or os.environ.get("PGCONNECT_TIMEOUT")
    return f"{host}:{port} did not answer within {max(2, int(float(seconds or 130)))} s (connect_timeout)"


def read_url(url: str, seconds: float | None = None) -> str:
    """``url`` for a read-only surface (stats, the operator page, the metrics, the CLI's reads):
    each of its statements is cancelled after ``seconds`` (default ``REDELIVERY_READ_TIMEOUT``;
    PostgreSQL's ``statement_timeout``, SQLSTATE 57014, ``psycopg.errors.QueryCanceled``), the
    user's own options kept before it. 0: ``url`` as it is."""
    seconds = get_settings().read_timeout if seconds is None else seconds
    if not seconds:
        return url
    given = conninfo_to_dict(url).get("options") or os.environ.get("PGOPTIONS", "")
    return make_conninfo(url, options=f"{given} -c statement_timeout={round(seconds * 1000)}".strip())


def session_options(url: str) -> str:
    """libpq's ``options`` for ``url``: the user's own (the URL's, else ``PGOPTIONS``; libpq reads
    only one of them, and an ``options`` argument replaces both), then ``SESSION_OPTIONS``."""
    given = conninfo_to_dict(url).get("options") or os.environ.get("PGOPTIONS", "")
    return f"{given} {SESSION_OPTIONS}".strip()


def sqlalchemy_url(url: str) -> str:
    """The same URL for SQLAlchemy with the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


MIGRATIONS = Path(__file__).with_name("migrations")


def head_revision() -> str:
    """The newest migration's revision id (the one no other migration revises), read from the
    files without importing Alembic."""
    revisions, parents = set(), set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        text = path.read_text()
        revisions.update(re.findall(r'^revision = "([^"]+)"', text, re.M))
        parents.update(re.findall(r'^down_revision = "([^"]+)"', text, re.M))
    [head] = revisions - parents
    return head


@functools.cache
def _migration_revisions() -> tuple[frozenset[str], str]:
    """(every revision id of ``migrations/versions``, the head), read once per process."""
    found = set()
    for path in (MIGRATIONS / "versions").glob("*.py"):
        found.update(re.findall(r'^revision = "([^"]+)"', path.read_text(), re.M))
    return frozenset(found), head_revision()


def check_schema(conn: psycopg.Connection) -> None:
    """Raise ``SchemaNotMigratedError`` (one line: the database, its revision, what to run) when
    ``conn``'s database has no redelivery schema or one at an older migration than this version's
    head. It never migrates: a library does not change a production schema behind its caller's
    back (the CLI's commands migrate first, as the user asked them to). A revision this version
    does not know (a newer one, during a rolling upgrade) is let through. Also raised when the
    sequence of message ids hands out cached values (``CACHE`` above 1): consume offsets need a
    topic's ids to grow in commit order. Two queries."""
    where = f"database {conn.info.dbname!r} on {conn.info.host}:{conn.info.port}"
    how = (
        "run `redelivery db upgrade` where this store is configured (REDELIVERY_DATABASE_URL, or on "
        "an Airflow host the connection 'redelivery_db'; or redelivery.store.db.migrate(url))"
    )
    try:
        row = conn.execute(S.SCHEMA_REVISION).fetchone()
    except psycopg.errors.UndefinedTable:  # no schema redelivery, or no alembic_version in it
        if not conn.autocommit:
            conn.rollback()
        row = None
    if row is None:
        raise SchemaNotMigratedError(f"{where} has no redelivery schema (it was never migrated): {how}")
    known, head = _migration_revisions()
    if row[0] != head and row[0] in known:
        raise SchemaNotMigratedError(
            f"{where} has the redelivery schema at revision {row[0]}, but this version needs {head}: {how}"
        )
    cached = conn.execute(S.MESSAGE_ID_CACHE).fetchone()
    if cached is not None and cached[0] > 1:
        raise SchemaNotMigratedError(
            f"{where}: the sequence redelivery.message_ids caches {cached[0]} values per session, so a "
            "topic's message ids would not grow in commit order and consume offsets could pass a message: "
            "run ALTER SEQUENCE redelivery.message_ids CACHE 1"
        )


#: Seconds a migration step waits for a table lock (lock_timeout) before it gives up and lets the
#: writers queued behind its request go on; ``migrate`` then runs the migrations again.
MIGRATION_LOCK_TIMEOUT_SECONDS = 2.0
#: Seconds ``migrate`` keeps trying while a step cannot get its lock (a long transaction holds it)
#: and the schema does not move.
MIGRATION_DEADLINE_SECONDS = 900.0


def alembic_config(url: str):
    """Alembic's configuration for the migrations of ``url`` (imports Alembic: about 1.7 s)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return cfg


def _lock_timed_out(exc: BaseException) -> bool:
    return isinstance(getattr(exc, "orig", exc), psycopg.errors.LockNotAvailable)


def migrate(url: str | None = None, revision: str = "head") -> None:
    """Apply the schema migrations up to ``revision`` (idempotent; concurrent callers are
    serialised by a PostgreSQL advisory lock in ``migrations/env.py``). A schema already at the
    head costs one query: Alembic (about 1.7 s to import) is only loaded to migrate.

    Safe on a live state store: index builds on the big tables run CONCURRENTLY
    (``migrations/online.py``) and every other step waits at most
    ``MIGRATION_LOCK_TIMEOUT_SECONDS`` for a table lock, then the migrations run again after a
    random wait (up to 10 s), until the schema has not moved for ``MIGRATION_DEADLINE_SECONDS``;
    then the lock timeout is raised (``sqlalchemy.exc.OperationalError``: a transaction has held
    the table that long, see ``pg_stat_activity``)."""
    url = url or database_url()
    if revision == "head":
        with connect(url, autocommit=True) as conn:
            try:
                current = conn.execute(S.SCHEMA_REVISION).fetchone()
            except psycopg.errors.UndefinedTable:
                current = None
        if current is not None and current[0] == head_revision():
            return
    from alembic import command

    cfg = alembic_config(url)
    progress = {"revision": None, "since": time.monotonic()}

    def stalled(retry_state) -> bool:
        """Past the deadline since the schema last moved (a long concurrent build is progress)."""
        with connect(url, autocommit=True) as conn:
            current = conn.execute(S.SCHEMA_REVISION).fetchone()
        if current != progress["revision"]:
            progress.update(revision=current, since=time.monotonic())
        return time.monotonic() - progress["since"] > MIGRATION_DEADLINE_SECONDS

    retrying = Retrying(
        retry=retry_if_exception(_lock_timed_out),
        wait=wait_random_exponential(multiplier=0.5, max=10),
        stop=stalled,
        before_sleep=before_sleep_log(logging.getLogger(__name__), logging.WARNING),
        reraise=True,
    )
    for attempt in retrying:
        with attempt:
            command.upgrade(cfg, revision)


#: What ``retry_lock_conflicts`` runs again: a deadlock victim, a serialization failure.
LOCK_CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
#: And, for a receive or a redrive of an ordered subscription, a second head refused by
#: ``deliveries_one_head`` (a concurrent writer of the key committed first).
HEAD_CONFLICTS = (*LOCK_CONFLICTS, psycopg.errors.ExclusionViolation)


def retry_lock_conflicts(
    call: Callable[[], T], attempts: int = 5, conflicts: tuple[type[Exception], ...] = LOCK_CONFLICTS
) -> T:
    """Run ``call`` (one transaction) again when PostgreSQL aborted it as a deadlock victim or for
    a serialization failure (or another of ``conflicts``): it changed nothing, and every statement
    is guarded, so running it again is safe. Raises the last error after ``attempts`` tries."""
    retries = Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_random(0.01, 0.2),
        retry=retry_if_exception_type(conflicts),
        reraise=True,
    )
    for attempt in retries:
        with attempt:
            return call()
    raise AssertionError("unreachable: tenacity re-raises the last error")
