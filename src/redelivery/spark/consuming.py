"""A consumer group as a Spark batch job: every Spark task is one consumer that receives batches,
hands them to a handler, and acks, retries or rejects each message, until nothing is READY."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from datetime import datetime

from redelivery.client import Client, ReceivedMessage
from redelivery.config import RedeliveryConfig, cached_config
from redelivery.spark.tasks import run_in_tasks
from redelivery.store import db

#: A handler takes a batch and returns one outcome per message, in order: ("ack", None),
#: ("retry", error text) or ("reject", error text). It must be picklable (a module-level
#: function or an instance of a module-level class).
Handler = Callable[[list[ReceivedMessage]], list[tuple[str, str | None]]]


def consume_partition(
    url: str,
    group: str,
    topic: str,
    handler: Handler,
    batch_size: int,
    invisible_duration: int,
    at: datetime | None,
    config: RedeliveryConfig | None = None,
) -> Counter:
    """One consumer loop; returns counts of received, acked, retried and rejected messages.
    ``config``: the caller's (a Spark task gets it from the driver, whose config file it may not have)."""
    counts: Counter = Counter()
    with Client(url, config=config) as client:
        while True:
            batch = client.receive(group, topic, batch_size, invisible_duration, at=at)
            if not batch:
                return counts
            outcomes = handler(batch)
            if len(outcomes) != len(batch):
                raise ValueError(f"handler returned {len(outcomes)} outcomes for {len(batch)} messages")
            split: dict[str, list] = {"ack": [], "retry": [], "reject": []}
            for message, (outcome, error) in zip(batch, outcomes, strict=True):
                if outcome not in split:
                    raise ValueError(f"unknown outcome {outcome!r}: use 'ack', 'retry' or 'reject'")
                split[outcome].append((message, error))
            counts["received"] += len(batch)
            counts["acked"] += client.ack(group, [m for m, _ in split["ack"]])
            if split["retry"]:
                counts["retried"] += client.nack(
                    group, [m for m, _ in split["retry"]], error=[e for _, e in split["retry"]], at=at
                )
            if split["reject"]:
                counts["rejected"] += client.reject(
                    group, [m for m, _ in split["reject"]], error=[e for _, e in split["reject"]], at=at
                )


def consume(
    spark,
    *,
    group: str,
    topic: str,
    handler: Handler,
    consumers: int = 2,
    batch_size: int = 500,
    invisible_duration: int = 300,
    at: datetime | None = None,
    url: str | None = None,
) -> dict:
    """Run ``consumers`` Spark tasks consuming ``topic`` for ``group`` until nothing is READY
    (classic or Spark Connect session).

    ``invisible_duration``: the lease per batch in seconds. Returns summed counts
    ``{"received", "acked", "retried", "rejected"}`` (retried includes dead-lettered on exhaustion)."""
    url = url or db.database_url()
    config = cached_config()
    task = functools.partial(
        _consumer_task, url, group, topic, handler, batch_size, invisible_duration, at, config
    )
    total: Counter = Counter()
    for part in run_in_tasks(spark, task, list(range(consumers))):
        total.update(part)
    return {k: total.get(k, 0) for k in ("received", "acked", "retried", "rejected")}


def _consumer_task(
    url, group, topic, handler, batch_size, invisible_duration, at, config, _index: int
) -> Counter:
    return consume_partition(url, group, topic, handler, batch_size, invisible_duration, at, config)
