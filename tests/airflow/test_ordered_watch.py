"""An ordered subscription under its asset watcher and the consumer DAG's drain (issue 36): the event
of a publish starts a drain that delivers a free key's message whatever number of blocked messages
come before it, and a key's next message, made READY when its head ends, fires an event of its own."""

from __future__ import annotations

import asyncio

import pytest

from helpers import TriggerWatch, at
from redelivery.messaging.codec import Message
from redelivery.messaging.receipts import Outcome
from redelivery.tiers.run import TierRunRequest, run_tier

pytestmark = pytest.mark.airflow  # Airflow's trigger base class

HOT = 150  # more than the 100 messages a receive of 10 read past the offset before issue 36


def test_the_watchers_event_drains_a_free_key_and_a_released_key_fires_again(client):
    from redelivery.airflow.http_delivery import drain
    from redelivery.airflow.triggers import ReadyMessagesTrigger

    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True)
    [head] = client.publish("orders", [Message({"n": 0}, key="hot")], at=at(0))
    client.nack("billing", client.receive("billing", "orders", 10, 30, at=at(0)), error="boom", at=at(0))
    delivered: list[tuple[str, int]] = []

    def deliver(batch):
        delivered.extend((m.key, m.message_id) for m in batch)
        return [Outcome(m, "ack") for m in batch]

    def drain_now() -> None:
        drain(client, "orders", "billing", deliver, batch_size=10)

    async def scenario():
        trigger = ReadyMessagesTrigger(topic="orders", group="billing", poll_interval=0.1, settle_timeout=2.0)
        async with TriggerWatch(trigger) as watch:
            messages = [Message({"n": i}, key="hot") for i in range(HOT)] + [Message({"n": -1}, key="cold")]
            await asyncio.to_thread(client.publish, "orders", messages)
            await watch.until(1)
            await asyncio.to_thread(drain_now)  # what the consumer DAG's run of the event does
            assert [k for k, _ in delivered] == ["cold"]
            # the head's retry comes due and is promoted: an event, and a drain delivers it; its ack
            # makes the key's next message READY (finish_ordered_heads): an event of its own
            promote = TierRunRequest(tier="seconds", window_end=at(20), run_key="w")
            await asyncio.to_thread(run_tier, promote, url=client.url)
            await watch.until(2)
            got = await asyncio.to_thread(client.receive, "billing", "orders", 10, 30)
            assert [m.message_id for m in got] == [head]
            events = len(watch.events)
            await asyncio.to_thread(client.ack, "billing", got)
            await watch.until(events + 1)
            assert watch.events[-1]["ready"] == 1  # the key's next message, READY

    asyncio.run(scenario())
