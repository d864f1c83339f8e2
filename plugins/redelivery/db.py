"""Connections to the state store and its schema migrations (Alembic, ``migrations/``)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random

from . import embedded
from . import statements as S
from .settings import get_settings

SCHEMA = "redelivery"
T = TypeVar("T")


def database_url() -> str:
    """The application database's libpq URL: ``REDELIVERY_DATABASE_URL``, or the embedded
    PostgreSQL (started when it is not running)."""
    configured = get_settings().database_url
    return configured if configured else embedded.ensure_running()


#: Session settings every connection needs, given to libpq after the user's own (a later ``-c``
#: wins): the schema's search_path, and READ COMMITTED, whose fresh snapshot after a lock wait the
#: statements rely on (a topic delete after waiting for its publishers, re-checks of guarded rows).
SESSION_OPTIONS = rf"-c search_path={SCHEMA},public -c default_transaction_isolation=read\ committed"


def connect(url: str | None = None, **kwargs) -> psycopg.Connection:
    """A psycopg 3 connection to ``url`` (default ``database_url()``) with ``SESSION_OPTIONS``:
    the ``redelivery`` schema first on the search_path, READ COMMITTED whatever the role's or
    database's default. The user's own session options (the URL's ``options``, else libpq's
    ``PGOPTIONS``, e.g. ``-c statement_timeout=30000``) are kept. Raises ``psycopg.Error``."""
    url = url or database_url()
    return psycopg.connect(url, options=session_options(url), **kwargs)


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


def migrate(url: str | None = None, revision: str = "head") -> None:
    """Apply the schema migrations up to ``revision`` (idempotent; concurrent callers are
    serialised by a PostgreSQL advisory lock in ``migrations/env.py``). A schema already at the
    head costs one query: Alembic (about 1.7 s to import) is only loaded to migrate."""
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
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    command.upgrade(cfg, revision)


def empty_state_store(conn: psycopg.Connection) -> None:
    """Delete everything: every table of schema ``redelivery`` emptied (identities restarted), every
    DLQ table dropped. For tests and benchmarks only; nothing in the product calls it."""
    from psycopg import sql

    for (name,) in conn.execute(S.DLQ_NAMES).fetchall():
        conn.execute(S.DROP_DLQ_TABLE.format(table=sql.Identifier("redelivery_dlq", name)))
    tables = [sql.Identifier("redelivery", name) for (name,) in conn.execute(S.STATE_STORE_TABLES)]
    conn.execute(S.TRUNCATE_TABLES.format(tables=sql.SQL(", ").join(tables)))


def retry_lock_conflicts(call: Callable[[], T], attempts: int = 5) -> T:
    """Run ``call`` (one transaction) again when PostgreSQL aborted it as a deadlock victim or for
    a serialization failure: it changed nothing, and every statement is guarded, so running it
    again is safe. Raises the last error after ``attempts`` tries."""
    conflicts = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
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
