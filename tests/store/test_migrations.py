"""Schema migrations on a live state store, each test on a database of its own: index builds on
the big tables run CONCURRENTLY (writers go on while they wait for a long transaction), a step
that needs a table's exclusive lock gives up after ``lock_timeout`` and is tried again instead of
queueing every writer behind a long transaction, and a migration killed in the middle of a build
is finished by the next run."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import psycopg
import pytest
from psycopg import sql

from helpers import deadlocks, wait_for_session
from redelivery.store import db

#: Races with migrations: were a lock never granted, fail rather than hang (``migrate`` itself
#: would retry for MIGRATION_DEADLINE_SECONDS).
pytestmark = pytest.mark.timeout(300)


def schema(url: str) -> dict:
    """The ``redelivery`` schema as the catalog describes it: columns, constraints, indexes
    (with validity), types' labels."""
    with db.connect(url) as conn:
        return {
            "columns": conn.execute(
                "SELECT table_name, column_name, data_type, is_nullable, column_default"
                " FROM information_schema.columns WHERE table_schema = 'redelivery'"
                " ORDER BY 1, 2"
            ).fetchall(),
            "constraints": conn.execute(
                "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE connamespace = 'redelivery'::regnamespace ORDER BY 1, 2"
            ).fetchall(),
            "indexes": conn.execute(
                "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisvalid FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relnamespace = 'redelivery'::regnamespace ORDER BY 1"
            ).fetchall(),
            "enums": conn.execute(
                "SELECT t.typname, e.enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid"
                " WHERE t.typnamespace = 'redelivery'::regnamespace ORDER BY 1, e.enumsortorder"
            ).fetchall(),
        }


def revision(url: str) -> str | None:
    with db.connect(url) as conn:
        row = conn.execute("SELECT version_num FROM redelivery.alembic_version").fetchone()
    return row[0] if row else None


def _seed(url: str) -> None:
    with db.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO topics (name) VALUES ('orders')")
        conn.execute("INSERT INTO consumer_groups (name) VALUES ('billing')")
        conn.execute("INSERT INTO subscriptions SELECT t.id, g.id FROM topics t, consumer_groups g")


def _write_one(conn: psycopg.Connection) -> None:
    """What a publish writes: a message and its delivery (the foreign keys of migrations before
    0008 lock the topic and the group rows FOR KEY SHARE, so the tables too, in ROW SHARE mode)."""
    conn.execute(
        "WITH m AS (INSERT INTO messages (topic_id, body, content_type)"
        "           SELECT id, '{}'::bytea, 'application/json' FROM topics RETURNING id, topic_id)"
        " INSERT INTO deliveries (message_id, group_id, topic_id)"
        " SELECT m.id, g.id, m.topic_id FROM m, consumer_groups g"
    )


def _in_thread(work) -> tuple[threading.Thread, list]:
    """``work()`` in a thread: (thread, outcome: ["done"] or the exception it raised)."""
    outcome: list = []

    def run():
        try:
            work()
            outcome.append("done")
        except Exception as exc:  # reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _migrating(url: str, target: str) -> tuple[threading.Thread, list]:
    """``db.migrate`` to ``target`` in a thread."""
    return _in_thread(lambda: db.migrate(url, target))


#: The migration sessions' application_name (``migrations/env.py``, which runs when imported).
MIGRATOR = "redelivery-migrate"
MIGRATION_LOCK = 7_424_001  # and the key of its advisory lock
#: What ``_write_one`` runs, as pg_stat_activity shows it.
WRITER = "query LIKE 'WITH m AS (INSERT INTO messages%'"


def _wait_for_lock_wait(url: str) -> None:
    """Until a migration session waits for a lock (behind the open transaction)."""
    wait_for_session(
        url,
        f"application_name = '{MIGRATOR}' AND wait_event_type = 'Lock'",
        "the migration waiting for the open transaction",
    )


def _migration_waits(url: str) -> bool:
    """Whether a migration session waits for a lock now."""
    with db.connect(url, autocommit=True) as conn:
        return (
            conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = %s AND wait_event_type = 'Lock'",
                (MIGRATOR,),
            ).fetchone()[0]
            == 1
        )


def _writer_gets_through(url: str, lock_timeout_ms: int) -> None:
    """A new publish, committed; raises LockNotAvailable if it waited ``lock_timeout_ms`` for a
    table or row lock (a writer queued behind a lock request that does not give way)."""
    with db.connect(url) as conn:
        conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(lock_timeout_ms)))
        with conn.transaction():
            _write_one(conn)


def _writing(url: str, lock_timeout_ms: int) -> tuple[threading.Thread, list]:
    """``_writer_gets_through`` in a thread: (thread, outcome: ["done"] or the exception)."""
    return _in_thread(lambda: _writer_gets_through(url, lock_timeout_ms))


def _messages(url: str) -> int:
    with db.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM messages").fetchone()[0]


def test_index_builds_do_not_block_writers_while_they_wait(fresh_url):
    """0006 and 0007 build indexes on ``deliveries``. A plain CREATE INDEX (or a DROP INDEX) waits
    for an open writing transaction while holding the queue: every later write waits behind it. A
    CONCURRENTLY build waits for the open transaction without blocking anyone."""
    db.migrate(fresh_url, "0005")
    _seed(fresh_url)
    with db.connect(fresh_url) as open_tx:
        _write_one(open_tx)  # left open: a long publish in flight during the upgrade
        thread, outcome = _migrating(fresh_url, "0007")
        _wait_for_lock_wait(fresh_url)
        for written in (1, 2, 3):  # committed messages (the open publish's is not)
            # never queued behind the build: a lock wait of 1 s fails it
            _writer_gets_through(fresh_url, 1000)
            assert _messages(fresh_url) == written and _migration_waits(fresh_url)
        assert thread.is_alive() and not outcome  # still waiting for the open transaction
        open_tx.commit()
    thread.join(120)
    assert outcome == ["done"]
    indexes = {name: (definition, valid) for name, definition, valid in schema(fresh_url)["indexes"]}
    assert indexes["deliveries_ready_at"][1] and indexes["deliveries_waiting"][1]
    assert "INCLUDE (group_id, topic_id)" in indexes["deliveries_inflight"][0]
    assert not any(name.endswith("_build") for name in indexes)
    assert revision(fresh_url) == "0007"


def test_an_exclusive_step_gives_way_to_writers_and_is_tried_again(fresh_url, caplog):
    """0008 drops foreign keys of ``messages`` and ``deliveries`` (ACCESS EXCLUSIVE locks), which
    an open publish holds in ROW EXCLUSIVE mode. The migration gives up after its lock_timeout,
    lets the writers queued behind it through and tries again until the transaction is gone."""
    caplog.set_level(logging.WARNING, logger="redelivery.store.db")
    db.migrate(fresh_url, "0007")
    _seed(fresh_url)
    with db.connect(fresh_url) as open_tx:
        _write_one(open_tx)
        thread, outcome = _migrating(fresh_url, "0008")
        _wait_for_lock_wait(fresh_url)
        # a writer queues behind the migration's lock request; the open transaction stays open,
        # so the writer gets through only if the migration gives way (else its lock_timeout
        # of 3 s more than the migration's fails it)
        writer, written = _writing(fresh_url, int(db.MIGRATION_LOCK_TIMEOUT_SECONDS * 1000) + 3000)
        wait_for_session(
            fresh_url, f"wait_event_type = 'Lock' AND {WRITER}", "the writer queued behind the migration"
        )
        writer.join(120)
        assert written == ["done"] and _messages(fresh_url) == 1  # the open publish's is not committed
        assert thread.is_alive() and not outcome and revision(fresh_url) == "0007"
        open_tx.commit()
    thread.join(120)
    assert outcome == ["done"]
    assert revision(fresh_url) == "0008"
    # the migration's step really gave up on its lock timeout and was run again
    retries = [r.getMessage() for r in caplog.records if r.name == "redelivery.store.db"]
    assert any("LockNotAvailable" in line and "lock timeout" in line for line in retries), retries


def test_a_migration_killed_during_a_build_is_finished_by_the_next_run(fresh_url):
    """The migrating process dies while its concurrent build waits (the build is left INVALID
    under its temporary name); the next ``migrate`` drops it, builds the index and goes on."""
    db.migrate(fresh_url, "0005")
    _seed(fresh_url)
    with db.connect(fresh_url) as open_tx:
        _write_one(open_tx)
        thread, outcome = _migrating(fresh_url, "0006")
        _wait_for_lock_wait(fresh_url)
        with db.connect(fresh_url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            ).fetchall()
        assert killed == [(True,)]
        thread.join(60)
        assert isinstance(outcome[0], Exception) and revision(fresh_url) == "0005"
        left = {name: valid for name, _, valid in schema(fresh_url)["indexes"]}
        assert left.get("deliveries_ready_at_build") is False and "deliveries_ready_at" not in left
        open_tx.commit()
    db.migrate(
        fresh_url, "0011"
    )  # the last revision of deliveries_ready_at (0012 folds it in deliveries_ready)
    indexes = {name: valid for name, _, valid in schema(fresh_url)["indexes"]}
    assert indexes["deliveries_ready_at"] is True
    assert not any(name.endswith("_build") for name in indexes)
    assert all(indexes.values())
    db.migrate(fresh_url)
    assert revision(fresh_url) == db.head_revision()


def _migrating_process(url: str, env: dict | None = None) -> subprocess.Popen:
    """``migrate`` in a process of its own (Alembic's context is global: one migration a process)."""
    code = "import sys; from redelivery.store.db import migrate; migrate(sys.argv[1])"
    return subprocess.Popen([sys.executable, "-c", code, url], env=env, stderr=subprocess.PIPE, text=True)


def _wait_for_second_migrator(url: str) -> None:
    """Until a second migration session, while the first one holds the migration lock, waits for
    it between two tries holding no snapshot (idle after its COMMIT, no xmin): were it to wait
    inside a statement, the first one's concurrent build (which waits for every older snapshot) and
    it would wait for each other."""
    wait_for_session(
        url,
        f"application_name = '{MIGRATOR}' AND state = 'idle' AND query = 'COMMIT' AND backend_xmin IS NULL"
        " AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
        f" AND l.objid = {MIGRATION_LOCK} AND l.pid <> pg_stat_activity.pid"  # of this database, not
        "   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))",  # a worker's
        "a second migration session waiting for the migration lock between transactions",
    )


def test_two_migrating_processes_while_a_build_waits(fresh_url):
    """A second ``migrate`` (another CLI command, another worker) starting while the first one's
    concurrent build waits: it must wait for the migration lock without holding a snapshot, or the
    build (which, once built, waits for every older snapshot) and it would wait for each other,
    and PostgreSQL would end one of them as a deadlock."""
    db.migrate(fresh_url, "0005")
    _seed(fresh_url)
    before = deadlocks(fresh_url)
    with db.connect(fresh_url) as open_tx:
        _write_one(open_tx)
        first = _migrating_process(fresh_url)
        _wait_for_lock_wait(fresh_url)
        second = _migrating_process(fresh_url)
        _wait_for_second_migrator(fresh_url)
        assert _migration_waits(fresh_url)  # the first one's build still waits for the open publish
        assert first.poll() is None and second.poll() is None  # the build waits for the open publish
        open_tx.commit()
    for process in (first, second):
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    assert revision(fresh_url) == db.head_revision()
    assert deadlocks(fresh_url) == before  # PostgreSQL ended nothing as a deadlock


def test_watermarks_claimed_before_ack_mode_count_as_confirmed(fresh_url):
    """Migration 0009: an asset's watermark from before counts as confirmed, else its first
    trigger in ack mode would fire the whole READY backlog again."""
    db.migrate(fresh_url, "0008")
    with db.connect(fresh_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO asset_watermarks (asset_uri, watermark)"
            " VALUES ('redelivery://orders/billing', now())"
        )
    db.migrate(fresh_url)
    with db.connect(fresh_url) as conn:
        claimed, confirmed = conn.execute("SELECT watermark, confirmed FROM asset_watermarks").fetchone()
    assert confirmed == claimed


def test_a_statement_timeout_of_the_user_does_not_cancel_a_build(fresh_url):
    """``PGOPTIONS=-c statement_timeout=...`` reaches the migration's session too; the concurrent
    build, which waits for the open publish longer than that, is exempt."""
    db.migrate(fresh_url, "0005")
    _seed(fresh_url)
    env = {**os.environ, "PGOPTIONS": "-c statement_timeout=300"}
    with db.connect(fresh_url) as open_tx:
        _write_one(open_tx)
        process = _migrating_process(fresh_url, env)
        # the build's statement waits for the open publish: until it has waited three times the
        # statement_timeout (PostgreSQL's clock, its own query_start), still waiting, not cancelled
        wait_for_session(
            fresh_url,
            f"application_name = '{MIGRATOR}' AND wait_event_type = 'Lock'"
            " AND query LIKE 'CREATE INDEX CONCURRENTLY%'"
            " AND clock_timestamp() - query_start > interval '900 milliseconds'",
            "the build waiting past the statement_timeout",
        )
        assert process.poll() is None
        open_tx.commit()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert revision(fresh_url) == db.head_revision()


def _dlq_indexes(url: str) -> dict:
    """``{DLQ table: sorted (columns, valid, attached to dlq_messages' index) of its indexes}``,
    and the validity of dlq_messages' own indexes under ``"dlq_messages"``."""
    with db.connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname, regexp_replace(pg_get_indexdef(i.indexrelid), '^.* USING btree ', ''),"
            "       i.indisvalid, EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid"
            " WHERE c.relnamespace = 'redelivery_dlq'::regnamespace"
            "    OR c.oid = 'redelivery.dlq_messages'::regclass"
        ).fetchall()
    found: dict = {}
    for table, columns, valid, attached in rows:
        found.setdefault(table, []).append((columns, valid, attached))
    return {table: sorted(indexes) for table, indexes in found.items()}


def test_0011_indexes_every_dead_letter_table_even_with_long_names(fresh_url):
    """Migration 0011 builds the browse and key indexes on each DLQ table made before it, one by
    one, and attaches them: two tables whose names agree in their first 56 characters (a name
    of 63 cannot take a suffix) each get their own, and the parent's indexes end valid."""
    db.migrate(fresh_url, "0010")
    long = "g" * 52  # %DLQ%<52 g>-a / -b: 59 characters, alike in the first 57
    with db.connect(fresh_url, autocommit=True) as conn:
        for n, name in enumerate([f"%DLQ%{long}-a", f"%DLQ%{long}-b", "%DLQ%short"], start=1):
            conn.execute("INSERT INTO dead_letter_queues (name) OVERRIDING SYSTEM VALUE VALUES (%s)", (name,))
            conn.execute(
                sql.SQL("CREATE TABLE {} PARTITION OF redelivery.dlq_messages FOR VALUES IN ({})").format(
                    sql.Identifier("redelivery_dlq", name), sql.Literal(n)
                )
            )
    db.migrate(fresh_url, "0011")  # 0012 (the log) has no way down
    browse = ("(group_id, dead_lettered_at, message_id)", True, True)
    key = ("(group_id, key, dead_lettered_at, message_id)", True, True)
    delivery = ("(message_id, group_id)", True, True)
    indexes = _dlq_indexes(fresh_url)
    for name in (f"%DLQ%{long}-a", f"%DLQ%{long}-b", "%DLQ%short"):
        assert browse in indexes[name] and key in indexes[name], (name, indexes[name])
        assert all(valid and attached for _, valid, attached in indexes[name]), indexes[name]
        assert ("(group_id, dead_lettered_at)", True, True) not in indexes[name]  # dlq_messages_group
    assert {i for i in indexes["dlq_messages"] if i[0] != "(dlq_id, group_id, message_id)"} >= {
        (browse[0], True, False),
        (key[0], True, False),
        (delivery[0], True, False),
    }
    assert all(valid for _, valid, _ in indexes["dlq_messages"]), indexes["dlq_messages"]
    db.migrate(fresh_url, "0010")  # down and up again: the same indexes
    db.migrate(fresh_url, "0011")
    assert _dlq_indexes(fresh_url) == indexes
