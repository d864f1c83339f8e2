"""Receipts answer exactly one delivery: late, repeated and foreign answers change nothing; the
delivery count never goes back; an undecodable body never strands its batch; lock conflicts
never fail a call."""

import dataclasses
import threading

import psycopg
import pytest

from helpers import (
    at,
    configured,
    deadlocks,
    message_state,
    run_cli,
    snapshot,
    wait_for_deadlocks,
    wait_for_session,
    waiting_for_a_lock,
)
from redelivery.client import Outcome, Receipt
from redelivery.errors import ForeignReceiptError
from redelivery.redrive import RedriveRequest, redrive
from redelivery.tiers.run import TierRunRequest, run_tier


def delivery(client, message_id, group="billing"):
    found = message_state(client.conn, message_id, group)
    return (
        None
        if found is None
        else tuple(found[f] for f in ("state", "delivery_count", "reconsume_times", "redrive_count"))
    )


def test_a_late_receipt_after_a_redrive_changes_nothing(client, database_url):
    """C1 receives m and hangs; its lease expires and m is dead-lettered; an operator redrives m;
    C2 receives it. C1's late reject or ack must not touch C2's delivery."""
    client.create_topic("orders")
    client.create_group("billing", max_reconsume_times=0)
    client.subscribe("billing", "orders")
    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    [c1] = client.receive("billing", "orders", 1, 5, at=at(0))
    run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="expire"), url=database_url)
    assert delivery(client, mid)[0] == "DLQ"
    redrive(
        RedriveRequest(group="billing", dry_run=False), run_key="again", url=database_url, log=lambda *_: None
    )
    [c2] = client.receive("billing", "orders", 1, 30, at=at(20))
    assert (c1.delivery_count, c2.delivery_count) == (1, 2)  # never reset: old receipts stay stale
    assert c2.redrive_count == 1 and c2.reconsume_times == 0
    assert client.reject("billing", c1, error="late") == 0
    assert client.ack("billing", c1) == 0
    assert client.nack("billing", c1) == 0
    assert delivery(client, mid) == ("INFLIGHT", 2, 0, 1)
    assert client.stale_receipts("billing") == 3
    assert client.ack("billing", c2) == 1
    assert client.ack("billing", c2) == 0  # an answer given twice is stale too
    assert delivery(client, mid)[0] == "COMMITTED" and client.stale_receipts("billing") == 4


def test_the_redrive_count_shows_in_dead_letter_views(client, database_url):
    client.create_topic("orders")
    client.create_group("billing", max_reconsume_times=0)
    client.subscribe("billing", "orders")
    client.publish("orders", [{"n": 1}])
    for key in ("first", "second"):
        client.reject("billing", client.receive("billing", "orders", 1, 30), error="bad")
        redrive(
            RedriveRequest(group="billing", dry_run=False), run_key=key, url=database_url, log=lambda *_: None
        )
    client.reject("billing", client.receive("billing", "orders", 1, 30), error="bad again")
    [dead] = client.dlq_list("billing")
    assert (dead["redrive_count"], dead["delivery_count"]) == (2, 3)
    shown = run_cli("dlq", "show", str(dead["message_id"]), "--group", "billing", database_url=database_url)
    assert '"redrive_count": 2' in shown.stdout


def test_a_receipt_of_another_group_is_refused(client, topic_group):
    client.create_group("audit")
    client.subscribe("audit", "orders")
    client.publish("orders", [{"n": 1}, {"n": 2}])
    mine = client.receive("billing", "orders", 2, 30)
    client.receive("audit", "orders", 2, 30)  # audit's deliveries have the same ids and counts
    before = snapshot(client.conn)
    for call in (client.ack, client.nack, client.reject):
        with pytest.raises(ForeignReceiptError, match="received by group 'billing'"):
            call("audit", mine)
    assert snapshot(client.conn) == before


@pytest.mark.parametrize(
    "stored,needle",
    [
        ("[" * 3000 + "]" * 3000, "RecursionError"),  # PostgreSQL's jsonb takes it; Python's decoder does not
        ('{"n": ' + "7" * 5000 + "}", "ValueError"),  # over Python's 4300-digit limit for int()
    ],
)
def test_an_undecodable_body_is_dead_lettered_and_never_strands_its_batch(
    client, topic_group, stored, needle
):
    ids = client.publish("orders", [{"n": 1}, {"n": 2}, {"n": 3}])
    # a producer outside Python (a Spark job, SQL) stored a body PostgreSQL accepts as JSON
    client.conn.execute(
        "UPDATE messages SET body = convert_to(%s::jsonb::text, 'UTF8') WHERE id = %s", (stored, ids[1])
    )
    got = client.receive("billing", "orders", 10, 30)
    assert [m.message_id for m in got] == [ids[0], ids[2]]
    assert delivery(client, ids[1])[:2] == ("DLQ", 1)  # the delivery counted, and nothing left in flight
    counts = client.stats()["orders"]["billing"]
    assert (counts["INFLIGHT"], counts["DLQ"], counts["READY"]) == (2, 1, 0)
    [dead] = client.dlq_list("billing")  # listing it does not crash either
    assert dead["reason"] == "UNDECODABLE" and needle in dead["last_error"]
    assert dead["body_error"].startswith("not decodable") and isinstance(dead["body"], str)
    assert dead["attempts"][-1]["outcome"] == "undecodable"


def test_a_batch_of_undecodable_bodies_only_does_not_end_a_receive_while_messages_wait(client, topic_group):
    """Every message a receive leased was undecodable (dead-lettered): it receives again rather than
    return nothing, which a drain would take for "nothing left" (and a wait would sit out until its
    re-check)."""
    ids = client.publish("orders", [{"n": 1}, {"n": 2}, {"n": 3}])
    client.conn.execute(
        "UPDATE messages SET body = convert_to(repeat('[', 3000) || repeat(']', 3000), 'UTF8')"
        " WHERE id = ANY(%s)",
        (ids[:2],),
    )
    got = client.receive("billing", "orders", 2, 30)
    assert [m.message_id for m in got] == [ids[2]]
    assert [delivery(client, i)[0] for i in ids[:2]] == ["DLQ", "DLQ"]


def test_a_batch_of_undecodable_bodies_that_cannot_be_dead_lettered_ends_the_receive(
    client, topic_group, monkeypatch
):
    """All a receive leased was undecodable and dead-lettering them fails: they stay in flight and
    the receive returns nothing, rather than lease batch after batch it cannot hand out."""
    from redelivery.messaging.leasing import Receiver

    ids = client.publish("orders", [{"n": 1}, {"n": 2}, {"n": 3}])
    client.conn.execute(
        "UPDATE messages SET body = convert_to(repeat('[', 3000) || repeat(']', 3000), 'UTF8')"
        " WHERE id = ANY(%s)",
        (ids[:2],),
    )

    def fails(*_) -> None:
        raise psycopg.OperationalError("the connection was lost")

    monkeypatch.setattr(Receiver, "_dead_letter_undecodable", fails)
    assert client.receive("billing", "orders", 2, 30) == []
    assert [delivery(client, i)[:2] for i in ids[:2]] == [("INFLIGHT", 1)] * 2
    assert delivery(client, ids[2])[:2] == ("READY", 0)  # not leased: past the offset


def test_a_receive_that_cannot_dead_letter_an_undecodable_body_still_hands_out_the_rest(
    client, topic_group, monkeypatch, caplog
):
    """The lease is committed before the bodies are decoded: when dead-lettering the undecodable one
    fails (a lost connection, say), the caller still gets the others, and the undecodable one stays
    in flight until its lease ends, as after a consumer's crash."""
    from redelivery.messaging.leasing import Receiver

    ids = client.publish("orders", [{"n": 1}, {"n": 2}])
    client.conn.execute(
        "UPDATE messages SET body = convert_to(repeat('[', 3000) || repeat(']', 3000), 'UTF8') WHERE id = %s",
        (ids[1],),
    )

    def fails(*_) -> None:
        raise psycopg.OperationalError("the connection was lost")

    monkeypatch.setattr(Receiver, "_dead_letter_undecodable", fails)
    got = client.receive("billing", "orders", 10, 30)
    assert [m.message_id for m in got] == [ids[0]]
    assert delivery(client, ids[1])[:2] == ("INFLIGHT", 1)
    assert "stay in flight until their lease ends" in caplog.text


def test_an_undecodable_dead_letter_is_selected_by_its_reason(client, topic_group, database_url):
    """docs/operating.md lists UNDECODABLE among the redrive reasons: the filter, the redrive and
    the CLI take it."""
    import json

    from redelivery.dead_letters import DlqFilter, count

    ids = client.publish("orders", [{"n": 1}, {"n": 2}])
    client.conn.execute(
        "UPDATE messages SET body = convert_to(%s::jsonb::text, 'UTF8') WHERE id = %s",
        ("[" * 3000 + "]" * 3000, ids[1]),
    )
    [other] = client.receive("billing", "orders", 10, 30)  # ids[1] is dead-lettered UNDECODABLE
    client.reject("billing", other, error="schema violation")  # and ids[0] REJECTED
    only = DlqFilter(group="billing", reasons=["UNDECODABLE"])
    assert count(client.conn, only) == 1
    assert count(client.conn, DlqFilter(group="billing", reasons=["UNDECODABLE", "REJECTED"])) == 2
    # a dry run changes nothing but its own audit row (redrive_runs, checked by itself)
    audit = "SELECT run_key, dry_run, status, moved FROM redrive_runs ORDER BY id"
    before = snapshot(client.conn, leave_out=("redelivery.redrive_runs",))
    assert client.conn.execute(audit).fetchall() == []
    request = RedriveRequest(group="billing", reasons=["UNDECODABLE"], dry_run=True)
    result = redrive(request, run_key="undecodable-dry", url=database_url)
    assert result["matched"] == 1 and result["moved"] == 0
    assert [row["message_id"] for row in result["sample"]] == [ids[1]]
    assert snapshot(client.conn, leave_out=("redelivery.redrive_runs",)) == before  # a dry run
    assert client.conn.execute(audit).fetchall() == [("undecodable-dry", True, "success", 0)]
    done = run_cli(
        "dlq", "count", "--group", "billing", "--reasons", "UNDECODABLE", "--json", database_url=database_url
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["count"] == 1
    done = run_cli(
        "redrive", "--group", "billing", "--reasons", "UNDECODABLE", "--json", database_url=database_url
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dry_run"] is True
    assert snapshot(client.conn, leave_out=("redelivery.redrive_runs",)) == before
    runs = client.conn.execute(audit).fetchall()
    assert len(runs) == 2 and [run[1:] for run in runs] == [(True, "success", 0)] * 2


def _deadlock_with(url: str, held: int, then: int, victim: str, call):
    """A deadlock whose victim is ``call`` (run in a thread): another transaction locks the
    delivery of message ``held``; ``call`` locks its rows in message-id order and waits for
    ``held`` (statement ``victim`` of redelivery.store.statements, seen waiting in pg_stat_activity);
    then the other transaction asks for ``then``, which ``call`` holds. The other session never
    looks for a deadlock itself (deadlock_timeout 10 min), so PostgreSQL's check, made in
    ``call``'s session after its deadlock_timeout, finds the cycle there: ``call``'s transaction is
    aborted and must be run again. Returns (what ``call`` returned, deadlocks PostgreSQL counted
    meanwhile)."""
    before = deadlocks(url)
    result = {}
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("SET deadlock_timeout = '10min'")  # this side is never the victim
        other.execute("BEGIN")
        other.execute("SELECT 1 FROM redelivery.deliveries WHERE message_id = %s FOR UPDATE", (held,))
        running = threading.Thread(target=lambda: result.update(value=call()))
        running.start()
        wait_for_session(url, waiting_for_a_lock(victim), f"{victim} waiting for message {held}'s row")
        # both wait for each other now; this statement gets its row once the victim is aborted
        other.execute("SELECT 1 FROM redelivery.deliveries WHERE message_id = %s FOR UPDATE", (then,))
        other.execute("COMMIT")
        running.join(60)
    assert not running.is_alive()
    return result.get("value"), wait_for_deadlocks(url, before + 1, "a deadlock detected") - before


@pytest.mark.timeout(120)  # a race: were a lock never granted, fail rather than hang
def test_an_ack_that_meets_a_deadlock_is_retried(client, topic_group, clean_db):
    """The ack locks its rows in message-id order; another transaction that locks them the other
    way round makes PostgreSQL abort one of the two: here the ack (see ``_deadlock_with``), which
    then runs again and succeeds."""
    ids = client.publish("orders", [{"n": 1}, {"n": 2}])
    got = client.receive("billing", "orders", 2, 30)
    acked, deadlocked = _deadlock_with(clean_db, ids[1], ids[0], "ACK", lambda: client.ack("billing", got))
    assert deadlocked == 1  # the ack's first transaction was the victim: the retry is what acked
    assert acked == 2
    assert client.stats()["orders"]["billing"]["COMMITTED"] == 2


@pytest.mark.timeout(120)  # a race: were a lock never granted, fail rather than hang
def test_a_tier_range_that_meets_a_deadlock_is_retried(client, topic_group, clean_db, database_url):
    ids = client.publish("orders", [{"n": i} for i in range(4)], at=at(0))
    client.nack("billing", client.receive("billing", "orders", 4, 30, at=at(0)), at=at(0))
    summary, deadlocked = _deadlock_with(
        clean_db,
        ids[-1],
        ids[0],
        "PROMOTE",
        lambda: run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="dl"), url=database_url),
    )
    assert deadlocked == 1  # the range's first transaction was the victim: its retry promoted
    assert summary["promoted"] == 4


def test_create_group_keeps_its_limit_unless_a_new_one_is_given(client):
    client.create_group("billing", max_reconsume_times=3)
    client.create_group("billing")
    assert client.conn.execute("SELECT max_reconsume_times FROM consumer_groups").fetchone() == (3,)
    client.create_group("billing", max_reconsume_times=5)
    assert client.conn.execute("SELECT max_reconsume_times FROM consumer_groups").fetchone() == (5,)
    client.update_group("billing", max_reconsume_times=None)
    assert client.conn.execute("SELECT max_reconsume_times FROM consumer_groups").fetchone() == (None,)


@pytest.mark.timeout(120)  # a race: were a lock never granted, fail rather than hang
def test_settle_locks_its_group_row_only_after_the_deliveries_it_changes(client, database_url):
    """A tier range holds a delivery's row and then adds to its group's totals; a settle that held
    the group row (to count a stale ack) while waiting for that delivery would deadlock with it.
    While settle waits for the delivery, its group row must be free."""
    from redelivery.client import Outcome
    from redelivery.store import db

    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders")
    client.publish("orders", [{"n": 1}, {"n": 2}], at=at(0))
    first, second = client.receive("billing", "orders", 2, 60, at=at(0))
    client.ack("billing", [first])  # its receipt is stale from now on
    with db.connect(database_url) as holder, db.connect(database_url) as prober:
        holder.execute(  # what a tier range does first: lock the delivery row
            "SELECT 1 FROM deliveries WHERE message_id = %s FOR UPDATE", (second.message_id,)
        )
        done = {}
        settling = threading.Thread(
            target=lambda: done.update(
                counts=client.settle("billing", [Outcome(first, "ack"), Outcome(second, "retry")])
            )
        )
        settling.start()
        # settle's retry waits for the delivery the holder locked
        wait_for_session(database_url, waiting_for_a_lock("FAIL_RETRY"), "settle waiting for the delivery")
        prober.execute("SET lock_timeout = '200ms'")
        # the group row is free while settle waits: a tier range can finish and let it through
        prober.execute("SELECT 1 FROM consumer_groups WHERE name = 'billing' FOR UPDATE")
        assert settling.is_alive()  # settle still waited for the delivery meanwhile
        prober.rollback()
        holder.rollback()
        settling.join(10)
    assert not settling.is_alive()
    assert done["counts"] == {"acked": 0, "retried": 1, "dead_lettered": 0, "stale": 1}


def _received(got, **fields):
    """``got`` (a ReceivedMessage) with other receipt fields, as a caller could build one."""
    import dataclasses

    return dataclasses.replace(got, **fields)


@pytest.mark.parametrize(
    "call,error,needle",
    [  # a string id used to become array text: "5,6" two receipts; a float or a bool a raw psycopg error
        (lambda c, m, R: c.extend_lease("billing", [R("5,6", 1)], 60), TypeError, "message_id must be an"),
        (lambda c, m, R: c.ack("billing", [_received(m[0], message_id="5,6")]), TypeError, "message_id"),
        (lambda c, m, R: c.nack("billing", [m[0], _received(m[1], message_id=2.0)]), TypeError, "got 2.0"),
        (lambda c, m, R: c.reject("billing", [_received(m[0], delivery_count=True)]), TypeError,
         "delivery_count must be an int"),
        (lambda c, m, R: c.settle("billing", [Outcome(m[0], "ack"), Outcome(R(m[1].message_id, "1"), "ack")]),
         TypeError, "delivery_count"),
        (lambda c, m, R: c.reconsume_later("billing", [_received(m[0], delivery_count=0)], delay=5),
         ValueError, "delivery_count must be an int from 1 to 2147483647, got 0"),
        (lambda c, m, R: c.extend_lease("billing", [m[0], R(m[1].message_id, 2**31)], 60), ValueError,
         "2147483647"),
        (lambda c, m, R: c.settle("billing", [Outcome(R(m[0].message_id, -1), "retry")]), ValueError,
         "delivery_count"),
        (lambda c, m, R: c.extend_lease("billing", [R(2**63, 1)], 60), ValueError,
         "message_id must be an int from 1 to 9223372036854775807"),
        (lambda c, m, R: c.ack("billing", [m[0], _received(m[1], message_id=0)]), ValueError, "got 0"),
        (lambda c, m, R: c.extend_lease("billing", [R(None, 1)], 60), TypeError, "got None"),
    ],
)  # fmt: skip
def test_a_receipt_whose_fields_are_not_ints_in_range_is_refused_and_changes_nothing(
    client, topic_group, call, error, needle
):
    """Issue 27 item 9: a receipt's message id (bigint, from 1) and delivery count (int4, from 1)
    are checked before any statement: a one-line error, nothing changed, the valid receipts of the
    call not answered either."""

    def receipt(message_id, delivery_count):
        return Receipt(message_id, delivery_count, "orders", "billing")

    client.publish("orders", [{"n": 1}, {"n": 2}])
    got = client.receive("billing", "orders", 2, 30)
    before = snapshot(client.conn)
    with pytest.raises(error, match=needle) as refused:
        call(client, got, receipt)
    assert "\n" not in str(refused.value)
    assert snapshot(client.conn) == before


def test_array_text_is_built_only_from_ints():
    from redelivery.messaging.receipts import int_array

    assert int_array([1, 2, 2**63 - 1]) == "{1,2,9223372036854775807}"
    assert int_array(()) == "{}"
    for bad in ("5,6", 1.0, True, None, "{1}"):
        with pytest.raises(TypeError, match="not an int"):
            int_array([1, bad])


@pytest.mark.parametrize("topic_id", [1, 2, 3])
def test_a_receipt_answers_its_delivery_count_and_topic_exactly(client, database_url, topic_id):
    """A receipt is (message, delivery count, topic): an earlier delivery's count never answers a
    later delivery, whatever numbers the topic id and the counts share (a lookup that compared them
    as sets, [count, topic] against [count', topic], took delivery 1 of topic 2 for delivery 2)."""
    from helpers import configured

    for n in range(1, topic_id):
        client.create_topic(f"before-{n}")
    assert client.create_topic("orders") == topic_id
    client.create_group("billing")
    client.subscribe("billing", "orders")
    configured(client, {"topic": "orders", "backoff": {"kind": "fixed", "interval": "1s"}})
    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    receipts = [client.receive("billing", "orders", 1, 30, at=at(0))[0]]
    for count in (2, 3):
        client.nack("billing", receipts[-1], at=at(10 * count))
        window = TierRunRequest(tier="seconds", window_end=at(10 * count + 5), run_key=f"r{count}")
        run_tier(window, url=database_url, config=client.config)
        receipts.append(client.receive("billing", "orders", 1, 30, at=at(10 * count + 5))[0])
    assert [r.delivery_count for r in receipts] == [1, 2, 3]
    for stale in receipts[:2]:
        assert client.ack("billing", stale) == 0
        assert client.extend_lease("billing", stale, 60, at=at(36)) == 0
        assert client.nack("billing", stale, at=at(36)) == 0
    assert message_state(client.conn, mid)["state"] == "INFLIGHT"
    assert client.ack("billing", receipts[2]) == 1


def test_an_ack_outside_a_transaction_is_one_statement_committed_on_its_own(client, topic_group, monkeypatch):
    """No transaction of the client's around an ack (BEGIN, ACK, COMMIT were three round trips):
    the statement commits alone, and another session sees it at once."""
    client.publish("orders", [{"n": 1}, {"n": 2}])
    got = client.receive("billing", "orders", 10, 30)
    monkeypatch.setattr(client.conn, "transaction", lambda *a, **k: pytest.fail("a transaction"))
    assert client.ack("billing", got) == 2
    assert client.ack("billing", got) == 0  # stale, counted by the same statement
    monkeypatch.undo()
    with psycopg.connect(client.url) as other:
        other.execute("SET search_path = redelivery")
        assert other.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 0
        assert other.execute("SELECT stale_receipts FROM consumer_groups").fetchone()[0] == 2


@pytest.mark.parametrize("where", ["alone", "breaker watching", "caller's transaction"])
def test_an_ack_naming_another_topic_is_refused_by_its_statement_and_changes_nothing(
    client, topic_group, where
):
    """The ACK statement refuses a receipt that names another topic than its message's itself
    (SQLSTATE RD001, migration 0024): the valid receipt beside it stays in flight and nothing is
    counted stale; alone (one statement), with a breaker watching the group (a transaction with its
    counts), and in a savepoint of the caller's transaction, which stays usable."""
    if where == "breaker watching":
        breaker = {"min_attempts": 4, "failure_ratio": 0.5, "open_time": "1s", "max_open_time": "2s"}
        configured(client, {"breaker": breaker})
        assert client.breakers("billing")  # watched: the ack goes in a transaction with its counts
    client.create_topic("refunds")
    client.subscribe("billing", "refunds")
    client.publish("orders", [{"n": 1}])
    client.publish("refunds", [{"n": 2}])
    [mine] = client.receive("billing", "orders", 1, 30)
    [refund] = client.receive("billing", "refunds", 1, 30)
    wrong = dataclasses.replace(refund, topic="orders")  # a refunds message, its receipt naming orders
    before = snapshot(client.conn)
    if where == "caller's transaction":
        client.conn.execute("BEGIN")
    with pytest.raises(
        ForeignReceiptError, match=f"message {refund.message_id} is not a message of topic 'orders'"
    ):
        client.ack("billing", [mine, wrong])
    if where == "caller's transaction":
        assert client.conn.execute("SELECT 1").fetchone() == (1,)  # usable: only its savepoint went
        client.conn.execute("ROLLBACK")
    assert snapshot(client.conn) == before and client.stale_receipts("billing") == 0
    assert client.ack("billing", [mine, refund]) == 2
