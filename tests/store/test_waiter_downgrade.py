"""Migration 0023 (waiters hold advisory locks, not a row; issue 42) goes down and up again, and
keeps ``receive_waiters`` for the clients of the version before during a rolling upgrade."""

from __future__ import annotations

import psycopg
import pytest

from redelivery.store import db

pytestmark = pytest.mark.timeout(300)

NOTIFY_ONE = "SELECT redelivery.notify_waiters('{1}', '{NULL}', '{1}')"


def test_the_waiter_functions_read_locks_and_the_rows_again_after_a_downgrade(fresh_url):
    from alembic import command

    db.migrate(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('redelivery.receive_waiters')").fetchone()[0] is not None
        conn.execute(f"LISTEN redelivery_wait_{conn.info.backend_pid}")
        conn.execute("SELECT pg_advisory_lock_shared(-1, 0)")  # the topic's lock: not a waiter of a group
        assert conn.execute(NOTIFY_ONE).fetchone()[0] == 0
        conn.execute("SELECT pg_advisory_lock_shared(-1, 1)")  # a waiter of topic 1, group 1
        assert conn.execute(NOTIFY_ONE).fetchone()[0] == 1
        assert conn.execute("SELECT redelivery.notify_waiters('{1}', '{2}', '{1}')").fetchone()[0] == 0
    command.downgrade(db.alembic_config(fresh_url), "0022")
    with psycopg.connect(fresh_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock_shared(-1, 1)")  # 0022 reads the rows, not the locks
        assert conn.execute(NOTIFY_ONE).fetchone()[0] == 0
        waiter = "INSERT INTO redelivery.receive_waiters VALUES (1, 1, pg_backend_pid(), now() + '1 minute')"
        conn.execute(waiter)
        assert conn.execute(NOTIFY_ONE).fetchone()[0] == 1
    command.upgrade(db.alembic_config(fresh_url), "head")
