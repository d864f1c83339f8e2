"""``RedeliveryHook``: the application database as an Airflow connection.

The connection ``redelivery_db`` (type ``redelivery``, this provider's, or ``postgres``: host, port,
login, password, schema = database name; libpq options such as ``sslmode`` in its extra) names the
database the tasks, the redrive DAG
and the "Dead letters" page use. Without it, ``REDELIVERY_DATABASE_URL`` or the embedded
PostgreSQL is used, as everywhere else in redelivery.
"""

from __future__ import annotations

import psycopg
from airflow.sdk import BaseHook
from psycopg.conninfo import make_conninfo

from redelivery.airflow.env import DB_CONN_ID
from redelivery.store import db


def _libpq_keywords() -> set[str]:
    return {option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()}


class RedeliveryHook(BaseHook):
    """The application database of ``redelivery_conn_id`` (default ``redelivery_db``)."""

    conn_name_attr = "redelivery_conn_id"
    default_conn_name = DB_CONN_ID
    conn_type = "redelivery"
    hook_name = "redelivery (PostgreSQL state store)"

    def __init__(self, redelivery_conn_id: str = DB_CONN_ID, **kwargs) -> None:
        super().__init__(**kwargs)
        self.redelivery_conn_id = redelivery_conn_id

    def get_database_url(self) -> str:
        """A libpq connection string for the connection, or, when it is not defined,
        ``REDELIVERY_DATABASE_URL`` / the embedded PostgreSQL (started if needed). Extras that are
        libpq keywords (``sslmode``, ``sslrootcert``, ``target_session_attrs``...) are kept."""
        from airflow.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.redelivery_conn_id)
        except AirflowNotFoundException:
            return db.database_url()
        return _conninfo(conn)

    async def aget_database_url(self) -> str:
        """``get_database_url`` for code on an event loop (a trigger in the triggerer): the
        connection is read with Airflow's async call, a blocking fallback runs in a thread."""
        import asyncio

        from airflow.exceptions import AirflowNotFoundException

        try:
            conn = await self.aget_connection(self.redelivery_conn_id)
        except AirflowNotFoundException:
            return await asyncio.to_thread(db.database_url)
        return _conninfo(conn)

    def get_conn(self) -> psycopg.Connection:
        """A psycopg connection with ``search_path`` set to the ``redelivery`` schema."""
        return db.connect(self.get_database_url())


def _conninfo(conn) -> str:
    """A libpq connection string for an Airflow connection of type redelivery or postgres."""
    keywords = _libpq_keywords()
    extra = {k: str(v) for k, v in (conn.extra_dejson or {}).items() if k in keywords}
    return make_conninfo(
        host=conn.host,
        port=conn.port or 5432,
        user=conn.login,
        password=conn.password or None,
        dbname=conn.schema or "redelivery",
        **extra,
    )
