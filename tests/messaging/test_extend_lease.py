"""Lease extension for long work (SQS ChangeMessageVisibility, Kafka KIP-1222's RENEW): a receipt
still in flight gets a new lease end, its delivery count unchanged; a stale one changes nothing and
is counted; a refused call changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from helpers import at, message_state, snapshot
from redelivery.client import Receipt
from redelivery.errors import ForeignReceiptError
from redelivery.tiers.run import TierRunRequest, run_tier


def test_an_extended_lease_outlives_the_tier_run_of_its_old_end(client, topic_group, database_url):
    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    [got] = client.receive("billing", "orders", 1, 10, at=at(0))  # lease to 10 s
    assert client.extend_lease("billing", got, 600, at=at(5)) == 1  # to 605 s
    state = message_state(client.conn, mid)
    assert (state["state"], state["delivery_count"], state["invisible_until"]) == (
        "INFLIGHT", 1, at(5) + timedelta(seconds=600),
    )  # fmt: skip
    run_tier(TierRunRequest(tier="seconds", window_end=at(20), run_key="old-end"), url=database_url)
    assert message_state(client.conn, mid)["state"] == "INFLIGHT"  # not expired at the old end
    assert client.ack("billing", got) == 1
    assert client.stale_receipts("billing") == 0


def test_a_stale_receipt_extends_nothing_and_is_counted(client, topic_group, database_url):
    client.publish("orders", [{"n": 1}, {"n": 2}], at=at(0))
    first, second = client.receive("billing", "orders", 2, 10, at=at(0))
    client.ack("billing", first)
    run_tier(
        TierRunRequest(tier="seconds", window_end=at(20), run_key="expire"), url=database_url
    )  # second's lease ends
    [again] = client.receive("billing", "orders", 1, 30, at=at(40))  # its retry, promoted and received again
    assert again.message_id == second.message_id and again.delivery_count == 2
    before = snapshot(client.conn, leave_out=("redelivery.consumer_groups",))
    assert client.extend_lease("billing", [first, second], 600) == 0  # answered; a delivery before
    assert snapshot(client.conn, leave_out=("redelivery.consumer_groups",)) == before
    assert client.stale_receipts("billing") == 2
    receipt = Receipt(again.message_id, 2, "orders", "billing")
    assert client.extend_lease("billing", [receipt], 60, at=at(41)) == 1  # its lease runs to 70 s


@pytest.mark.parametrize("seconds", [0, 0.5, 43_201, True, "60"])
def test_a_lease_out_of_bounds_is_refused_and_changes_nothing(client, topic_group, seconds):
    client.publish("orders", [{"n": 1}])
    got = client.receive("billing", "orders", 1, 30)
    before = snapshot(client.conn)
    with pytest.raises(ValueError, match="invisible_duration must be 1..43200 seconds"):
        client.extend_lease("billing", got, seconds)
    assert snapshot(client.conn) == before


def test_a_foreign_receipt_is_refused_and_changes_nothing(client, topic_group):
    client.create_topic("refunds")
    client.subscribe("billing", "refunds")
    client.create_group("audit")
    client.publish("orders", [{"n": 1}])
    [got] = client.receive("billing", "orders", 1, 30)
    before = snapshot(client.conn)
    with pytest.raises(ForeignReceiptError, match="received by group 'billing'"):
        client.extend_lease("audit", got, 60)
    wrong_topic = Receipt(got.message_id + 1000, 1, "refunds", "billing")
    with pytest.raises(ForeignReceiptError, match="not a message of topic 'refunds'"):
        client.extend_lease("billing", [got, wrong_topic], 60)  # the good one is not extended either
    with pytest.raises(TypeError):
        client.extend_lease("billing", [(got.message_id, 1)], 60)
    assert snapshot(client.conn) == before


def test_a_lease_that_ended_is_not_renewed_and_its_receipt_is_stale(client, topic_group):
    """Issue 27 item 9: only a lease still running at the call's time (``at``, or now) is extended
    (SQS answers MessageNotInflight); a lease that ended, even with no tier run since, keeps its
    end, and the receipt is counted stale."""
    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    [got] = client.receive("billing", "orders", 1, 10, at=at(0))  # the lease ends at 10 s
    before = snapshot(client.conn, leave_out=("redelivery.consumer_groups",))
    assert client.extend_lease("billing", got, 600, at=at(3600)) == 0  # an hour after it ended
    assert client.extend_lease("billing", got, 600, at=at(10)) == 0  # at its very end: ended
    assert client.extend_lease("billing", got, 600) == 0  # the database's clock: long after
    assert snapshot(client.conn, leave_out=("redelivery.consumer_groups",)) == before
    state = message_state(client.conn, mid)
    assert (state["state"], state["delivery_count"], state["invisible_until"]) == ("INFLIGHT", 1, at(10))
    assert client.stale_receipts("billing") == 3
    assert client.extend_lease("billing", got, 600, at=at(9)) == 1  # still running at 9 s
    assert message_state(client.conn, mid)["invisible_until"] == at(609)
