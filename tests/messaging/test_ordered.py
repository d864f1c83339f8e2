"""Ordered subscriptions (issue 31): per (topic, group, key), one message at a time in publish order,
a failing message holding back the later ones of its key and nothing else. Each test names the
peer its rule comes from."""

from __future__ import annotations

import pytest

from helpers import at, snapshot
from redelivery.messaging.codec import Message
from redelivery.redrive import RedriveRequest, redrive
from redelivery.tiers.run import TierRunRequest, run_tier


@pytest.fixture()
def ordered(client):
    """Topic ``orders``, group ``billing`` subscribed ordered (continue), and group ``audit``
    subscribed unordered to the same topic."""
    client.create_topic("orders")
    client.create_group("billing")
    client.create_group("audit")
    client.subscribe("billing", "orders", ordered=True)
    client.subscribe("audit", "orders")
    return client


def publish(client, keys: str, clock: float = 0) -> list[int]:
    """One message per character of ``keys`` ("-": no key), body = its position."""
    messages = [Message({"n": i}, key=None if k == "-" else k) for i, k in enumerate(keys)]
    return client.publish("orders", messages, at=at(clock))


def rows(client, group: str = "billing") -> dict[int, str]:
    return dict(
        client.conn.execute(
            "SELECT d.message_id, d.state::text FROM redelivery.deliveries d"
            " JOIN redelivery.consumer_groups g ON g.id = d.group_id WHERE g.name = %s ORDER BY 1",
            (group,),
        ).fetchall()
    )


def received(client, n: int = 50, group: str = "billing", clock: float = 0, lease: float = 30):
    return client.receive(group, "orders", n, lease, at=at(clock))


def test_a_failing_message_holds_back_its_key_and_nothing_else(ordered):
    """SQS FIFO: "messages that belong to the same message group are processed one by one"; a
    message of another group is not held back. Pub/Sub ordering keys: the same, per key."""
    a1, b1, a2, b2, a3 = publish(ordered, "ababa")
    first = received(ordered)
    assert [m.message_id for m in first] == [a1, b1]  # one message per key per receive
    ordered.nack("billing", [m for m in first if m.key == "a"], error="boom", at=at(0))
    ordered.ack("billing", [m for m in first if m.key == "b"])
    assert [m.message_id for m in received(ordered)] == [b2]  # b moves on; a waits for its retry
    assert rows(ordered)[a2] == rows(ordered)[a3] == "BLOCKED"
    assert rows(ordered)[a1] == "WAITING_RETRY"
    # the unordered group of the same topic is not held back at all
    assert [m.message_id for m in received(ordered, group="audit")] == [a1, b1, a2, b2, a3]


def test_the_retry_wait_keeps_the_key_blocked_and_the_head_goes_first(ordered):
    """SQS FIFO: a message's backoff counts as blocked time for its group; its retry is delivered
    before the later messages of the group."""
    a1, a2 = publish(ordered, "aa")
    [head] = received(ordered)
    ordered.nack("billing", head, error="boom", at=at(0))
    assert received(ordered, clock=5) == []  # a2 is not handed out while a1 waits
    run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="w"), url=ordered.url)
    [again] = received(ordered, clock=10)
    assert (again.message_id, again.delivery_count) == (a1, 2)
    ordered.ack("billing", again)
    [after] = received(ordered, clock=10)
    assert after.message_id == a2 and rows(ordered) == {a2: "INFLIGHT"}


def test_a_lease_expiry_counts_the_failed_delivery_and_keeps_the_key(ordered):
    """RocketMQ orderly consumption: a message not acknowledged in time is delivered again before
    the next of its queue; the expiry is a failed delivery, as for any subscription."""
    a1, a2 = publish(ordered, "aa")
    received(ordered, lease=5)
    run_tier(TierRunRequest(tier="seconds", window_end=at(6), run_key="w"), url=ordered.url)
    assert rows(ordered) == {a1: "WAITING_RETRY", a2: "BLOCKED"}
    run_tier(TierRunRequest(tier="seconds", window_end=at(20), run_key="w2"), url=ordered.url)
    [again] = received(ordered, clock=20)
    assert (again.message_id, again.delivery_count, again.reconsume_times) == (a1, 2, 1)


def test_keyless_messages_are_unordered(ordered):
    """Pub/Sub: messages without an ordering key are delivered in any order, as today."""
    n1, n2, n3 = publish(ordered, "---")
    got = received(ordered)
    assert [m.message_id for m in got] == [n1, n2, n3]
    ordered.nack("billing", got[0], error="boom", at=at(0))
    ordered.ack("billing", got[1:])
    assert rows(ordered) == {n1: "WAITING_RETRY"}


@pytest.mark.parametrize("how", ["reject", "exhausted"])
def test_continue_dead_letters_the_head_and_releases_its_key(client, how):
    """SQS FIFO with a redrive policy and RocketMQ orderly: a message that used up its retries goes
    to the dead-letter queue and the next message of its group is delivered (on_exhausted:
    continue, the default)."""
    client.create_topic("orders")
    client.create_group("billing", max_reconsume_times=0)
    client.subscribe("billing", "orders", ordered=True)
    a1, a2, a3 = publish(client, "aaa")
    [head] = received(client)
    if how == "reject":
        client.reject("billing", head, error="bad")
    else:
        client.nack("billing", head, error="boom", at=at(0))
    assert rows(client) == {a2: "READY", a3: "BLOCKED"}
    [nxt] = received(client)
    assert nxt.message_id == a2
    assert client.stats()["orders"]["billing"] == {
        "READY": 0, "INFLIGHT": 1, "WAITING_RETRY": 0, "COMMITTED": 0, "DLQ": 1, "BLOCKED": 1,
    }  # fmt: skip


def test_halt_holds_the_key_until_its_dead_letter_is_redriven(client):
    """on_exhausted: halt, for a pipeline that must never apply an event ahead of a lost one (the
    operator decides, as Pulsar's and SQS's users do with a dead-letter queue they redrive)."""
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True, on_exhausted="halt")
    a1, a2, b1 = publish(client, "aab")
    first = received(client)
    client.reject("billing", [m for m in first if m.key == "a"], error="bad")
    client.ack("billing", [m for m in first if m.key == "b"])
    assert rows(client) == {a1: "HALTED", a2: "BLOCKED"}
    assert received(client) == []
    [a3] = publish(client, "a", clock=1)  # a message of the halted key published later waits too
    assert received(client) == [] and rows(client)[a3] == "BLOCKED"
    states = client.stats()["orders"]["billing"]
    assert (states["DLQ"], states["BLOCKED"], states["COMMITTED"]) == (1, 2, 1)  # a1 counted once

    redrive(RedriveRequest(group="billing", dry_run=False), run_key="r", url=client.url, log=lambda *_: 0)
    assert rows(client) == {a1: "READY", a2: "BLOCKED", a3: "BLOCKED"}
    for expected in (a1, a2, a3):
        [m] = received(client)
        assert m.message_id == expected
        client.ack("billing", m)
    assert rows(client) == {} and client.stats()["orders"]["billing"]["COMMITTED"] == 4


def test_a_redriven_dead_letter_enters_behind_its_keys_current_head(ordered):
    """A redrive of an ordered dead letter while its key moved on: it waits behind the key's
    current head and comes next (its id is older than every later message of the key)."""
    a1, a2, a3 = publish(ordered, "aaa")
    [head] = received(ordered)
    ordered.reject("billing", head, error="bad")
    [current] = received(ordered)
    assert current.message_id == a2
    redrive(RedriveRequest(group="billing", dry_run=False), run_key="r", url=ordered.url, log=lambda *_: 0)
    assert rows(ordered) == {a1: "BLOCKED", a2: "INFLIGHT", a3: "BLOCKED"}
    ordered.ack("billing", current)
    assert [m.message_id for m in received(ordered)] == [a1]


def test_a_blocked_key_never_starves_the_others(ordered):
    """SQS FIFO: a receive scans past a blocked message group for the others; here the offset moves
    past a blocked key's messages, which wait as BLOCKED rows, until the batch is full."""
    publish(ordered, "h")
    [hot] = received(ordered)
    ordered.nack("billing", hot, error="boom", at=at(0))
    publish(ordered, "h" * 300 + "x", clock=1)
    got = received(ordered, n=10, clock=1)  # passes all 300 blocked ones, then x
    assert [m.key for m in got] == ["x"]
    assert ordered.stats()["orders"]["billing"]["BLOCKED"] == 300


def test_ordering_is_for_life_and_a_refused_subscribe_changes_nothing(ordered):
    before = snapshot(ordered.conn)
    with pytest.raises(ValueError, match="ordered .* already"):
        ordered.subscribe("billing", "orders", ordered=False)
    with pytest.raises(ValueError, match="ordered .* already"):
        ordered.subscribe("billing", "orders", ordered=True, on_exhausted="halt")
    with pytest.raises(ValueError, match="unordered already"):
        ordered.subscribe("audit", "orders", ordered=True)
    with pytest.raises(ValueError, match="ordered subscription only"):
        ordered.subscribe("audit", "orders", on_exhausted="halt")
    with pytest.raises(ValueError, match="continue' or 'halt"):
        ordered.subscribe("billing", "orders", ordered=True, on_exhausted="stop")
    assert snapshot(ordered.conn) == before
    ordered.subscribe("billing", "orders", ordered=True)  # the same ordering: idempotent
    ordered.subscribe("billing", "orders")  # not said: the subscription keeps its own
    ordered.subscribe("audit", "orders")
    assert snapshot(ordered.conn) == before


def test_one_head_per_key_is_the_databases_rule(ordered):
    """Whatever a statement gets wrong, PostgreSQL refuses a second unfinished head of a key (an
    exclusion constraint: ``deliveries_one_head``)."""
    import psycopg

    a1, a2 = publish(ordered, "aa")
    received(ordered)
    with pytest.raises(psycopg.errors.ExclusionViolation):
        ordered.conn.execute("UPDATE redelivery.deliveries SET state = 'READY' WHERE message_id = %s", (a2,))


def test_blocked_keys_and_the_oldest_blocked_age_are_metrics(ordered):
    """SQS has no such gauge; RocketMQ's consumer lag latency is the model: how long the message
    held back the longest has waited, and how many keys are held."""
    from test_metrics import scrape, value

    publish(ordered, "aabbc")
    first = received(ordered)
    ordered.nack("billing", [m for m in first if m.key in "ab"], error="boom", at=at(0))
    ordered.ack("billing", [m for m in first if m.key == "c"])
    ordered.conn.execute(
        "UPDATE redelivery.deliveries SET created_at = %s WHERE state = 'BLOCKED'", (at(0),)
    )  # the offset passed them at 0 s (the database clock is today)
    samples = scrape(ordered.conn, at(42))
    assert value(samples, "redelivery_blocked_keys", topic="orders", group="billing") == 2
    assert value(samples, "redelivery_blocked_oldest_age_seconds", topic="orders", group="billing") == 42
    assert value(samples, "redelivery_messages", topic="orders", group="billing", state="BLOCKED") == 2
    assert value(samples, "redelivery_blocked_keys", topic="orders", group="audit") == 0


def test_the_configs_policy_orders_a_subscription_when_the_call_does_not_say(client):
    """A policy (Artemis wildcards, most specific wins) may make every subscription of its topics
    and groups ordered; the call's own ``ordered`` wins; the subscription keeps it for life."""
    from helpers import configured

    configured(
        client,
        {"topic": "orders", "ordered": True, "on_exhausted": "halt"},
        {"topic": "orders", "group": "audit", "ordered": False},
    )
    client.create_topic("orders")
    for group in ("billing", "audit", "ledger"):
        client.create_group(group)
    client.subscribe("billing", "orders")
    client.subscribe("audit", "orders")
    client.subscribe("ledger", "orders", ordered=False)
    with pytest.raises(ValueError, match="policy .* is unordered"):
        client.subscribe("audit", "orders", on_exhausted="halt")
    rows = client.conn.execute(
        "SELECT g.name, s.ordered, s.on_exhausted FROM redelivery.subscriptions s"
        " JOIN redelivery.consumer_groups g ON g.id = s.group_id ORDER BY 1"
    ).fetchall()
    assert rows == [("audit", False, "continue"), ("billing", True, "halt"), ("ledger", False, "continue")]


def test_the_cli_subscribes_ordered_and_refuses_a_bad_on_exhausted(clean_db):
    from helpers import run_cli

    for args in (("create-topic", "orders"), ("create-group", "billing")):
        assert run_cli(*args, database_url=clean_db).returncode == 0
    refused = run_cli("subscribe", "billing", "orders", "--on-exhausted", "stop", database_url=clean_db)
    assert refused.returncode == 2 and "on_exhausted must be 'continue' or 'halt'" in refused.stderr
    ordered = ("subscribe", "billing", "orders", "--ordered", "--on-exhausted", "halt")
    done = run_cli(*ordered, database_url=clean_db)
    assert done.returncode == 0, done.stderr
    stats = run_cli("stats", "--json", database_url=clean_db).stdout
    assert '"BLOCKED": 0' in stats


def test_the_page_shows_an_ordered_groups_held_keys(ordered):
    """The operator page (issues 31, 36): the keys a group holds by a failure, its BLOCKED messages,
    and since when the oldest waits (tests/messaging/test_ordered_held.py has the rest)."""
    from redelivery.airflow.ui.page import page_data, render

    publish(ordered, "aabbb")
    first = received(ordered)
    ordered.nack("billing", first, error="boom", at=at(0))
    [group] = [g for g in page_data(ordered.conn)["groups"] if g["name"] == "billing"]
    held = group["held"]
    assert (held["keys"], group["BLOCKED"]) == (2, 3) and held["since"] is not None
    html = render(page_data(ordered.conn))
    assert "Ordered: 2 keys held by a failure; 3 messages BLOCKED in all, the oldest waiting since" in html
    [audit] = [g for g in page_data(ordered.conn)["groups"] if g["name"] == "audit"]
    assert (audit["held"]["keys"], audit["BLOCKED"]) == (0, 0)


def test_a_key_whose_head_is_leased_again_holds_its_new_messages(ordered):
    """A retried head promoted READY, and a later message of its key published since: the receive
    that leases the head again must hold the new message back (the lock of the head's row, which
    that same statement changes, does not see it: an adversary's review found every receive
    failing here)."""
    a1, b1 = publish(ordered, "ab")
    first = received(ordered)
    ordered.nack("billing", [m for m in first if m.key == "a"], error="boom", at=at(0))
    ordered.ack("billing", [m for m in first if m.key == "b"])
    run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="w"), url=ordered.url)
    a2, b2 = publish(ordered, "ab", clock=10)
    got = received(ordered, clock=10)
    assert sorted(m.message_id for m in got) == [a1, b2]
    assert rows(ordered) == {a1: "INFLIGHT", a2: "BLOCKED", b2: "INFLIGHT"}
    ordered.ack("billing", got)
    assert [m.message_id for m in received(ordered, clock=10)] == [a2]


def test_a_halted_key_is_released_when_retention_deletes_its_dead_letter(client):
    """on_exhausted halt, and retention.dead_letters deletes the dead letter: the key's next
    message goes on (it would wait for ever for a redrive that can no longer happen)."""
    from redelivery.config import RedeliveryConfig
    from redelivery.store import maintenance

    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True, on_exhausted="halt")
    a1, a2 = publish(client, "aa")
    client.reject("billing", received(client), error="bad")
    client.conn.execute("UPDATE redelivery.dlq_messages SET dead_lettered_at = now() - interval '31 days'")
    config = RedeliveryConfig.model_validate({"retention": {"dead_letters": "30d"}})
    assert maintenance.cleanup(client.conn, config)["dead_letters"] == 1
    assert rows(client) == {a2: "READY"}
    states = client.stats()["orders"]["billing"]
    assert (states["READY"], states["DLQ"], states["BLOCKED"], states["COMMITTED"]) == (1, 0, 0, 0)


def test_a_redriven_halted_head_keeps_its_failure(client):
    """The HALTED row holds what the dead letter holds: redriven, the head comes back with its last
    error and history, as a dead letter of an unordered subscription does."""
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True, on_exhausted="halt")
    [a1] = publish(client, "a")
    client.reject("billing", received(client), error="bad payload")
    redrive(RedriveRequest(group="billing", dry_run=False), run_key="r", url=client.url, log=lambda *_: 0)
    [again] = received(client)
    assert (again.message_id, again.last_error, again.delivery_count) == (a1, "bad payload", 2)
