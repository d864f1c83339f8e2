"""The ready-backlog cap never holds back a key's head (issue 36, point 3): BLOCKED messages count
against the cap, so a held key's own BLOCKED messages could fill it; its head was then promoted or
redriven only into room under the cap, and nothing else could make room (publish refused, receive
empty): the group stalled for good. A due head is promoted, and a dead letter that holds its key
redriven, whatever the cap (the backlog passes it by one a held key)."""

from __future__ import annotations

import pytest

from helpers import at, configured
from redelivery.errors import TooManyRequestsError
from redelivery.messaging.codec import Message
from redelivery.tiers.run import TierRunRequest, run_tier


@pytest.fixture()
def capped(client):
    configured(client, {"topic": "orders", "group": "billing", "max_ready_backlog": 5})
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True)
    return client


def test_a_held_key_full_of_blocked_messages_never_gets_its_head_back(capped):
    capped.publish("orders", [Message({"n": i}, key="a") for i in range(5)], at=at(0))
    [head] = capped.receive("billing", "orders", 1, 30, at=at(0))
    capped.nack("billing", head, error="boom", at=at(0))  # level 1: due at 10 s
    capped.publish("orders", [Message({"n": 9}, key="a")], at=at(1))  # 5 waiting: at the cap
    assert capped.receive("billing", "orders", 10, 30, at=at(1)) == []  # 5 BLOCKED behind the retry
    for clock in (20, 40, 3600, 7200):
        run_tier(
            TierRunRequest(tier="seconds", window_end=at(clock), run_key=f"w{clock}"),
            url=capped.url,
            config=capped.config,
        )
        run_tier(
            TierRunRequest(tier="minutes", window_end=at(clock), run_key=f"m{clock}"),
            url=capped.url,
            config=capped.config,
        )
    states = capped.stats()["orders"]["billing"]
    with pytest.raises(TooManyRequestsError):
        capped.publish("orders", [Message({"n": 9}, key="b")], retry=False)
    got = capped.receive("billing", "orders", 10, 30, at=at(7200))
    assert [m.message_id for m in got] == [head.message_id], states


def test_a_halted_head_cannot_be_redriven_past_its_own_blocked_messages(client):
    from redelivery.redrive import RedriveRequest, redrive

    configured(client, {"topic": "orders", "group": "billing", "max_ready_backlog": 5})
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True, on_exhausted="halt")
    client.publish("orders", [Message({"n": i}, key="a") for i in range(5)], at=at(0))
    [head] = client.receive("billing", "orders", 1, 30, at=at(0))
    client.reject("billing", head, error="bad")  # HALTED: its dead letter holds key a
    client.publish("orders", [Message({"n": 9}, key="a")], at=at(1))  # 5 waiting: at the cap
    assert client.receive("billing", "orders", 10, 30, at=at(1)) == []
    done = redrive(
        RedriveRequest(group="billing", dry_run=False),
        run_key="r",
        url=client.url,
        log=lambda *_: 0,
        config=client.config,
    )
    assert done["moved"] == 1, done


def test_a_capped_ordered_group_promotes_its_keyless_retries_only_into_room(capped):
    """Keyless retries of a capped ordered group still wait for room; keyed heads do not."""
    capped.publish("orders", [Message({"n": i}) for i in range(3)] + [Message({"n": 3}, key="a")], at=at(0))
    got = capped.receive("billing", "orders", 10, 30, at=at(0))
    capped.nack("billing", got, error="boom", at=at(0))  # 4 retries due at 10 s
    capped.publish("orders", [Message({"n": i}) for i in range(4, 8)], at=at(1))  # 4 waiting: room 1
    run_tier(
        TierRunRequest(tier="seconds", window_end=at(20), run_key="w20"), url=capped.url, config=capped.config
    )
    states = capped.stats()["orders"]["billing"]
    # the head of key a takes the one place left; the keyless retries wait for room
    assert (states["READY"], states["WAITING_RETRY"]) == (4 + 1, 3), states


def test_a_redrive_at_the_cap_brings_back_the_dead_letters_holding_their_keys_only(client):
    """Near the cap, a redrive moves the dead letters that hold their keys (their BLOCKED messages
    are what fills it), which take the room left, and leaves the others in the DLQ, held by the cap."""
    from redelivery.redrive import RedriveRequest, redrive

    configured(client, {"topic": "orders", "group": "billing", "max_ready_backlog": 5})
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True, on_exhausted="halt")
    [keyless] = client.publish("orders", [Message({"n": 0})], at=at(0))
    client.reject("billing", client.receive("billing", "orders", 10, 30, at=at(0)), error="bad")
    client.publish("orders", [Message({"n": n}, key=k) for n, k in enumerate("aaabb", 1)], at=at(1))
    heads = client.receive("billing", "orders", 10, 30, at=at(1))  # a1, b1; 3 BLOCKED behind them
    client.reject("billing", heads, error="bad")  # both HALTED: their dead letters hold a and b
    client.publish("orders", [Message({"n": 9})], at=at(2))  # 3 + 1: room for one
    # a1 and b1 go back whatever the room, and take it: the keyless dead letter stays
    done = redrive(RedriveRequest(group="billing", dry_run=False), run_key="r", url=client.url,
                   log=lambda *_: 0, config=client.config)  # fmt: skip
    assert (done["moved"], done["held_by_backlog_cap"]) == (2, 1), done
    got = client.receive("billing", "orders", 10, 30, at=at(3))
    assert sorted(m.message_id for m in got if m.key) == sorted(m.message_id for m in heads)
    assert keyless not in [m.message_id for m in got]
