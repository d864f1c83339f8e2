"""The store's tests: a database of their own for the migration tests."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql


@pytest.fixture()
def fresh_url(database_url):
    """An empty database on the test server (named after the test database, so that two test
    databases on one server never share it), dropped afterwards."""
    parts = urlsplit(database_url)
    admin = parts._replace(path="/postgres").geturl()
    fresh = f"{parts.path.lstrip('/')}_migrations"[:63]

    def drop(conn):
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(fresh)))

    with psycopg.connect(admin, autocommit=True) as conn:
        drop(conn)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(fresh)))
    yield parts._replace(path=f"/{fresh}").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        drop(conn)
