"""Ordered subscriptions (issue 36): no number of blocked messages holds back a free key."""

from __future__ import annotations

import pytest

from helpers import at
from redelivery.messaging.codec import Message
from redelivery.messaging.receipts import Outcome

FAR = 864_000  # seconds: a retry never due in a test


@pytest.fixture()
def ordered(client):
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True)
    return client


def publish(client, keys: str | list[str], clock: float = 0) -> list[int]:
    """One message per key (a character of a string, or an item of a list)."""
    return client.publish("orders", [Message({"n": i}, key=k) for i, k in enumerate(keys)], at=at(clock))


def hot_head(client) -> int:
    """Key ``hot``'s head, received and retried far out: every later message of ``hot`` waits."""
    [head] = publish(client, ["hot"])
    [got] = client.receive("billing", "orders", 10, 30, at=at(0))
    client.reconsume_later("billing", got, delay=FAR, at=at(0))
    return head


def test_a_free_key_behind_ten_thousand_blocked_messages_comes_on_the_first_receive(ordered):
    """SQS FIFO scans past blocked message groups for the others. Here a receive goes on past the
    offset until its batch is full or nothing is left there: 10,000 messages of a key held by a
    retry, then a free key's message, which the first receive of 100 hands out (issue 36: a receive
    read 4x its batch, handed out nothing, and its caller stopped)."""
    hot_head(ordered)
    publish(ordered, ["hot"] * 10_000 + ["cold"], clock=1)
    got = ordered.receive("billing", "orders", 100, 30, at=at(1))
    assert [m.key for m in got] == ["cold"]
    states = ordered.stats()["orders"]["billing"]
    assert (states["READY"], states["BLOCKED"], states["WAITING_RETRY"]) == (0, 10_000, 1)


def test_drain_does_not_stop_before_a_free_key(ordered):
    """Issue 36's case: key hot's head waits for a retry, 450 more hot messages follow, then one of
    key cold: the consumer DAG's drain (batches of 100) delivers cold (it stopped at an empty first
    receive, stats said READY 51)."""
    from redelivery.airflow.http_delivery import drain

    hot_head(ordered)
    publish(ordered, ["hot"] * 450 + ["cold"], clock=1)
    delivered = []

    def deliver(batch):
        delivered.extend(m.key for m in batch)
        return [Outcome(m, "ack") for m in batch]

    counts = drain(ordered, "orders", "billing", deliver, batch_size=100)
    assert delivered == ["cold"] and counts["acked"] == 1
    states = ordered.stats()["orders"]["billing"]
    assert (states["READY"], states["BLOCKED"], states["COMMITTED"]) == (0, 450, 1)


def test_a_pass_that_finds_nothing_free_is_committed_and_the_receive_goes_on(ordered):
    """A receive's transaction passes over at most 20,000 messages (SQS FIFO's scan); one that
    handed nothing out commits what it wrote and the receive goes on in another: 25,000 blocked
    messages, then a free one, still come in one receive."""
    from redelivery.rules.ordering import MAX_ORDERED_SCAN

    hot_head(ordered)
    publish(ordered, ["hot"] * (MAX_ORDERED_SCAN + 5_000) + ["cold"], clock=1)
    assert [m.key for m in ordered.receive("billing", "orders", 500, 30, at=at(1))] == ["cold"]
    assert ordered.stats()["orders"]["billing"]["BLOCKED"] == MAX_ORDERED_SCAN + 5_000
