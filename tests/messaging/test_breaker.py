"""A subscription's circuit breaker (issue 41) on a real PostgreSQL: it opens on counted failures,
parks what fails while open (no reconsume time spent, never dead-lettered), hands nothing out,
keeps due retries waiting, probes when its open time passed, closes on the probe's successes or
opens again for twice as long, and stays held past its maximum; an operator's hands, the audit, the
metrics and the CLI."""

import json
import logging
import time

import pytest
from pydantic import ValidationError

from helpers import configured, run_cli, snapshot
from redelivery.client import Message
from redelivery.errors import NotSubscribedError, UnknownGroupError
from redelivery.rules.breaker import BreakerConfig, counts

#: Opens on 2 counted failures of at least 4 answers; 1 s open, then 2 s; a third would be 4 s,
#: past the maximum: held.
BREAKER = {"min_attempts": 4, "failure_ratio": 0.5, "open_time": "1s", "max_open_time": "2s", "probe_size": 2}
#: Every failure dead-letters (no retry left), and a retry waits 1 s: what a breaker saves is plain.
POLICY = {"breaker": BREAKER, "max_reconsume_times": 0, "backoff": {"kind": "fixed", "interval": "1s"}}
DOWN = ConnectionError("payments API at 10.0.0.7:443 refused the connection")


def state(client) -> dict:
    [found] = client.breakers("billing")
    return found


def row(client, mid):
    """(state, reconsume times, delivery count, the last attempt's outcome) of a delivery row."""
    return client.conn.execute(
        "SELECT state::text, reconsume_times, delivery_count, attempts -> -1 ->> 'outcome' FROM deliveries "
        "WHERE message_id = %s",
        (mid,),
    ).fetchone()


def dead(client) -> int:
    return client.conn.execute("SELECT count(*) FROM dlq_messages").fetchone()[0]


def tier(database_url, config, key, name="seconds"):
    from redelivery.store import db
    from redelivery.tiers.run import TierRunRequest, run_tier

    with db.connect(database_url) as conn:
        now = conn.execute("SELECT now()").fetchone()[0]
    return run_tier(TierRunRequest(tier=name, window_end=now, run_key=key), url=database_url, config=config)


def trip(client) -> list:
    """Four messages failed with a counted failure (spent: the breaker was closed): it opens."""
    first = client.receive("billing", "orders", 4, 60)
    client.nack("billing", first, error=DOWN)
    assert state(client)["state"] == "open"
    return first


def test_counted_failures_open_it_and_what_fails_while_open_is_parked(client, topic_group):
    configured(client, POLICY)
    client.publish("orders", [{"n": i} for i in range(10)])
    in_flight = client.receive("billing", "orders", 6, 60)
    client.nack("billing", in_flight[:4], error=DOWN)
    assert dead(client) == 4  # spent before it opened: its trip needs them
    opened = state(client)
    assert (opened["state"], opened["opened_total"], opened["failed"]) == ("open", 1, 4)
    assert client.receive("billing", "orders", 10, 60) == []  # nothing handed out while open
    # failures of deliveries in flight when it opened are parked: not dead, no reconsume time spent
    assert client.nack("billing", in_flight[4:], error=DOWN) == 2
    assert dead(client) == 4
    for m in in_flight[4:]:
        assert row(client, m.message_id) == ("WAITING_RETRY", 0, 1, "parked")
    [transition] = client.breaker_history("billing")
    assert (transition["from"], transition["to"], transition["changed_by"]) == (
        "closed",
        "open",
        "redelivery",
    )
    assert (transition["failed"], transition["succeeded"]) == (4, 0)


def test_failures_that_do_not_count_neither_open_it_nor_are_parked(client, topic_group):
    configured(client, {**POLICY, "breaker": {**BREAKER, "exclude": ["ValueError"]}})
    client.publish("orders", [{"n": i} for i in range(8)])
    got = client.receive("billing", "orders", 8, 60)
    client.nack("billing", got[:4], error=ValueError("order 17 has no customer"))
    assert state(client)["state"] == "closed"  # a consumer's own validation errors never count
    client.nack("billing", got[4:], error=DOWN)
    assert state(client)["state"] == "open"
    client.open_breaker("orders", "billing", by="test")  # held: whatever counts is parked
    client.publish("orders", [{"n": 9}])
    client.close_breaker("orders", "billing", by="test")
    [again] = client.receive("billing", "orders", 1, 60)
    client.open_breaker("orders", "billing", by="test")
    before = dead(client)
    client.nack("billing", [again], error=ValueError("order 18 has no customer"))
    assert dead(client) == before + 1  # not counted: spent and dead-lettered, open or not


def test_only_included_failures_count(client, topic_group):
    """``include``, as the statements apply it (by class here; a signature works the same way)."""
    configured(client, {**POLICY, "breaker": {**BREAKER, "include": ["ConnectionError", "0123456789ab"]}})
    client.publish("orders", [{"n": i} for i in range(8)])
    got = client.receive("billing", "orders", 8, 60)
    client.nack("billing", got[:4], error=TimeoutError("payments API did not answer in 30 s"))
    assert state(client)["state"] == "closed"  # not included: not counted
    client.nack("billing", got[4:], error=DOWN)
    assert state(client)["state"] == "open"


def test_an_operators_timed_open_without_a_breaker_policy_ends_by_itself(client, topic_group, database_url):
    """Nothing counts the answers of a subscription with no ``breaker:``, so no probe could close
    a timed open: the next tier window after its time closes it."""
    config = configured(client, {"max_reconsume_times": 0})
    client.publish("orders", [{"n": i} for i in range(10)])
    client.open_breaker("orders", "billing", seconds=1, by="test")
    assert client.receive("billing", "orders", 10, 60) == []
    time.sleep(1.1)
    tier(database_url, config, "after-open")
    assert state(client)["state"] == "closed"
    assert len(client.receive("billing", "orders", 10, 60)) == 10


def test_a_reject_while_open_still_dead_letters(client, topic_group):
    configured(client, POLICY)
    client.publish("orders", [{"n": 1}])
    [m] = client.receive("billing", "orders", 1, 60)
    client.open_breaker("orders", "billing", by="test")
    assert client.reject("billing", [m], error=DOWN) == 1
    assert dead(client) == 1


def test_while_open_due_retries_wait_and_ended_leases_are_parked(client, topic_group, database_url):
    config = configured(client, POLICY)
    client.publish("orders", [{"n": i} for i in range(7)])
    leased = client.receive("billing", "orders", 3, 1)  # its lease ends in a second
    client.open_breaker("orders", "billing", by="test")  # held: no time runs out under the test
    time.sleep(1.2)
    summary = tier(database_url, config, "open-1")
    assert summary["parked_after_lease_expiry"] == 3 and summary["retried_after_lease_expiry"] == 0
    assert summary["dead_lettered"] == 0  # max reconsume times 0: closed, they would be dead
    for m in leased:
        assert row(client, m.message_id) == ("WAITING_RETRY", 0, 1, "parked")
    time.sleep(1.2)  # due now (lease end + 1 s)
    summary = tier(database_url, config, "open-2")
    assert summary["promoted"] == 0  # due, but the breaker is open: they wait
    assert {row(client, m.message_id)[0] for m in leased} == {"WAITING_RETRY"}
    client.close_breaker("orders", "billing", by="test", note="payments API is back")
    summary = tier(database_url, config, "closed-1")
    assert summary["promoted"] == 3
    again = {m.message_id: m for m in client.receive("billing", "orders", 10, 60)}
    for m in leased:
        assert (again[m.message_id].reconsume_times, again[m.message_id].delivery_count) == (0, 2)


def test_half_open_probes_a_few_and_closes_on_their_successes(client, topic_group):
    configured(client, POLICY)
    client.publish("orders", [{"n": i} for i in range(10)])
    trip(client)
    time.sleep(1.1)
    probe = client.receive("billing", "orders", 10, 60)
    assert len(probe) == 2  # probe_size in flight at once
    assert client.receive("billing", "orders", 10, 60) == []  # the probe is still in flight
    client.ack("billing", probe)
    assert state(client)["state"] == "closed"
    assert len(client.receive("billing", "orders", 10, 60)) == 4
    moves = [(t["from"], t["to"]) for t in reversed(client.breaker_history("billing"))]
    assert moves == [("closed", "open"), ("open", "closed")]


def test_leases_that_end_count_so_a_hanging_dependency_opens_it_and_a_hung_probe_too(
    client, topic_group, database_url
):
    config = configured(client, {**POLICY, "max_reconsume_times": 3})
    client.publish("orders", [{"n": i} for i in range(10)])
    client.receive("billing", "orders", 4, 1)  # the consumer hangs on the dependency: no answer
    time.sleep(1.1)
    [opened] = tier(database_url, config, "w1")["breaker_transitions"]
    assert (opened["from"], opened["to"]) == ("closed", "open")
    assert state(client)["opened_total"] == 1
    time.sleep(1.1)  # half-open: a probe, which hangs too
    assert len(client.receive("billing", "orders", 10, 1)) == 2
    time.sleep(1.1)
    moves = [(t["from"], t["to"]) for t in tier(database_url, config, "w2")["breaker_transitions"]]
    assert ("half_open", "open") in moves or ("open", "open") in moves, moves
    assert state(client)["opened_total"] == 2 and state(client)["open_seconds"] == 2.0


def leases_ended(client, database_url, breaker: dict, late: int, on_time: int) -> tuple[list, list]:
    """``late + on_time`` messages published and received, the first ``late`` with a 1 s lease that
    a tier window then ends (asserted), the others with a 60 s one: (late receipts, on-time ones)."""
    config = configured(client, {**POLICY, "max_reconsume_times": 3, "breaker": breaker})
    client.publish("orders", [{"n": i} for i in range(late + on_time)])
    late_ones = client.receive("billing", "orders", late, 1)
    on_time_ones = client.receive("billing", "orders", on_time, 60) if on_time else []
    time.sleep(1.1)
    assert tier(database_url, config, "ended")["retried_after_lease_expiry"] == late
    return late_ones, on_time_ones


def outcomes(client) -> tuple:
    """(successes, failures) the breaker counted, in all."""
    return client.conn.execute("SELECT sum(succeeded), sum(failed) FROM breaker_outcomes").fetchone()


def test_a_late_ack_after_its_lease_ended_counts_no_success(client, topic_group, database_url):
    """A consumer whose own time-out outlasts its lease: the ended lease counted a failure, and its
    late ack, stale, applies nothing, so it counts nothing either (it counted a success, halving a
    hanging dependency's failure ratio)."""
    late, on_time = leases_ended(client, database_url, {**BREAKER, "min_attempts": 100}, 3, 1)
    assert client.ack("billing", late + on_time) == 1
    assert outcomes(client) == (1, 3)


def test_a_late_failure_after_its_lease_ended_counts_no_second_failure(client, topic_group, database_url):
    """The same consumer's late nack and reject: the ended lease counted the failure once; its late
    answers, stale, apply nothing, so they count nothing either (each counted a second failure,
    doubling a hanging dependency's failure ratio). An answer on time among them counts."""
    late, on_time = leases_ended(client, database_url, {**BREAKER, "min_attempts": 100}, 3, 2)
    assert client.nack("billing", late[:2] + on_time[:1], error=DOWN) == 1  # retried: the on-time one
    assert client.reject("billing", late[2:] + on_time[1:], error=DOWN) == 1  # dead-lettered
    assert outcomes(client) == (0, 4)  # the 3 ended leases and the on-time nack; a reject counts no failure


def test_a_late_failure_counts_when_the_rule_counts_no_ended_lease(client, topic_group, database_url):
    """A rule that counts only ``ConnectionError``: an ended lease counts nothing, so the late nack
    of that delivery is the one failure the breaker hears of, and counts."""
    breaker = {**BREAKER, "min_attempts": 100, "include": ["ConnectionError"]}
    late, _ = leases_ended(client, database_url, breaker, 2, 0)  # the ended leases: not counted
    assert client.nack("billing", late, error=DOWN) == 0  # stale: changes nothing
    assert outcomes(client) == (0, 2)


def test_a_failed_probe_opens_it_for_twice_as_long_then_holds_it(client, topic_group, caplog):
    configured(client, POLICY)
    client.publish("orders", [{"n": i} for i in range(10)])
    trip(client)
    time.sleep(1.1)
    probe = client.receive("billing", "orders", 10, 60)
    client.nack("billing", probe, error=DOWN)  # open again for 2 s; no retry left: parked, not dead
    assert dead(client) == 4
    assert {row(client, m.message_id)[3] for m in probe} == {"parked"}
    reopened = state(client)
    assert (reopened["state"], reopened["open_seconds"]) == ("open", 2.0)
    time.sleep(2.1)
    probe = client.receive("billing", "orders", 10, 60)
    assert len(probe) == 2
    with caplog.at_level(logging.ERROR, logger="redelivery.breaker"):
        client.nack("billing", probe, error=DOWN)  # 4 s would pass the 2 s maximum: held
    held = state(client)
    assert held["state"] == "held" and held["held_total"] == 1
    assert "'billing'" in caplog.text and "until an operator closes it" in caplog.text
    time.sleep(1.1)
    assert client.receive("billing", "orders", 10, 60) == []  # held: no probe however long
    client.close_breaker("orders", "billing", by="test")
    assert client.receive("billing", "orders", 10, 60)
    assert dead(client) == 4  # only the failures that tripped it were spent


def test_an_ordered_subscription_hands_nothing_out_while_open(client):
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True)
    configured(client, POLICY)
    client.publish("orders", [Message({"n": i}, key=f"k{i}") for i in range(6)])
    client.open_breaker("orders", "billing", seconds=1, by="test")
    assert client.receive("billing", "orders", 10, 60) == []
    time.sleep(1.1)
    assert len(client.receive("billing", "orders", 10, 60)) == 2  # half-open: the probe


def test_an_operators_hands_are_checked_and_audited(client, topic_group, database_url):
    before = snapshot(client.conn)
    for bad in (0, -1, 10**9, True, "1"):
        with pytest.raises(ValueError, match="seconds must be"):
            client.open_breaker("orders", "billing", seconds=bad)
    for note in ("x" * 1001, "\ud800", "a\x00b"):
        with pytest.raises(ValueError, match="note must be"):
            client.open_breaker("orders", "billing", note=note)
    with pytest.raises(UnknownGroupError):
        client.open_breaker("orders", "nobody")
    client.create_group("audit")
    with pytest.raises(NotSubscribedError):
        client.open_breaker("orders", "audit")
    assert snapshot(client.conn, leave_out=("redelivery.consumer_groups",)) == {
        k: v for k, v in before.items() if k != "redelivery.consumer_groups"
    }
    done = run_cli("breaker", "open", "--topic", "orders", "--group", "billing", "--note", "API down",
                   "--json", database_url=database_url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["to"] == "held"
    listed = run_cli("breaker", "list", "--group", "billing", database_url=database_url)
    assert "held" in listed.stdout and "until an operator closes it" in listed.stdout
    stats = run_cli("stats", database_url=database_url)
    assert "breakers not closed:" in stats.stdout
    from redelivery.metrics import render

    text = render(client.conn).decode()
    assert 'redelivery_breaker_open{group="billing",state="held",topic="orders"} 1.0' in text
    assert 'redelivery_breaker_transitions_total{group="billing",to="held",topic="orders"} 1.0' in text
    run_cli("breaker", "close", "--topic", "orders", "--group", "billing", database_url=database_url)
    [closed, opened] = client.breaker_history("billing")
    assert opened["changed_by"].startswith("cli:") and opened["note"] == "API down"
    assert (closed["from"], closed["to"]) == ("held", "closed")
    refused = run_cli("breaker", "open", "--topic", "orders", "--group", "billing", "--seconds", "0",
                      database_url=database_url)  # fmt: skip
    assert refused.returncode == 2 and len(client.breaker_history("billing")) == 2


def test_the_counting_rule():
    rule = json.loads(
        BreakerConfig(include=["ConnectionError", "0123456789ab"], exclude=["abcdef012345"]).params()["rule"]
    )
    assert counts(rule, "ConnectionError", "ffffffffffff")
    assert counts(rule, "TimeoutError", "0123456789ab")
    assert not counts(rule, "TimeoutError", "ffffffffffff")
    assert not counts(rule, "ConnectionError", "abcdef012345")
    assert counts({}, None, None)
    for bad in (
        {"include": ["not a class!"]},
        {"open_time": "2h", "max_open_time": "1h"},
        {"failure_ratio": 0},
    ):
        with pytest.raises(ValidationError):
            BreakerConfig(**bad)
