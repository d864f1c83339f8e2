"""Redrive of dead letters: filters, dry run, batches and rate, audit, repeat and retry safety,
another destination, Spark for large selections, the CLI, and the dlq_redrive DAG (dag.test)."""

import json
import threading
from datetime import timedelta

import pytest

from helpers import at, snapshot
from redelivery.dead_letters import DlqFilter, count, select, summary
from redelivery.errors import RedeliveryError, UnknownGroupError, UnknownTopicError
from redelivery.redrive import RedriveRequest, redrive


def states(client):
    return {t: g["billing"] for t, g in client.stats().items() if "billing" in g}


def test_filters_are_values(dead):
    conn = dead.conn
    assert count(conn, DlqFilter(group="billing")) == 40
    assert count(conn, DlqFilter(group="billing", topic="refunds")) == 10
    assert count(conn, DlqFilter(group="billing", reasons=["REJECTED"])) == 30
    assert count(conn, DlqFilter(group="billing", error_contains="timeout")) == 10  # case-insensitive
    assert count(conn, DlqFilter(group="billing", error_contains="%")) == 0  # text, not a LIKE pattern
    assert count(conn, DlqFilter(group="billing", error_contains="'; DROP TABLE messages; --")) == 0
    assert count(conn, DlqFilter(group="billing", dead_lettered_from=at(50))) == 10
    assert count(conn, DlqFilter(group="billing", dead_lettered_to=at(50))) == 30
    assert count(conn, DlqFilter(group="billing", message_ids=[1, 2, 999])) == 2
    with pytest.raises(UnknownGroupError):
        count(conn, DlqFilter(group="nobody"))
    with pytest.raises(UnknownTopicError):
        count(conn, DlqFilter(group="billing", topic="nope"))
    [row] = select(conn, DlqFilter(group="billing", message_ids=[31]), with_body=True)
    assert (
        row["body"] == {"r": 0}
        and row["dead_letter_queue"] == "%DLQ%billing"
        and row["attempts"][-1]["outcome"] == "nack"
    )


def test_summary_per_group(dead):
    [item] = summary(dead.conn)
    assert item["group"] == "billing" and item["count"] == 40
    assert item["top_reasons"] == [
        {"value": "REJECTED", "count": 30},
        {"value": "MAX_DELIVERIES_EXCEEDED", "count": 10},
    ]
    assert item["top_errors"][0] == {"value": "schema v2 missing field", "count": 30}


def test_dry_run_changes_nothing_and_samples(dead, database_url):
    # a dry run changes nothing but its own audit row (redrive_runs, by design: checked below)
    before = snapshot(dead.conn, leave_out=("redelivery.redrive_runs",))
    result = redrive(
        RedriveRequest(group="billing", topic="refunds"),
        run_key="dry-1",
        url=database_url,
        log=lambda *_: None,
    )
    assert (
        result["dry_run"] and result["matched"] == 10 and result["moved"] == 0 and len(result["sample"]) == 10
    )
    assert snapshot(dead.conn, leave_out=("redelivery.redrive_runs",)) == before
    assert dead.conn.execute(
        "SELECT run_key, dry_run, status, matched, moved FROM redrive_runs"
    ).fetchall() == [("dry-1", True, "success", 10, 0)]
    audit = dead.conn.execute(
        "SELECT dry_run, status, matched, moved FROM redrive_runs WHERE run_key = 'dry-1'"
    ).fetchone()
    assert audit == (True, "success", 10, 0)


def test_real_run_moves_in_batches_restores_the_retry_budget_and_audits(dead, database_url):
    result = redrive(
        RedriveRequest(group="billing", reasons=["MAX_DELIVERIES_EXCEEDED"], dry_run=False),
        run_key="real-1",
        triggered_by="ops@example",
        url=database_url,
        log=lambda *_: None,
    )
    assert (result["status"], result["matched"], result["moved"], result["triggered_by"]) == (
        "success",
        10,
        10,
        "ops@example",
    )
    assert states(dead)["refunds"]["READY"] == 10 and states(dead)["refunds"]["DLQ"] == 0
    got = dead.receive("billing", "refunds", 20, 30)
    # the retry budget is back (reconsume times 0); the delivery count goes on from 1, never reset
    assert len(got) == 10 and {(m.delivery_count, m.reconsume_times, m.redrive_count) for m in got} == {
        (2, 0, 1)
    }
    moves = dead.conn.execute(
        "SELECT count(*) FROM redrive_moves m JOIN redrive_runs r ON r.id = m.run_id "
        "WHERE r.run_key = 'real-1'"
    ).fetchone()[0]
    assert moves == 10
    # the same run again, or a new run with the same filter: nothing moves twice
    assert (
        redrive(
            RedriveRequest(group="billing", reasons=["MAX_DELIVERIES_EXCEEDED"], dry_run=False),
            run_key="real-1",
            url=database_url,
            log=lambda *_: None,
        )["moved"]
        == 10
    )
    again = redrive(
        RedriveRequest(group="billing", reasons=["MAX_DELIVERIES_EXCEEDED"], dry_run=False),
        run_key="real-2",
        url=database_url,
        log=lambda *_: None,
    )
    assert (again["matched"], again["moved"]) == (0, 0)


#: How early a batch may seem to move against the slot PostgreSQL's clock gave it: the wait is a
#: client sleep (never shorter than asked), between two clocks of one machine.
CLOCKS = timedelta(milliseconds=10)


def slot_ends(url: str, run_key: str) -> tuple[list, object]:
    """(a list, a ``log`` for ``redrive``) that records, after each batch the run logs, where the
    run's schedule stands (``redrive_runs.next_slot_at``: the end of the share that batch reserved;
    the next batch's slot starts there or later)."""
    from redelivery.store import db

    ends = []

    def log(line: str) -> None:
        if line.startswith("  batch: moved"):
            with db.connect(url) as conn:
                query = "SELECT next_slot_at FROM redrive_runs WHERE run_key = %s"
                ends.append(conn.execute(query, (run_key,)).fetchone()[0])

    return ends, log


def paced_batches(conn, run_key: str, rate: float) -> list[int]:
    """The sizes of a paced run's batches (its moves grouped by their transaction's time), after
    checking the schedule the run recorded, as a slow machine cannot break it: a batch never moves
    before the run's start plus the share (messages / ``rate``) of the batches moved before it, and
    the run's schedule (``next_slot_at``) reaches at least its start plus every moved message's
    share."""
    started, next_slot = conn.execute(
        "SELECT started_at, next_slot_at FROM redrive_runs WHERE run_key = %s", (run_key,)
    ).fetchone()
    batches = conn.execute(
        """SELECT m.moved_at, count(*) FROM redrive_moves m JOIN redrive_runs r ON r.id = m.run_id
           WHERE r.run_key = %s GROUP BY 1 ORDER BY 1""",
        (run_key,),
    ).fetchall()
    moved = 0
    for moved_at, n in batches:
        assert moved_at >= started + timedelta(seconds=moved / rate) - CLOCKS, (moved_at, started, moved)
        moved += n
    assert next_slot >= started + timedelta(seconds=moved / rate), (next_slot, started, moved)
    return [n for _, n in batches]


def assert_slots_kept(conn, run_key: str, rate: float, ends: list) -> None:
    """Each batch of a run (``ends``: ``slot_ends``) reserved its own share after the previous
    one's (no two batches in one slot) and moved no earlier than the end of the previous one's."""
    batches = conn.execute(
        """SELECT m.moved_at, count(*) FROM redrive_moves m JOIN redrive_runs r ON r.id = m.run_id
           WHERE r.run_key = %s GROUP BY 1 ORDER BY 1""",
        (run_key,),
    ).fetchall()
    assert len(ends) == len(batches), (ends, batches)
    for k in range(1, len(batches)):
        moved_at, n = batches[k]
        assert ends[k] - ends[k - 1] >= timedelta(seconds=n / rate), (ends, k, n)
        assert moved_at >= ends[k - 1] - CLOCKS, (moved_at, ends, k)


def test_keep_counts_max_messages_and_rate_limit(dead, database_url):
    ends, log = slot_ends(database_url, "rate")
    result = redrive(
        RedriveRequest(
            group="billing",
            topic="orders",
            max_messages=12,
            rate_limit=10,
            reset_reconsume_times=False,
            dry_run=False,
        ),
        run_key="rate",
        url=database_url,
        log=log,
    )
    assert (
        result["moved"] == 12
        and states(dead)["orders"]["READY"] == 12
        and states(dead)["orders"]["DLQ"] == 18
    )
    # 12 messages at 10/s: a batch of 10, then the last 2 no earlier than 1 s after the run began
    # (the schedule the run recorded, not a measured time)
    assert paced_batches(dead.conn, "rate", 10) == [10, 2]
    assert_slots_kept(dead.conn, "rate", 10, ends)
    assert {m.delivery_count for m in dead.receive("billing", "orders", 50, 30)} == {
        2
    }  # kept, +1 for this delivery


def test_stop_between_batches_leaves_every_message_in_one_place(dead, database_url):
    calls = []
    result = redrive(
        RedriveRequest(group="billing", topic="orders", rate_limit=10, dry_run=False),
        run_key="stop",
        url=database_url,
        log=lambda *_: None,
        should_stop=lambda: calls.append(1) or len(calls) > 1,  # stop after the first batch
    )
    assert (result["status"], result["moved"], len(calls)) == ("stopped", 10, 2)
    stats = states(dead)["orders"]
    assert stats["READY"] + stats["DLQ"] == 30 and stats["DLQ"] == 20
    assert (
        dead.conn.execute("SELECT count(*) FROM dlq_messages").fetchone()[0] == 30
    )  # 20 orders + 10 refunds


def test_two_overlapping_runs_move_each_message_once(dead, database_url):
    results = []
    threads = [
        threading.Thread(
            target=lambda k=k: results.append(
                redrive(
                    RedriveRequest(group="billing", rate_limit=None, dry_run=False),
                    run_key=f"overlap-{k}",
                    url=database_url,
                    log=lambda *_: None,
                )
            )
        )
        for k in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r["moved"] for r in results) == 40
    assert dead.conn.execute(
        "SELECT count(DISTINCT (group_id, message_id)), count(*) FROM redrive_moves"
    ).fetchone() == (40, 40)


def test_redrive_to_another_topic_publishes_a_copy_and_closes_the_original(dead, database_url):
    dead.create_topic("orders-retry")
    dead.create_group("repair")
    dead.subscribe("repair", "orders-retry")
    result = redrive(
        RedriveRequest(
            group="billing", topic="orders", destination_topic="orders-retry", max_messages=5, dry_run=False
        ),
        run_key="dest",
        url=database_url,
        log=lambda *_: None,
    )
    assert result["moved"] == 5
    assert states(dead)["orders"]["COMMITTED"] == 5 and states(dead)["orders"]["DLQ"] == 25
    copies = dead.receive("repair", "orders-retry", 10, 30)
    assert len(copies) == 5 and {m.origin_message_id for m in copies} <= set(range(1, 31))
    dead.create_topic("nowhere")
    with pytest.raises(RedeliveryError, match="no subscribed group"):
        redrive(
            RedriveRequest(group="billing", destination_topic="nowhere", dry_run=False),
            run_key="x",
            url=database_url,
            log=lambda *_: None,
        )


def test_bad_requests_are_refused_before_anything_moves(dead, database_url):
    before = snapshot(dead.conn)
    for bad in (
        {"group": ""},
        {"group": "billing", "rate_limit": -1},
        {"group": "billing", "max_messages": 0},
        {"group": "billing", "reasons": ["SOMETIMES"]},
        {"group": "billing", "colour": "red"},
    ):
        with pytest.raises(ValueError):
            RedriveRequest(**bad)
    with pytest.raises(UnknownGroupError):
        redrive(RedriveRequest(group="nobody", dry_run=False), run_key="bad", url=database_url)
    assert snapshot(dead.conn) == before


def test_large_redrive_through_spark(client, topic_group, database_url, any_spark):
    client.publish("orders", [{"n": i} for i in range(3000)])
    client.reject("billing", client.receive("billing", "orders", 3000, 30), error="bulk")
    result = redrive(
        RedriveRequest(group="billing", rate_limit=None, dry_run=False),
        run_key="spark",
        url=database_url,
        spark=any_spark,
        spark_threshold=1000,
        log=lambda *_: None,
    )
    assert result["moved"] == 3000 and client.stats()["orders"]["billing"]["READY"] == 3000


def test_cli_redrive_dry_run_by_default_then_execute(dead, clean_db):
    import os
    import subprocess

    from helpers import CLI

    env = {**os.environ, "REDELIVERY_DATABASE_URL": clean_db}
    dry = subprocess.run(
        [CLI, "redrive", "--group", "billing", "--reasons", "REJECTED", "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["matched"] == 30 and states(dead)["orders"]["DLQ"] == 30
    done = subprocess.run(
        [
            CLI,
            "redrive",
            "--group",
            "billing",
            "--reasons",
            "REJECTED",
            "--no-dry-run",
            "--rate-limit",
            "100000",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert json.loads(done.stdout)["moved"] == 30 and states(dead)["orders"]["READY"] == 30
    counted = subprocess.run(
        [CLI, "dlq", "count", "--group", "billing", "--json"], capture_output=True, text=True, env=env
    )
    assert json.loads(counted.stdout) == {"group": "billing", "count": 10}
    bad = subprocess.run(
        [CLI, "redrive", "--group", "billing", "--reasons", "SOMETIMES"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert bad.returncode == 2 and "reasons" in bad.stderr


@pytest.mark.airflow
def test_dlq_redrive_dag_dry_run_then_real(dead, dagbag):
    assert dagbag.import_errors == {}
    dag = dagbag.get_dag("dlq_redrive")
    assert dag.schedule is None or str(dag.timetable.summary) in ("None", "null")
    assert {"redelivery", "dlq"} <= set(dag.tags)
    run = dag.test(run_conf={"group": "billing", "topic": "refunds"})
    assert str(run.state).endswith("success")
    assert states(dead)["refunds"]["DLQ"] == 10
    run = dag.test(run_conf={"group": "billing", "topic": "refunds", "dry_run": False, "rate_limit": 1000})
    assert str(run.state).endswith("success")
    assert states(dead)["refunds"]["READY"] == 10
    rows = dead.conn.execute(
        "SELECT dry_run, status, moved, filter->>'topic' FROM redrive_runs ORDER BY id"
    ).fetchall()
    assert rows == [(True, "success", 0, "refunds"), (False, "success", 10, "refunds")]


def test_binary_dead_letters_list_and_redrive(client, topic_group, database_url):
    from redelivery.dead_letters import jsonable

    client.publish("orders", [b"\xff\xfe\x00"])
    client.reject("billing", client.receive("billing", "orders", 1, 30), error="not JSON")
    [row] = client.dlq_list("billing")
    assert row["body"] == b"\xff\xfe\x00"
    assert jsonable([row])[0]["body"] == "fffe00"
    result = redrive(
        RedriveRequest(group="billing", dry_run=False), run_key="bin", url=database_url, log=lambda *_: None
    )
    assert result["moved"] == 1 and result["sample"][0]["message_id"] == row["message_id"]
    assert client.receive("billing", "orders", 1, 30)[0].body == b"\xff\xfe\x00"


def test_a_message_dead_lettered_again_during_a_run_is_not_moved_twice_by_it(dead, database_url):
    request = RedriveRequest(group="billing", topic="refunds", rate_limit=5, dry_run=False)
    calls = []
    first = redrive(
        request,
        run_key="loop",
        url=database_url,
        log=lambda *_: None,
        should_stop=lambda: calls.append(1) or len(calls) > 1,
    )
    assert (first["status"], first["moved"]) == ("stopped", 5)
    # one of the moved messages fails again and is dead-lettered while the run is paused
    [again] = dead.receive("billing", "refunds", 1, 30)
    dead.reject("billing", again, error="again")
    result = redrive(request, run_key="loop", url=database_url, log=lambda *_: None)  # no unique violation
    assert (result["status"], result["moved"]) == ("success", 10)
    moves = dead.conn.execute("SELECT count(*), count(DISTINCT message_id) FROM redrive_moves").fetchone()
    assert moves == (10, 10)
    assert [r["message_id"] for r in dead.dlq_list("billing") if r["topic"] == "refunds"] == [
        again.message_id
    ]


def test_a_destination_equal_to_the_source_topic_is_refused(dead, database_url):
    with pytest.raises(ValueError, match="is the topic the dead letters come from"):
        RedriveRequest(group="billing", topic="orders", destination_topic="orders")
    before = snapshot(dead.conn)
    with pytest.raises(RedeliveryError, match="come from topic 'orders' itself"):
        redrive(
            RedriveRequest(group="billing", destination_topic="orders", dry_run=False),
            run_key="self",
            url=database_url,
        )
    assert snapshot(dead.conn) == before


def test_a_rate_below_one_message_a_second_has_no_bursts(dead, database_url):
    request = RedriveRequest(group="billing", topic="orders", max_messages=3, rate_limit=0.8, dry_run=False)
    ends, log = slot_ends(database_url, "slow")
    assert redrive(request, run_key="slow", url=database_url, log=log)["moved"] == 3
    # one message every 1.25 s: each its own batch, each in its own slot of the run's schedule
    assert paced_batches(dead.conn, "slow", 0.8) == [1, 1, 1]
    assert_slots_kept(dead.conn, "slow", 0.8, ends)


def test_the_spark_path_keeps_one_rate_for_all_its_tasks(client, topic_group, database_url, spark_connect):
    client.publish("orders", [{"n": i} for i in range(3)])
    client.reject("billing", client.receive("billing", "orders", 3, 30), error="bulk")
    request = RedriveRequest(group="billing", rate_limit=0.8, dry_run=False)
    assert (
        redrive(
            request,
            run_key="spark-slow",
            url=database_url,
            spark=spark_connect,
            spark_threshold=1,
            log=lambda *_: None,
        )["moved"]
        == 3
    )
    # tasks in parallel, paced together: the k-th message moved no earlier than (k - 1) * 1.25 s
    # after the run began, whichever task moved it
    assert paced_batches(client.conn, "spark-slow", 0.8) == [1, 1, 1]


def test_a_real_run_after_a_dry_run_under_the_same_key_moves(dead, database_url):
    request = {"group": "billing", "topic": "refunds"}
    dry = redrive(RedriveRequest(**request), run_key="same", url=database_url, log=lambda *_: None)
    assert (dry["dry_run"], dry["moved"]) == (True, 0)
    real = redrive(
        RedriveRequest(**request, dry_run=False), run_key="same", url=database_url, log=lambda *_: None
    )
    assert (real["dry_run"], real["moved"], real["status"]) == (False, 10, "success")
    assert states(dead)["refunds"]["READY"] == 10
    with pytest.raises(RedeliveryError, match="another selection"):
        redrive(
            RedriveRequest(group="billing", topic="orders", dry_run=False), run_key="same", url=database_url
        )


def test_a_stopped_run_resumes_under_its_key(dead, database_url):
    request = RedriveRequest(group="billing", topic="orders", rate_limit=10, dry_run=False)
    calls = []
    first = redrive(
        request,
        run_key="resume",
        url=database_url,
        log=lambda *_: None,
        should_stop=lambda: calls.append(1) or len(calls) > 1,
    )
    assert (first["status"], first["moved"]) == ("stopped", 10)
    second = redrive(request, run_key="resume", url=database_url, log=lambda *_: None)
    assert (second["status"], second["moved"]) == ("success", 30)
    assert states(dead)["orders"]["READY"] == 30


def test_a_run_recorded_before_the_signature_filter_resumes_under_its_key(dead, database_url):
    """A run stopped by the version before migration 0020 (its recorded filter has no
    ``signature``) resumes after the upgrade: a filter without a signature is recorded without it."""
    request = RedriveRequest(group="billing", topic="orders", rate_limit=10, dry_run=False)
    calls = []
    stop = lambda: calls.append(1) or len(calls) > 1  # noqa: E731
    redrive(request, run_key="old", url=database_url, log=lambda *_: None, should_stop=stop)
    recorded = dead.conn.execute("SELECT filter FROM redrive_runs WHERE run_key = 'old'").fetchone()[0]
    assert "signature" not in recorded and "key" not in recorded  # as the version before recorded it
    again = redrive(request, run_key="old", url=database_url, log=lambda *_: None)
    assert (again["status"], again["moved"]) == ("success", 30)


def run_row(conn, run_key):
    return conn.execute(
        "SELECT status, dry_run, finished_at, filter, moved FROM redrive_runs WHERE run_key = %s", (run_key,)
    ).fetchone()


def test_a_refused_redrive_changes_nothing_and_the_dry_run_stays_dry(dead, database_url):
    """Issue 16.1: a call refused for its run key must not rewrite the run, and the original dry run
    under that key, repeated, must still move nothing."""
    dry = RedriveRequest(group="billing", topic="refunds")
    redrive(dry, run_key="k", url=database_url, log=lambda *_: None)
    before_run, before_state = run_row(dead.conn, "k"), snapshot(dead.conn)
    with pytest.raises(RedeliveryError, match="another selection"):
        redrive(RedriveRequest(group="billing", topic="orders", dry_run=False), run_key="k", url=database_url)
    assert run_row(dead.conn, "k") == before_run
    assert snapshot(dead.conn) == before_state  # the refused call changed nothing at all
    again = redrive(dry, run_key="k", url=database_url, log=lambda *_: None)
    assert (again["dry_run"], again["moved"]) == (True, 0)
    # the repeated dry run moved nothing; its audit row records only its new finish time
    audit = "redelivery.redrive_runs"
    assert snapshot(dead.conn, leave_out=(audit,)) == {k: v for k, v in before_state.items() if k != audit}
    after_run = run_row(dead.conn, "k")
    assert after_run[:2] + after_run[3:] == before_run[:2] + before_run[3:] and after_run[2] >= before_run[2]
    assert dead.conn.execute("SELECT count(*) FROM redrive_runs").fetchone() == (1,)


def test_a_dry_run_under_the_key_of_a_real_run_moves_nothing(dead, database_url):
    """A real run stopped between batches, then a dry run under its key: refused, nothing moves and
    the run keeps its status (a dry run must never move anything)."""
    real = RedriveRequest(group="billing", topic="orders", rate_limit=10, dry_run=False)
    calls = []
    stopped = redrive(
        real, run_key="r", url=database_url, log=lambda *_: None,
        should_stop=lambda: calls.append(1) or len(calls) > 1,
    )  # fmt: skip
    assert (stopped["status"], stopped["moved"]) == ("stopped", 10)
    before_run, before_state = run_row(dead.conn, "r"), snapshot(dead.conn)
    with pytest.raises(RedeliveryError, match="dry run"):
        redrive(RedriveRequest(group="billing", topic="orders", rate_limit=10), run_key="r", url=database_url)
    assert run_row(dead.conn, "r") == before_run
    assert snapshot(dead.conn) == before_state
