"""Migration 0023 (waiters hold an advisory lock, not a row; issue 42) goes down and up again."""

from __future__ import annotations

import psycopg
import pytest

from redelivery.store import db

pytestmark = pytest.mark.timeout(300)


def test_the_waiter_rows_come_back_with_a_downgrade(fresh_url):
    from alembic import command

    db.migrate(fresh_url)
    command.downgrade(db.alembic_config(fresh_url), "0022")
    with psycopg.connect(fresh_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('redelivery.receive_waiters')").fetchone()[0] is not None
        waiter = "INSERT INTO redelivery.receive_waiters VALUES (1, 1, pg_backend_pid(), now() + '1 minute')"
        conn.execute(waiter)
        conn.execute(f"LISTEN redelivery_wait_{conn.info.backend_pid}")
        assert conn.execute("SELECT redelivery.notify_waiters('{1}', '{NULL}', '{1}')").fetchone()[0] == 1
    command.upgrade(db.alembic_config(fresh_url), "head")
    with psycopg.connect(fresh_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('redelivery.receive_waiters')").fetchone()[0] is None
        conn.execute("SELECT pg_advisory_lock_shared(-1, 1)")  # a waiter of topic 1, group 1
        assert conn.execute("SELECT redelivery.notify_waiters('{1}', '{NULL}', '{1}')").fetchone()[0] == 1
        assert conn.execute("SELECT redelivery.notify_waiters('{1}', '{2}', '{1}')").fetchone()[0] == 0
