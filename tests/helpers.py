"""Helpers shared by the tests (tests never import each other or conftest)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

#: The checkout (tests read its README, docs, dags/ and config/).
REPO_ROOT = Path(__file__).resolve().parents[1]
#: A fixed past instant: tests drive the clock explicitly (``at=``) and windows must not be in the future.
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
#: The installed ``redelivery`` command.
CLI = shutil.which("redelivery") or os.path.join(os.path.dirname(os.sys.executable), "redelivery")
#: The checkout's uv (the Makefile installs it into the virtual environment).
UV = os.path.join(os.path.dirname(os.sys.executable), "uv")


def uv_install(*args: str) -> None:
    """``uv pip install *args`` into a test's own environment: from uv's cache alone when it holds
    everything (``--offline``), else from the index. PyPI has PySpark only as a source archive, and
    each online install keeps a new ~2 GB build of it in uv's cache; ``prune_uv_cache`` removes the
    older ones at the end of the run."""
    install = [UV, "pip", "install", "--quiet", *args]
    if subprocess.run([*install, "--offline"], capture_output=True).returncode == 0:
        return
    done = subprocess.run(install, capture_output=True, text=True)
    assert done.returncode == 0, f"uv pip install failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"


def remove_unless_a_test_failed(request, where: Path, failed_before: int) -> None:
    """At a module fixture's end, remove its folder (virtual environments, Spark work folders: the
    biggest a run makes), unless a test failed meanwhile: a failed test's folders are kept to
    read, as pytest keeps them (``tmp_path_retention_policy``)."""
    if request.session.testsfailed == failed_before:
        shutil.rmtree(where, ignore_errors=True)


def prune_uv_cache() -> None:
    """What the test run's online installs left in uv's cache and nothing uses any more (a CI disk
    filled up with PySpark builds). A failure here is not the tests': no uv (a venv made by pip),
    or another uv holding the cache's lock past the time-out."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run([UV, "cache", "prune", "--quiet"], capture_output=True, timeout=120)


def docs_page(name: str) -> str:
    """The text of the page ``docs/<name>`` (README's sections moved there: README is a front door)."""
    return (REPO_ROOT / "docs" / name).read_text()


def configured(client, *entries, broker="rocketmq"):
    """``client`` with a config of these policy entries and a fast producer retry."""
    from redelivery.config import RedeliveryConfig

    client.config = RedeliveryConfig.model_validate(
        {
            "tiers": [t.model_dump() for t in client.config.tiers],
            "broker": broker,
            "policies": list(entries),
            "producer": {"initial_backoff": 0.01, "max_backoff": 0.05, "attempts": 3},
        }
    )
    return client.config  # the client's policies are resolved again from it


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


#: A message's state for a group in the log layout: its delivery row (READY, INFLIGHT,
#: WAITING_RETRY), its dead letter (DLQ), or neither: COMMITTED at or below the group's consume
#: offset, READY (never delivered) past it. Counts and history come from the row or the dead letter;
#: a COMMITTED message keeps none (NULL).
_MESSAGE_STATE = """
    SELECT coalesce(d.state::text, CASE WHEN q.message_id IS NOT NULL THEN 'DLQ'
                                        WHEN m.id > s.consume_offset THEN 'READY'
                                        ELSE 'COMMITTED' END) AS state,
           coalesce(d.delivery_count, q.delivery_count, CASE WHEN m.id > s.consume_offset THEN 0 END)
               AS delivery_count,
           coalesce(d.reconsume_times, q.reconsume_times, CASE WHEN m.id > s.consume_offset THEN 0 END)
               AS reconsume_times,
           d.delay_level, d.due_at, coalesce(d.last_error, q.last_error) AS last_error,
           coalesce(d.redrive_count, q.redrive_count) AS redrive_count,
           coalesce(d.attempts, q.attempts) AS attempts, d.ready_at, d.invisible_until,
           coalesce(d.first_failure_at, q.first_failure_at) AS first_failure_at,
           coalesce(d.last_failure_at, q.last_failure_at) AS last_failure_at
    FROM redelivery.messages m
    JOIN redelivery.subscriptions s ON s.topic_id = m.topic_id
    JOIN redelivery.consumer_groups g ON g.id = s.group_id
    LEFT JOIN redelivery.deliveries d ON d.topic_id = m.topic_id AND d.group_id = g.id AND d.message_id = m.id
    LEFT JOIN redelivery.dlq_messages q ON q.group_id = g.id AND q.message_id = m.id
    WHERE m.id = %(message_id)s AND g.name = %(group)s"""


def message_state(conn, message_id: int, group: str = "billing") -> dict | None:
    """``message_id``'s state for ``group`` (``_MESSAGE_STATE``) as a dict: state, delivery_count,
    reconsume_times, delay_level, due_at, last_error, redrive_count, attempts, ready_at,
    invisible_until, first_failure_at, last_failure_at; None when the group has no subscription to
    its topic or the log no longer holds it."""
    from psycopg.rows import dict_row

    with conn.cursor(row_factory=dict_row) as cursor:
        return cursor.execute(_MESSAGE_STATE, {"message_id": message_id, "group": group}).fetchone()


def reset(conn) -> None:
    """Empty every table of the state store and drop the DLQ tables."""
    from redelivery.store.maintenance import empty_state_store

    empty_state_store(conn)


#: Every table holding rows in the state store's schemas, found in the catalog (a table a migration
#: adds is never forgotten): the ``redelivery`` schema's tables and partitions and the DLQ tables of
#: ``redelivery_dlq``, each with what it is a partition of and for which values, so that a DLQ table
#: made, dropped, attached or detached changes the snapshot too. A partitioned table holds no rows
#: of its own: its rows are read from its partitions.
_SNAPSHOT_TABLES = """
    SELECT n.nspname, c.relname,
           coalesce(' (partition of ' || p.inhparent::regclass::text
                    || ' ' || pg_get_expr(c.relpartbound, c.oid) || ')', '')
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_inherits p ON p.inhrelid = c.oid
    WHERE n.nspname = ANY(%(schemas)s) AND c.relkind = 'r'
    ORDER BY 1, 2"""


def snapshot(conn, leave_out: tuple[str, ...] = ()) -> dict:
    """Every row of every table of the state store (``_SNAPSHOT_TABLES``), to assert that a call
    changed nothing: ``{table: rows}``, each table's rows in the order of their text form, so that
    two snapshots are equal exactly when no row was added, removed or changed and no table appeared
    or went. ``leave_out``: tables (``"redelivery.redrive_runs"``) a test checks by itself, e.g. the
    audit row a dry run writes by design. One consistent view of the database (a REPEATABLE READ
    transaction, unless ``conn`` is in one already); ``conn`` is left as it was."""
    from psycopg import pq, sql

    from redelivery.store.catalog import DLQ_SCHEMA
    from redelivery.store.db import SCHEMA
    from redelivery.store.log import LOG_SCHEMA

    tables: dict = {}

    def read() -> None:
        named = conn.execute(_SNAPSHOT_TABLES, {"schemas": [SCHEMA, DLQ_SCHEMA, LOG_SCHEMA]}).fetchall()
        assert (SCHEMA, "deliveries", "") in named, f"no state store tables found: {named}"
        for schema, table, partition in named:
            if f"{schema}.{table}" in leave_out:
                continue
            query = sql.SQL('SELECT * FROM ONLY {} AS r ORDER BY r::text COLLATE "C"').format(
                sql.Identifier(schema, table)
            )
            tables[f"{schema}.{table}{partition}"] = conn.execute(query).fetchall()

    if conn.info.transaction_status == pq.TransactionStatus.IDLE:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            read()
    else:
        read()
    return tables


def _poll(url: str, query: str, done, what: str, timeout: float):
    """``query``'s first value on ``url``'s database, read again every 20 ms until ``done(value)``;
    fails naming ``what`` after ``timeout`` seconds (a test's own limit on waiting, never a
    measurement)."""
    import time

    from redelivery.store import db

    deadline = time.monotonic() + timeout
    with db.connect(url, autocommit=True) as conn:
        while True:
            conn.execute("SELECT pg_stat_clear_snapshot()")  # fresh statistics on each read
            value = conn.execute(query).fetchone()[0]
            if done(value):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} never happened within {timeout} s (last value: {value})")
            time.sleep(0.02)


def wait_for_session(url: str, condition: str, what: str, timeout: float = 60.0) -> None:
    """Until another session of ``url``'s database matches ``condition`` (SQL on
    ``pg_stat_activity``, e.g. ``"wait_event_type = 'Lock'"``): how a test knows that the other
    side of a race is where it should be, instead of sleeping. Fails naming ``what`` after
    ``timeout`` seconds."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND " + condition
    )
    _poll(url, query, bool, what, timeout)


def waiting_for_a_lock(statement: str) -> str:
    """A ``wait_for_session`` condition: a session runs the named statement of
    ``redelivery.store.statements`` (``"ACK"``: its text starts ``/* redelivery:ACK */``) and waits for a
    lock (a row or a table another transaction holds)."""
    return f"wait_event_type = 'Lock' AND query LIKE '/* redelivery:{statement} */%'"


#: Deadlocks PostgreSQL detected in the current database (each aborted one transaction).
_DEADLOCKS = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"


def deadlocks(url: str) -> int:
    """How many deadlocks PostgreSQL has detected in ``url``'s database so far
    (``pg_stat_database.deadlocks``, as the statistics system has it now)."""
    return _poll(url, _DEADLOCKS, lambda _: True, "reading pg_stat_database", 10.0)


def wait_for_deadlocks(url: str, at_least: int, what: str, timeout: float = 60.0) -> int:
    """Until ``pg_stat_database.deadlocks`` of ``url``'s database reaches ``at_least`` (a backend
    reports its counts when it is next idle, within about a second, or when it ends); returns it."""
    return _poll(url, _DEADLOCKS, lambda n: n >= at_least, what, timeout)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run_cli(
    *args: str, database_url: str, stdin: str | None = None, env: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """The ``redelivery`` command as a user runs it, against ``database_url``."""
    return subprocess.run(
        [CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "REDELIVERY_DATABASE_URL": database_url, **(env or {})},
    )


@contextlib.contextmanager
def hung_store():
    """A state store that hangs (issue 37.2): a TCP listener on 127.0.0.1 that accepts every
    connection and never answers (not even PostgreSQL's SSL request). Yields its libpq URL; every
    connection it took is closed at the end."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    taken: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                taken.append(listener.accept()[0])
            except OSError:  # closed: the end
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"postgresql://u:p@127.0.0.1:{listener.getsockname()[1]}/redelivery"
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux)
        listener.close()
        for conn in taken:
            conn.close()


def page_state(client, url) -> None:
    """The state the operator page's tests chart (topic orders with group billing exists).
    payments -> audit: 4 messages nacked at 1 s (due 11 s) promoted by the seconds tier's window
    ending at 13 s (2 s late each), nacked again at 21 s (level 2, due 51 s) and promoted by the
    window ending at 56 s (5 s late), then a window ending at 60 s that promotes nothing.
    orders -> billing: 30 messages received at 100 s: 10 rejected, 6 nacked (level 1), 4 retried
    after 60 s (level 3), 3 acked, 7 left in flight; then 5 more published (READY)."""
    from redelivery.tiers.run import TierRunRequest, run_tier

    client.create_topic("payments")
    client.create_group("audit")
    client.subscribe("audit", "payments")
    client.publish("payments", [{"n": i} for i in range(4)], at=at(0))
    client.nack("audit", client.receive("audit", "payments", 4, 30, at=at(0)), error="timeout", at=at(1))
    assert run_tier(TierRunRequest(tier="seconds", window_end=at(13), run_key="t1"), url=url)["promoted"] == 4
    client.nack("audit", client.receive("audit", "payments", 4, 30, at=at(20)), error="timeout", at=at(21))
    assert run_tier(TierRunRequest(tier="seconds", window_end=at(56), run_key="t2"), url=url)["promoted"] == 4
    assert run_tier(TierRunRequest(tier="seconds", window_end=at(60), run_key="t3"), url=url)["promoted"] == 0
    client.publish("orders", [{"n": i} for i in range(30)], at=at(100))
    got = client.receive("billing", "orders", 30, 30, at=at(100))
    client.reject("billing", got[:10], error="schema violation", at=at(101))
    client.nack("billing", got[10:16], error="boom", at=at(101))
    client.reconsume_later("billing", got[16:20], delay=60, at=at(101))
    client.ack("billing", got[20:23])
    client.publish("orders", [{"n": i} for i in range(5)], at=at(102))


def overlapping_tier_runs(url: str, window_end: datetime, runs: int = 3) -> list[dict]:
    """The summaries of ``runs`` tier runs of the seconds tier for the same window, started at once
    in threads (4 ranges each); raises the first error any of them raised."""
    from redelivery.config import cached_config
    from redelivery.tiers.run import TierRunRequest, run_tier

    config, results, errors = cached_config(), [], []

    def run(name):
        try:
            request = TierRunRequest(tier="seconds", window_end=window_end, run_key=name)
            results.append(run_tier(request, url=url, config=config, max_partitions=4))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"overlap-{i}",)) for i in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


class TriggerWatch:
    """Runs a trigger in the background of the test's event loop and keeps its events' payloads."""

    def __init__(self, trigger):
        self.trigger, self.events, self.task = trigger, [], None
        self.expected_errors: tuple[type[BaseException], ...] = ()  # the trigger may end with these

    async def __aenter__(self) -> TriggerWatch:
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for event in self.trigger.run():
            self.events.append(event.payload)

    async def until(self, count: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events) < count:
            assert not self.task.done(), self.task.exception()
            assert time.monotonic() < deadline, f"{len(self.events)} events, waited for {count}"
            await asyncio.sleep(0.02)

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, *self.expected_errors):
            await self.task
