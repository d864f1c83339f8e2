"""Ordered subscriptions' keys (issue 36): a key of any length a publish takes works, two keys are
never taken for one (whatever their digests), and ``""`` is no key (Pub/Sub ordering keys)."""

from __future__ import annotations

import os

import pytest

from helpers import at
from redelivery.messaging.codec import Message
from redelivery.tiers.run import TierRunRequest, run_tier


@pytest.fixture()
def ordered(client):
    """Topic ``orders``, group ``billing`` subscribed ordered."""
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True)
    return client


def publish(client, keys: list[str | None], clock: float = 0) -> list[int]:
    return client.publish("orders", [Message({"n": i}, key=k) for i, k in enumerate(keys)], at=at(clock))


def received(client, n: int = 50, clock: float = 0):
    return client.receive("billing", "orders", n, 30, at=at(clock))


def test_a_long_incompressible_key_is_a_key_like_any_other(ordered):
    """Issue 36: a key of 3,000 random bytes (no index entry of PostgreSQL's btree holds it: 2,704
    bytes at most) made every receive of the subscription raise ProgramLimitExceeded, for good. The
    indexes hold a digest of the key now; the key is compared exactly."""
    long = os.urandom(1500).hex()  # 3,000 characters that do not compress
    other = long[:-1] + ("0" if long[-1] != "0" else "1")  # differs in its last character only
    l1, o1, l2 = publish(ordered, [long, other, long])
    first = received(ordered)
    assert sorted(m.message_id for m in first) == [l1, o1]  # two keys, not one
    ordered.nack("billing", [m for m in first if m.message_id == l1], error="boom", at=at(0))
    ordered.ack("billing", [m for m in first if m.message_id == o1])
    assert received(ordered, clock=1) == []  # l2 waits behind its head's retry
    run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="w"), url=ordered.url)
    [again] = received(ordered, clock=10)
    assert (again.message_id, again.key, again.delivery_count) == (l1, long, 2)
    ordered.ack("billing", again)
    [nxt] = received(ordered, clock=10)
    assert (nxt.message_id, nxt.key) == (l2, long)


def _colliding_keys(client) -> tuple[str, str]:
    """Two keys whose ordering units (``ordering_key(topic, group, key)``) have the same 32-bit hash
    (the hash index's hash code): found among 200,000 candidates (about four pairs expected)."""
    row = client.conn.execute(
        """SELECT min(k), max(k) FROM (
             SELECT 'c' || i AS k FROM generate_series(1, 200000) i) c
           CROSS JOIN (SELECT s.topic_id, s.group_id FROM redelivery.subscriptions s
                       JOIN redelivery.consumer_groups g ON g.id = s.group_id WHERE g.name = 'billing') s
           GROUP BY hashtext(redelivery.ordering_key(s.topic_id, s.group_id, c.k)) HAVING count(*) > 1
           LIMIT 1"""
    ).fetchone()
    assert row is not None, "no two candidates collide: look at more"
    return row


def test_keys_whose_hashes_collide_are_two_keys(ordered):
    """The one-head rule is an exclusion constraint on a hash index of the ordering unit: PostgreSQL
    compares the units exactly when their hash codes are equal. Two keys with equal hash codes each
    get their own head, and one's failure holds back only its own later messages."""
    a, b = _colliding_keys(ordered)
    a1, b1, a2, b2 = publish(ordered, [a, b, a, b])
    first = received(ordered)
    assert sorted(m.message_id for m in first) == [a1, b1]
    ordered.nack("billing", [m for m in first if m.key == a], error="boom", at=at(0))
    ordered.ack("billing", [m for m in first if m.key == b])
    assert [m.message_id for m in received(ordered, clock=1)] == [b2]


def test_an_empty_key_is_no_key(ordered):
    """``""`` is no ordering key, as Pub/Sub's empty ordering key (SQS refuses an empty message
    group id): messages published with it are delivered as keyless ones, unordered; the consumer
    still sees the key it was published with."""
    e1, e2, k1 = publish(ordered, ["", "", "k"])
    first = received(ordered)
    assert [(m.message_id, m.key) for m in first] == [(e1, ""), (e2, ""), (k1, "k")]
    ordered.nack("billing", first[0], error="boom", at=at(0))
    ordered.ack("billing", first[1:])
    [e3] = publish(ordered, [""], clock=1)
    assert [m.message_id for m in received(ordered, clock=1)] == [e3]  # not held behind e1's retry
