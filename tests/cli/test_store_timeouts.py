"""Time-outs (issue 37.2): against a state store that accepts the connection and never answers,
the CLI prints the promised one line ("cannot reach the state store", exit 1) within its connect
time-out (REDELIVERY_CONNECT_TIMEOUT), where it waited 130 s per attempt; a read that outlasts the
read-only surfaces' statement time-out (REDELIVERY_READ_TIMEOUT) is one line too, naming it.
A tiny socket server plays the hung store; real PostgreSQL with a table lock plays the slow one."""

from __future__ import annotations

import time

import psycopg
import pytest

from helpers import hung_store, run_cli

#: Seconds the hung store's test gives the connect time-out (libpq's least is 2).
CONNECT_TIMEOUT = 2
#: What the command may add to it: Python's start and the command's own imports.
GRACE = 8


@pytest.fixture(scope="module")
def hung():
    with hung_store() as url:
        yield url


@pytest.mark.parametrize(
    "args",
    [["stats"], ["dlq", "count", "--group", "billing"], ["db", "upgrade"], ["metrics"]],
    ids=lambda args: " ".join(args),
)
def test_a_hung_store_is_one_line_within_the_connect_timeout(hung, args):
    started = time.monotonic()
    done = run_cli(
        *args,
        database_url=hung,
        env={"REDELIVERY_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT)},
        timeout=CONNECT_TIMEOUT + GRACE + 20,
    )
    took = time.monotonic() - started
    assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    assert done.stderr.startswith("redelivery: cannot reach the state store") and done.stderr.count("\n") == 1
    assert f"within {CONNECT_TIMEOUT} s" in done.stderr, done.stderr
    assert took < CONNECT_TIMEOUT + GRACE, took


def test_the_metrics_textfile_of_a_hung_store_says_down(hung, tmp_path):
    textfile = tmp_path / "redelivery.prom"
    done = run_cli(
        "metrics", "--textfile", str(textfile), database_url=hung,
        env={"REDELIVERY_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT)}, timeout=CONNECT_TIMEOUT + GRACE + 20,
    )  # fmt: skip
    assert done.returncode == 1 and "redelivery_up 0" in textfile.read_text()


@pytest.mark.parametrize("args", [["stats"], ["dlq", "count", "--group", "billing"], ["metrics"]])
def test_a_read_that_outlasts_the_statement_timeout_is_one_line(clean_db, args):
    """A migration (or anything) holding a table the reads need: the read gives up after
    REDELIVERY_READ_TIMEOUT seconds with one line, where it waited as long as the lock was held."""
    from redelivery.client import Client

    with Client(clean_db) as client:
        client.create_topic("orders")
        client.create_group("billing")
        client.subscribe("billing", "orders")
    with psycopg.connect(clean_db) as holder:
        holder.execute("LOCK redelivery.subscriptions, redelivery.consumer_groups IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        done = run_cli(*args, database_url=clean_db, env={"REDELIVERY_READ_TIMEOUT": "1"}, timeout=60)
        took = time.monotonic() - started
        holder.rollback()
    assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    said = "redelivery: the state store did not answer within its statement time-out: "
    assert done.stderr.startswith(said), done.stderr
    assert done.stderr.count("\n") == 1 and "(REDELIVERY_READ_TIMEOUT=1 s)" in done.stderr, done.stderr
    assert took < 1 + GRACE, took
