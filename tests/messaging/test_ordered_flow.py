"""Ordered subscriptions (issue 36): no number of blocked messages holds back a free key, and the
ready-backlog cap counts what an ordered group has waiting (BLOCKED messages too)."""

from __future__ import annotations

import pytest

from helpers import at, configured
from redelivery.errors import TooManyRequestsError
from redelivery.messaging.codec import Message
from redelivery.messaging.receipts import Outcome
from redelivery.redrive import RedriveRequest, redrive
from redelivery.tiers.run import TierRunRequest, run_tier

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


# ---- the ready-backlog cap -------------------------------------------------------------------------


@pytest.fixture()
def capped(client):
    """billing subscribed ordered to orders, with a ready-backlog cap of 5."""
    configured(client, {"topic": "orders", "group": "billing", "max_ready_backlog": 5})
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True)
    return client


def test_blocked_messages_count_against_the_ready_backlog_cap(capped):
    """RocketMQ's flow control caps the messages a group has waiting. An ordered group's BLOCKED
    messages wait as its READY ones do: a receive that turns messages past the offset into BLOCKED
    rows does not make room for more (issue 36: 4 BLOCKED rows left room for 5 more)."""
    publish(capped, "aaaaa")
    [head] = capped.receive("billing", "orders", 10, 30, at=at(0))
    assert capped.stats()["orders"]["billing"]["BLOCKED"] == 4
    publish(capped, "b", clock=1)  # 4 waiting + 1: at the cap
    with pytest.raises(TooManyRequestsError, match="has 5 "):
        capped.publish("orders", [Message({"n": 9}, key="c")], retry=False)
    capped.ack("billing", head)  # a promotion by the trigger: BLOCKED -> READY, the same backlog
    with pytest.raises(TooManyRequestsError):
        capped.publish("orders", [Message({"n": 9}, key="c")], retry=False)


def test_a_due_head_is_promoted_past_the_cap_its_blocked_messages_fill(capped):
    """BLOCKED messages take room under the cap as READY ones do, but a key's due head is promoted
    whatever the room: the messages waiting behind it are counted already, and holding it back could
    leave nothing that makes room (test_ordered_cap.py). Keyless retries wait for room."""
    publish(capped, "abcde")
    capped.nack("billing", capped.receive("billing", "orders", 10, 30, at=at(0)), error="boom", at=at(0))
    publish(capped, "abcd", clock=1)
    assert capped.receive("billing", "orders", 10, 30, at=at(1)) == []  # all four behind a retry
    result = run_tier(
        TierRunRequest(tier="seconds", window_end=at(20), run_key="w"), url=capped.url, config=capped.config
    )
    assert result["promoted"] == 5  # 4 BLOCKED + 5 heads: one over the cap a held key
    states = capped.stats()["orders"]["billing"]
    assert (states["READY"], states["BLOCKED"], states["WAITING_RETRY"]) == (5, 4, 0)


def test_a_redrive_into_an_ordered_group_counts_its_blocked_rows_under_the_cap(capped):
    """A redrive under a cap moves what fits (held_by_backlog_cap counts the rest): dead letters
    that come back BLOCKED behind their key's head take room as READY ones do."""
    publish(capped, "aaa")
    for _ in range(3):
        [m] = capped.receive("billing", "orders", 10, 30, at=at(0))
        capped.reject("billing", m, error="bad")
    publish(capped, "aa", clock=1)
    [head] = capped.receive("billing", "orders", 10, 30, at=at(1))  # a's head; one BLOCKED behind
    publish(capped, "xy", clock=1)  # 3 waiting: room for 2
    request = RedriveRequest(group="billing", dry_run=False)
    done = redrive(request, run_key="r", url=capped.url, log=lambda *_: 0, config=capped.config)
    assert (done["moved"], done["held_by_backlog_cap"]) == (2, 1)
    states = capped.stats()["orders"]["billing"]
    assert (states["READY"], states["BLOCKED"], states["DLQ"]) == (2, 3, 1)
