"""Consume and settle as DataFrames: ``lease`` hands a consumer group's messages over as a
DataFrame, ``settle`` applies a DataFrame of outcomes. What happens between is plain Spark (a
join, a UDF, a validation, a write).

    leased = lease(spark, "billing", "orders", max_messages=20_000, invisible_duration=600)
    checked = leased.withColumn("outcome", F.when(valid(F.col("body")), "ack").otherwise("reject"))
    settle(checked.select("message_id", "delivery_count", "outcome"), "billing", "orders")

``lease`` claims the messages with one statement on the driver (the delivery counts are
committed before the DataFrame exists) and puts them in the DataFrame's plan as data, so that
evaluating the DataFrame again never leases again. ``settle`` applies each Spark partition's
receipts in one transaction (``Client.settle``) with a marker per job run and partition: a task
that Spark runs twice (a retry, a speculative copy) settles its partition once. Both work on
classic and Spark Connect sessions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime

from .. import db
from ..client import Client, Outcome
from ..codec import Receipt
from ..config import RedeliveryConfig, cached_config
from ..errors import ForeignReceiptError, MalformedMessageError
from .session import functions_for

#: The columns of a leased DataFrame (Spark DDL).
LEASE_SCHEMA = (
    "group string, topic string, message_id long, delivery_count int, reconsume_times int, key string, "
    "body string, body_binary binary, content_type string, properties map<string,string>, "
    "published_at timestamp, origin_message_id long, last_error string, redrive_count int"
)
SETTLE_COLUMNS = {
    "message_id": "long",
    "delivery_count": "int",
    "outcome": "string",
    "error": "string",
    "delay": "int",
    "level": "int",
}
SETTLED_SCHEMA = "part long, acked long, retried long, dead_lettered long, stale long"


def _arrow_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("group", pa.string()),
            ("topic", pa.string()),
            ("message_id", pa.int64()),
            ("delivery_count", pa.int32()),
            ("reconsume_times", pa.int32()),
            ("key", pa.string()),
            ("body", pa.string()),
            ("body_binary", pa.binary()),
            ("content_type", pa.string()),
            ("properties", pa.map_(pa.string(), pa.string())),
            ("published_at", pa.timestamp("us", tz="UTC")),
            ("origin_message_id", pa.int64()),
            ("last_error", pa.string()),
            ("redrive_count", pa.int32()),
        ]
    )


def lease(
    spark,
    group: str,
    topic: str,
    max_messages: int = 10_000,
    invisible_duration: float = 300,
    *,
    url: str | None = None,
    at: datetime | None = None,
):
    """Lease up to ``max_messages`` READY messages of ``topic`` for ``group`` (oldest first) for
    ``invisible_duration`` seconds and return them as a DataFrame (``LEASE_SCHEMA``): ``body`` is
    the text of a JSON or text body, ``body_binary`` the bytes of an application/octet-stream one;
    ``properties`` carry the retry properties of a redelivered message. An empty lease is an empty
    DataFrame. Raises what ``Client.receive`` raises."""
    import pyarrow as pa

    with Client(url or db.database_url()) as client:
        rows = client.lease_rows(group, topic, max_messages, invisible_duration, at=at)
    if not rows:  # (Spark cannot take the schema of an empty Arrow table)
        return spark.createDataFrame([], LEASE_SCHEMA)
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=_arrow_schema()))


def settle(
    df,
    group: str,
    topic: str,
    *,
    url: str | None = None,
    at: datetime | None = None,
    config: RedeliveryConfig | None = None,
) -> dict:
    """Apply a DataFrame of outcomes for ``group``'s messages of ``topic``: columns
    ``message_id``, ``delivery_count`` (the receipt), ``outcome`` (``ack``, ``retry`` or
    ``reject``), and optionally ``error``, ``delay`` (seconds) or ``level`` for a retry, and
    ``group`` (every row must be ``group``'s). Each Spark partition is one transaction, applied
    once however often Spark runs its task. Returns ``{"acked", "retried", "dead_lettered",
    "stale"}``. Raises ``MalformedMessageError`` for a missing column, ``ForeignReceiptError``
    for a row of another group, before anything is settled."""
    F = functions_for(df)  # noqa: N806
    missing = {"message_id", "delivery_count", "outcome"} - set(df.columns)
    if missing:
        raise MalformedMessageError(f"the outcomes DataFrame has no {sorted(missing)} column(s)")
    if "group" in df.columns and df.filter(F.col("group") != F.lit(group)).limit(1).count():
        raise ForeignReceiptError(f"the outcomes hold receipts of another group than {group!r}")
    columns = [
        (F.col(name) if name in df.columns else F.lit(None)).cast(kind).alias(name)
        for name, kind in SETTLE_COLUMNS.items()
    ]
    task = _settle_partition(
        url or db.database_url(), group, topic, uuid.uuid4().hex, config or cached_config(), at
    )
    reports = df.select(*columns).mapInArrow(task, SETTLED_SCHEMA).collect()
    return {key: sum(r[key] for r in reports) for key in ("acked", "retried", "dead_lettered", "stale")}


def _settle_partition(url: str, group: str, topic: str, run_id: str, config: RedeliveryConfig, at):
    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        outcomes = []
        for batch in batches:
            for row in batch.to_pylist():
                receipt = Receipt(row["message_id"], row["delivery_count"], topic, group)
                outcomes.append(Outcome(receipt, row["outcome"], row["error"], row["delay"], row["level"]))
        counts = {"acked": 0, "retried": 0, "dead_lettered": 0, "stale": 0}
        if outcomes:
            with Client(url, config=config) as client:
                counts = client.settle(group, outcomes, at=at, marker=(run_id, part))
        yield pa.RecordBatch.from_pylist([{"part": part, **counts}])

    return run
