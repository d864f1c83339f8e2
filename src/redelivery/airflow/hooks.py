"""``RedeliveryHook``: the application database as an Airflow connection.

The connection ``redelivery_db`` (type ``redelivery``, this provider's, or ``postgres``: host, port,
login, password, schema = database name; libpq options such as ``sslmode`` in its extra) names the
database the tasks, the triggers, the redrive DAG and the "Dead letters" page use, and a
``Client()`` made in a task (``airflow_database_url``, registered by the plugin:
``redelivery.store.db.database_url``). ``REDELIVERY_DATABASE_URL``, when set explicitly in
Airflow's environment, wins over it (a harness, a test, one process pointed elsewhere). Without
either, the hook raises ``DatabaseUnavailableError`` naming the connection and how to define it:
inside Airflow the embedded PostgreSQL is never started (it would be a second, empty database in a
worker).
"""

from __future__ import annotations

import json

import psycopg
from airflow.sdk import BaseHook

from redelivery.airflow.env import DB_CONN_ID, connection_url
from redelivery.errors import DatabaseUnavailableError
from redelivery.settings import get_settings
from redelivery.store import db

#: The connection's shape, as the missing-connection error shows it.
EXAMPLE = {"conn_type": "redelivery", "host": "<host>", "port": 5432, "login": "<user>",
           "password": "<password>", "schema": "redelivery"}  # fmt: skip


def missing_connection(conn_id: str) -> str:
    """The one line of a connection that is not defined: which, and how to define it."""
    return (
        f"the Airflow connection {conn_id!r} is not defined: it names the redelivery state store "
        f"(PostgreSQL); define it in Airflow's environment, AIRFLOW_CONN_{conn_id.upper()}="
        f"'{json.dumps(EXAMPLE)}', or in the UI (Admin > Connections, type redelivery)"
        + (", or set REDELIVERY_DATABASE_URL" if conn_id == DB_CONN_ID else "")
    )


class RedeliveryHook(BaseHook):
    """The application database (the state store) of an Airflow connection, for tasks, triggers and
    the page: ``get_conn`` (a psycopg connection, checked: one line naming the connection and the
    fix when it cannot be had), ``get_ready_url``, ``test_connection`` (the form's Test button).

    :param redelivery_conn_id: the connection (type ``redelivery`` or ``postgres``; default
        ``redelivery_db``, for which ``REDELIVERY_DATABASE_URL`` wins when set).
    """

    conn_name_attr = "redelivery_conn_id"
    default_conn_name = DB_CONN_ID
    conn_type = "redelivery"
    hook_name = "redelivery (PostgreSQL state store)"

    def __init__(self, redelivery_conn_id: str = DB_CONN_ID, **kwargs) -> None:
        super().__init__(**kwargs)
        self.redelivery_conn_id = redelivery_conn_id

    def _explicit(self) -> str | None:
        """``REDELIVERY_DATABASE_URL`` for the default connection id, when set."""
        if self.redelivery_conn_id != DB_CONN_ID:
            return None
        return get_settings().database_url or None

    @property
    def source(self) -> str:
        """Where the URL comes from, for a message saying where to fix it:
        ``"REDELIVERY_DATABASE_URL"`` or ``"the Airflow connection '<id>'"``."""
        if self._explicit():
            return "REDELIVERY_DATABASE_URL"
        return f"the Airflow connection {self.redelivery_conn_id!r}"

    def get_database_url(self) -> str:
        """A libpq connection string: ``REDELIVERY_DATABASE_URL`` when set (default connection id
        only), else the connection's. Extras that are libpq keywords (``sslmode``,
        ``sslrootcert``, ``target_session_attrs``...) are kept. Raises
        ``DatabaseUnavailableError`` (``missing_connection``) when the connection is not defined."""
        from airflow.exceptions import AirflowNotFoundException

        explicit = self._explicit()
        if explicit:
            return explicit
        try:
            conn = self.get_connection(self.redelivery_conn_id)
        except AirflowNotFoundException:
            raise DatabaseUnavailableError(missing_connection(self.redelivery_conn_id)) from None
        return _conninfo(conn)

    async def aget_database_url(self) -> str:
        """``get_database_url`` for code on an event loop (a trigger in the triggerer): the
        connection is read with Airflow's async call. Raises as ``get_database_url``."""
        from airflow.exceptions import AirflowNotFoundException

        explicit = self._explicit()
        if explicit:
            return explicit
        try:
            conn = await self.aget_connection(self.redelivery_conn_id)
        except AirflowNotFoundException:
            raise DatabaseUnavailableError(missing_connection(self.redelivery_conn_id)) from None
        return _conninfo(conn)

    def get_conn(self) -> psycopg.Connection:
        """A psycopg connection with ``search_path`` set to the ``redelivery`` schema, to a state
        store migrated to this version (``get_ready_url``), for a task. Raises as
        ``get_ready_url``."""
        return db.connect(self.get_ready_url())

    def get_ready_url(self) -> str:
        """``get_database_url()``, once the state store answered, took the login and showed the
        schema this version needs (``db.check_schema``; checked once per process and URL): a
        task's first step, before anything changes. Raises, one line naming the connection and
        the fix (``store_problem``): ``AirflowFailException`` for a configuration error, which no
        retry mends (the connection missing, the login refused, no such database, never migrated
        or at an older revision); ``AirflowException`` for a store that cannot be reached (Airflow
        retries the task)."""
        try:
            url = self.get_database_url()
            if url not in _READY:
                with db.connect(url) as conn:
                    db.check_schema(conn)
                _READY.add(url)
            return url
        except Exception as exc:
            found = store_problem(exc, self)
            if found is None:
                raise
            from airflow.exceptions import AirflowException, AirflowFailException

            line, configuration = found
            raise (AirflowFailException if configuration else AirflowException)(line) from None

    def test_connection(self) -> tuple[bool, str]:
        """The connection form's Test button (Airflow calls it with the form's fields as a
        connection): ``(True, what answered)`` when the state store answers, takes the login and
        is migrated to this version's head, else ``(False, what is wrong)``, one line each."""
        try:
            url = self.get_database_url()
            with db.connect(url) as conn:
                db.check_schema(conn)
                where = f"{conn.info.host}:{conn.info.port}, database {conn.info.dbname!r}"
        except Exception as exc:
            found = store_problem(exc, self)
            return False, found[0] if found else " ".join(str(exc).split())
        return True, f"the state store at {where} answers, migrated to {db.head_revision()} (this version's)"


#: URLs whose state store this process found migrated (``RedeliveryHook.get_ready_url``).
_READY: set[str] = set()
#: What to check for each problem of ``metrics.unavailable`` (by its first words).
_CHECK = {
    "cannot reach": "its host and port, and that the server runs",
    "authentication failed": "its login and password",
    "database ": "its schema, the database's name",
}


def store_problem(exc: BaseException, hook: RedeliveryHook) -> tuple[str, bool] | None:
    """``(line, configuration error)`` for a state store that cannot serve (``metrics.unavailable``
    of ``exc``): one line naming where the store is defined (the connection, or
    REDELIVERY_DATABASE_URL) and what to check or run; configuration error: no retry can mend it
    (all but a store that cannot be reached or did not answer in time). None for another error."""
    from redelivery.metrics import STATEMENT_TIMED_OUT, unavailable

    problem = unavailable(getattr(exc, "orig", None) or exc)
    if problem is None:
        return None
    transient = problem.startswith(("cannot reach", STATEMENT_TIMED_OUT))
    if isinstance(exc, DatabaseUnavailableError):  # the connection missing: its line names it
        return problem, True
    check = next((c for start, c in _CHECK.items() if problem.startswith(start)), None)
    if hook.source == "REDELIVERY_DATABASE_URL":
        where = "REDELIVERY_DATABASE_URL in Airflow's environment"
    else:
        where = f"{hook.source}: Admin > Connections, or AIRFLOW_CONN_{hook.redelivery_conn_id.upper()}"
    fix = f"check {check} in {where}" if check else where
    return f"{problem} ({fix})", not transient


def airflow_database_url() -> str:
    """The state store inside Airflow: ``RedeliveryHook().get_ready_url()`` (what the plugin
    registers as ``redelivery.store.db.database_url``'s answer in Airflow's processes: a
    ``Client()`` in a task). Raises as ``get_ready_url``."""
    return RedeliveryHook().get_ready_url()


def _conninfo(conn) -> str:
    """A libpq connection string for an Airflow connection of type redelivery or postgres
    (``airflow.env.connection_url`` of its fields)."""
    return connection_url(conn.host, conn.port, conn.login, conn.password, conn.schema, conn.extra_dejson)
