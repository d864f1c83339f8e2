"""Keys of any length, dead-lettered too (issue 36, point 1): a btree entry holds 2,704 bytes at most,
and 0011's dlq_messages_key held the key itself, so a message whose key is longer and does not
compress could not enter a DLQ table: its reject failed, a nack past its retries failed with its
whole batch, and a tier run's expired lease failed the window for every group, window after
window. 0016 indexes the key's digest (dlq_messages_key_digest)."""

from __future__ import annotations

import os
import random

from helpers import at
from redelivery.messaging.codec import Message
from redelivery.redrive import RedriveRequest, redrive
from redelivery.tiers.run import TierRunRequest, run_tier


def test_a_long_keyed_head_can_be_rejected(client):
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True)
    long = os.urandom(1500).hex()
    client.publish("orders", [Message({"n": 1}, key=long), Message({"n": 2}, key=long)], at=at(0))
    [head] = client.receive("billing", "orders", 10, 30, at=at(0))
    client.reject("billing", head, error="bad")  # was ProgramLimitExceeded: dlq_messages_key
    [nxt] = client.receive("billing", "orders", 10, 30, at=at(1))
    assert nxt.key == long and nxt.message_id > head.message_id
    from redelivery.dead_letters import DlqFilter, count

    assert count(client.conn, DlqFilter(group="billing")) == 1


def test_a_tier_run_dead_letters_a_long_keyed_message_and_the_others(client):
    client.create_topic("orders")
    client.create_group("billing", max_reconsume_times=1)
    client.subscribe("billing", "orders", ordered=True)
    long = os.urandom(1500).hex()
    client.publish("orders", [Message({"n": 1}, key=long), Message({"n": 2}, key="short")], at=at(0))
    client.nack("billing", client.receive("billing", "orders", 10, 30, at=at(0)), error="e", at=at(0))
    run_tier(TierRunRequest(tier="seconds", window_end=at(20), run_key="w1"), url=client.url)
    client.nack("billing", client.receive("billing", "orders", 10, 30, at=at(20)), error="e", at=at(20))
    result = run_tier(TierRunRequest(tier="minutes", window_end=at(4000), run_key="w2"), url=client.url)
    states = client.stats()["orders"]["billing"]
    assert states["DLQ"] == 2, (result, states)


def test_a_tier_run_is_not_stopped_by_one_long_key(client):
    """The tier run dead-letters an expired lease of a long-keyed message (max_reconsume_times 1)
    beside another group's short-keyed one: does the whole window fail?"""
    client.create_topic("orders")
    client.create_group("billing", max_reconsume_times=1)
    client.create_group("audit", max_reconsume_times=1)
    client.subscribe("billing", "orders", ordered=True)
    client.subscribe("audit", "orders")
    long = os.urandom(1500).hex()
    client.publish("orders", [Message({"n": 1}, key=long)], at=at(0))
    for g in ("billing", "audit"):
        client.nack(g, client.receive(g, "orders", 10, 30, at=at(0)), error="e", at=at(0))
    run_tier(TierRunRequest(tier="seconds", window_end=at(20), run_key="w1"), url=client.url)
    for g in ("billing", "audit"):
        assert len(client.receive(g, "orders", 10, 5, at=at(20))) == 1  # leases run out at 25 s
    result = run_tier(TierRunRequest(tier="seconds", window_end=at(60), run_key="w2"), url=client.url)
    assert result["dead_lettered"] == 2, result
    stats = client.stats()["orders"]
    assert stats["billing"]["DLQ"] == 1 and stats["audit"]["DLQ"] == 1, stats


def test_a_ten_kilobyte_multibyte_key_everywhere(client):
    from test_metrics import scrape, value

    from redelivery.airflow.ui.page import page_data, render
    from redelivery.dead_letters import DlqFilter, browse

    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True, on_exhausted="halt")
    rng = random.Random(7)
    key = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(3500))  # ~10.5 KB of UTF-8
    assert len(key.encode()) > 10_000
    k1, k2, e1 = client.publish(
        "orders",
        [Message({"n": 1}, key=key), Message({"n": 2}, key=key), Message({"n": 3}, key="")],
        at=at(0),
    )
    first = client.receive("billing", "orders", 10, 30, at=at(0))
    assert sorted(m.message_id for m in first) == [k1, e1]
    client.reject("billing", [m for m in first if m.message_id == k1], error="bad")
    client.ack("billing", [m for m in first if m.message_id == e1])
    assert client.receive("billing", "orders", 10, 30, at=at(1)) == []
    group = [g for g in page_data(client.conn)["groups"] if g["name"] == "billing"][0]
    assert group["held"]["keys"] == 1 and group["held"]["list"][0]["behind"] == 1
    render(page_data(client.conn))
    assert value(scrape(client.conn, at(2)), "redelivery_blocked_keys", topic="orders", group="billing") == 1
    rows, _ = browse(client.conn, DlqFilter(group="billing"))
    assert [(r["message_id"], r["halting"], r["behind"]) for r in rows] == [(k1, True, 1)]
    done = redrive(
        RedriveRequest(group="billing", dry_run=False),
        run_key="r",
        url=client.url,
        log=lambda *_: 0,
        config=client.config,
    )
    assert done["moved"] == 1
    [again] = client.receive("billing", "orders", 10, 30, at=at(3))
    assert (again.message_id, again.key) == (k1, key)
    client.ack("billing", again)
    [nxt] = client.receive("billing", "orders", 10, 30, at=at(3))
    assert (nxt.message_id, nxt.key) == (k2, key)


def test_the_page_finds_the_dead_letters_of_a_key_too_long_for_its_index(client):
    """The page's search by key: a key over the index's 2,000 bytes (and under the filter's 1,000
    characters) is found among the group's rows, a short one through the index; each only its own."""
    from redelivery.dead_letters import DlqFilter, browse

    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders")
    long = "\u6f22" * 700  # 2,100 bytes of UTF-8
    ids = client.publish(
        "orders", [Message({"n": n}, key=k) for n, k in enumerate([long, "short", long])], at=at(0)
    )
    client.reject("billing", client.receive("billing", "orders", 10, 30, at=at(0)), error="bad")
    for key, expected in ((long, [ids[2], ids[0]]), ("short", [ids[1]])):
        rows, _ = browse(client.conn, DlqFilter(group="billing", key=key))
        assert [r["message_id"] for r in rows] == expected
