"""``ReadyMessagesTrigger`` after a password rotation (issue 28.3): the asset watcher kept the
database URL it read at its start and tried the old password forever. A trigger polls as a role of
its own; the role's password is changed (ALTER ROLE) and its session ended, and so is the Airflow
connection ``redelivery_db`` (its environment variable); the same trigger, never re-created, is
refused with the old password, reads its connection again and fires for the next messages. Real
PostgreSQL, a real Airflow connection, the trigger run with asyncio as the triggerer runs it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from helpers import TriggerWatch

pytestmark = pytest.mark.airflow

POLL = 0.1


@pytest.fixture()
def role(database_url):
    """A login role of the test's own (superuser: it reads and writes what the trigger does), its
    name and first password; dropped at the end."""
    name, password = f"watcher_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(sql.Identifier(name), password)
        )
    yield name, password
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture()
def connection_only(database_url, monkeypatch):
    """No REDELIVERY_DATABASE_URL (it would win over the connection) for the test's duration."""
    from redelivery.settings import get_settings

    monkeypatch.delenv("REDELIVERY_DATABASE_URL")
    get_settings.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    get_settings.cache_clear()


def define_connection(monkeypatch, database_url: str, login: str, password: str) -> None:
    """The Airflow connection ``redelivery_db`` (its environment variable) as ``login``."""
    info = conninfo_to_dict(database_url)
    fields = {"host": info["host"], "port": int(info["port"]), "schema": info["dbname"]}
    value = {"conn_type": "redelivery", **fields, "login": login, "password": password}
    monkeypatch.setenv("AIRFLOW_CONN_REDELIVERY_DB", json.dumps(value))


def test_a_rotated_password_is_read_again_from_the_connection(
    client, topic_group, database_url, role, connection_only
):
    from redelivery.airflow import triggers
    from redelivery.airflow.triggers import ReadyMessagesTrigger

    monkeypatch = connection_only
    name, first = role
    second = uuid.uuid4().hex
    define_connection(monkeypatch, database_url, name, first)
    attempts = []  # (password, connected) of each of the trigger's connections
    connect = triggers.connect

    async def connect_noted(url, **kwargs):
        password = conninfo_to_dict(url)["password"]
        try:
            conn = await connect(url, **kwargs)
        except psycopg.OperationalError:
            attempts.append((password, False))
            raise
        attempts.append((password, True))
        return conn

    monkeypatch.setattr(triggers, "connect", connect_noted)

    async def scenario():
        trigger = ReadyMessagesTrigger(topic="orders", group="billing", poll_interval=POLL, settle_timeout=2)
        async with TriggerWatch(trigger) as watch:
            await asyncio.to_thread(client.publish, "orders", [{"n": 1}, {"n": 2}])
            await watch.until(1)
            with psycopg.connect(database_url, autocommit=True) as admin:  # the rotation
                admin.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(name), second))
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
                )
            deadline = time.monotonic() + 20
            while (first, False) not in attempts:  # refused with the password it knew
                assert time.monotonic() < deadline, attempts
                await asyncio.sleep(0.05)
            define_connection(monkeypatch, database_url, name, second)  # the connection follows
            await asyncio.to_thread(client.publish, "orders", [{"n": 3}, {"n": 4}, {"n": 5}])
            await watch.until(2, timeout=20)  # the reconnects after the refusal back off
            return watch.events

    events = asyncio.run(scenario())
    assert [e["ready"] for e in events] == [2, 3]
    assert attempts[0] == (first, True) and attempts[-1] == (second, True)


def test_a_missing_connection_is_one_line_per_back_off_and_the_watcher_waits_for_it(
    client, topic_group, database_url, connection_only, capfd
):
    """Issue 37.4: without the connection the watcher failed at once, and the triggerer made it
    again every 2 s with a stack (700 KB of log in 5 minutes). Now it stays, says one line naming
    the connection at each attempt, the waits doubling, and fires once the connection exists."""
    from redelivery.airflow.triggers import ReadyMessagesTrigger

    monkeypatch = connection_only
    monkeypatch.delenv("AIRFLOW_CONN_REDELIVERY_DB", raising=False)
    info = conninfo_to_dict(database_url)
    capfd.readouterr()

    async def scenario():
        trigger = ReadyMessagesTrigger(topic="orders", group="billing", poll_interval=POLL, settle_timeout=2)
        async with TriggerWatch(trigger) as watch:
            await asyncio.sleep(3)  # attempts 0.1, 0.2, 0.4, 0.8, 1.6 s apart
            assert not watch.task.done(), watch.task.exception()
            logged = "".join(capfd.readouterr())  # the trigger's log, as the triggerer writes it
            define_connection(monkeypatch, database_url, info["user"], info["password"])
            await asyncio.to_thread(client.publish, "orders", [{"n": 1}])
            await watch.until(1, timeout=20)
            return logged, watch.events

    logged, events = asyncio.run(scenario())
    assert [e["ready"] for e in events] == [1]
    said = [line for line in logged.splitlines() if "redelivery_db" in line]
    assert 3 <= len(said) <= 6, logged  # once per back-off, not every poll
    assert "Traceback" not in logged, logged
    for line in said:
        assert "warning" in line and "the Airflow connection 'redelivery_db' is not defined" in line, line
    waits = [float(line.rsplit("trying again in ", 1)[1].split()[0]) for line in said]
    assert waits == sorted(waits) and waits[-1] >= 4 * waits[0], waits
