"""Publish, consume and settle as DataFrames: ``publish_dataframe`` (``spark.publishing``) writes one,
``lease`` hands a consumer group's messages over as a
DataFrame, ``settle`` applies a DataFrame of outcomes. What happens between is plain Spark (a
join, a UDF, a validation, a write).

    leased = lease(spark, "billing", "orders", max_messages=20_000, invisible_duration=600)
    checked = leased.withColumn("outcome", F.when(valid(F.col("body")), "ack").otherwise("reject"))
    settle(checked.select("message_id", "delivery_count", "outcome"), "billing", "orders")

``lease`` claims the messages with one statement on the driver (the delivery counts are
committed before the DataFrame exists) and puts them in the DataFrame's plan as data, so that
evaluating the DataFrame again never leases again; ``extend_lease`` keeps leased rows invisible
longer for long work. ``settle`` applies each Spark partition's
receipts in one transaction (``Client.settle``) with a marker per job run and partition: a task
that Spark runs twice (a retry, a speculative copy) settles its partition once. Both work on
classic and Spark Connect sessions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime

from redelivery import errors
from redelivery.client import Client, Outcome
from redelivery.config import RedeliveryConfig, cached_config
from redelivery.errors import MalformedMessageError
from redelivery.messaging.codec import Receipt
from redelivery.messaging.receipts import check_at
from redelivery.rules.failures import Failure
from redelivery.rules.leased_row import LEASE_SCHEMA, SPARK_COLUMNS
from redelivery.spark.deploy import map_partitions
from redelivery.spark.publishing import publish_dataframe
from redelivery.spark.session import functions_for, local_checkpoint
from redelivery.store import db

__all__ = ["lease", "settle", "extend_lease", "publish_dataframe"]

SETTLE_COLUMNS = {
    "message_id": "long",
    "delivery_count": "int",
    "outcome": "string",
    "error": "string",
    "error_class": "string",
    "error_frame": "string",
    "error_stack": "string",
    "delay": "int",
    "level": "int",
}
SETTLED_SCHEMA = "part long, acked long, retried long, dead_lettered long, stale long"


def _arrow_schema():
    """The leased DataFrame's Arrow schema, its columns' (``rules.leased_row.SPARK_COLUMNS``)."""
    import pyarrow as pa

    arrow = {
        "string": pa.string(), "long": pa.int64(), "int": pa.int32(), "binary": pa.binary(),
        "map<string,string>": pa.map_(pa.string(), pa.string()), "timestamp": pa.timestamp("us", tz="UTC"),
    }  # fmt: skip
    return pa.schema([(name, arrow[kind]) for name, kind in SPARK_COLUMNS])


def lease(
    spark,
    group: str,
    topic: str,
    max_messages: int = 10_000,
    invisible_duration: float = 300,
    *,
    url: str | None = None,
    at: datetime | None = None,
    wait_seconds: float = 0,
):
    """Lease up to ``max_messages`` READY messages of ``topic`` for ``group`` (oldest first) for
    ``invisible_duration`` seconds and return them as a DataFrame (``LEASE_SCHEMA``, the fields of
    ``ReceivedMessage`` that declare a Spark column: ``rules.leased_row``): ``body`` is
    the text of a JSON or text body, ``body_binary`` the bytes of an application/octet-stream one;
    ``properties`` carry the retry properties of a redelivered message. An empty lease is an empty
    DataFrame, after waiting up to ``wait_seconds`` (0..20) for a message (``Client.receive``).
    Raises what ``Client.receive`` raises."""
    import pyarrow as pa

    with Client(url or db.database_url()) as client:
        rows = client.lease_rows(
            group, topic, max_messages, invisible_duration, at=at, wait_seconds=wait_seconds
        )
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
    ``reject``), and optionally ``error`` with ``error_class``, ``error_frame`` and
    ``error_stack`` (``rules.failures.Failure``'s parts: the class makes the failure's signature,
    by which dead letters are grouped), ``delay`` (seconds) or ``level`` for a retry, and
    ``group`` (every row must be ``group``'s).

    The DataFrame is evaluated once (``localCheckpoint``: a UDF or a side effect upstream runs
    once per row); every row is then checked as ``Client.check_outcomes`` checks, in Spark tasks
    that change nothing; only then does each partition settle, in one transaction applied once
    however often Spark runs its task. Returns ``{"acked", "retried", "dead_lettered", "stale"}``.
    Raises, before anything is settled: ``MalformedMessageError`` for a missing column,
    ``ForeignReceiptError`` for a row of another group or a message of another topic, and the
    ``ValueError`` subclass ``Client.settle`` would raise for a bad outcome, delay, level or error
    text, naming the first bad row's message; ``TypeError`` / ``ValueError`` for an ``at`` that is
    not a timezone-aware datetime of years 1970 to 9000 (``receipts.check_at``)."""
    check_at(at)  # in the driver: a one-line error, not one wrapped by Spark from each task
    F = functions_for(df)  # noqa: N806
    missing = {"message_id", "delivery_count", "outcome"} - set(df.columns)
    if missing:
        raise MalformedMessageError(f"the outcomes DataFrame has no {sorted(missing)} column(s)")
    columns = [
        (F.col(name) if name in df.columns else F.lit(None)).cast(kind).alias(name)
        for name, kind in {**SETTLE_COLUMNS, "group": "string"}.items()
    ]
    url, config = url or db.database_url(), config or cached_config()
    with Client(url, config=config) as client:
        client.policy(topic, group)  # UnknownGroupError, UnknownTopicError, NotSubscribedError
    outcomes = local_checkpoint(df.select(*columns))
    problems = map_partitions(outcomes, _check_partition(url, group, topic, config), PROBLEM_SCHEMA)
    if problems:
        first = min(problems, key=lambda r: r["message_id"] if r["message_id"] is not None else -1)
        raise _error_class(first["error_type"])(
            f"{first['problem']} (outcomes row of message {first['message_id']}, "
            f"delivery count {first['delivery_count']}); nothing was settled"
        )
    task = _settle_partition(url, group, topic, uuid.uuid4().hex, config, at)
    reports = map_partitions(outcomes.drop("group"), task, SETTLED_SCHEMA)
    return {key: sum(r[key] for r in reports) for key in ("acked", "retried", "dead_lettered", "stale")}


def extend_lease(
    df,
    group: str,
    topic: str,
    invisible_duration: float,
    *,
    url: str | None = None,
    at: datetime | None = None,
) -> int:
    """Keep leased rows invisible for ``invisible_duration`` seconds (1..43200) from now, for work
    longer than their lease: ``df`` holds the receipts (``message_id``, ``delivery_count``: a
    leased DataFrame, or the rows of it still being worked on); each delivery still INFLIGHT under
    its receipt gets the new end, its delivery count unchanged (``Client.extend_lease``); a stale
    receipt changes nothing and is counted. The receipts (two numbers a row) are collected and
    applied in one statement. Returns how many leases were extended. Raises
    ``MalformedMessageError`` for a missing column, and what ``Client.extend_lease`` raises,
    before anything changes."""
    missing = {"message_id", "delivery_count"} - set(df.columns)
    if missing:
        raise MalformedMessageError(f"the receipts DataFrame has no {sorted(missing)} column(s)")
    rows = df.select("message_id", "delivery_count").collect()
    receipts = [Receipt(r["message_id"], r["delivery_count"], topic, group) for r in rows]
    with Client(url or db.database_url()) as client:
        return client.extend_lease(group, receipts, invisible_duration, at=at)


#: What a check task reports: the first bad row of its partition, if any.
PROBLEM_SCHEMA = "message_id long, delivery_count int, error_type string, problem string"


def _error_class(name: str) -> type[Exception]:
    """The exception class ``name`` of ``redelivery.errors``, else ``ValueError``."""
    found = getattr(errors, name, None)
    return found if isinstance(found, type) and issubclass(found, Exception) else ValueError


def _outcomes_of(batches: Iterator, group: str | None, topic: str) -> Iterator[Outcome]:
    for batch in batches:
        for row in batch.to_pylist():
            receipt = Receipt(row["message_id"], row["delivery_count"], topic, row.get("group") or group)
            yield Outcome(receipt, row["outcome"], _failure(row), row["delay"], row["level"])


def _failure(row: dict) -> str | Failure | None:
    """A row's error: its text, with its class, top frame and stack when the row gives them."""
    parts = (row.get("error_class"), row.get("error_frame"), row.get("error_stack"))
    return row["error"] if parts == (None, None, None) else Failure(row["error"], *parts)


def _check_partition(url: str, group: str, topic: str, config: RedeliveryConfig):
    """A Spark task that checks its partition's outcomes (``Client.check_outcomes``) and yields
    its first bad row as a PROBLEM_SCHEMA row (nothing when all are good); it changes nothing."""

    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa

        outcomes = list(_outcomes_of(batches, group, topic))
        bad = next((o for o in outcomes if None in (o.receipt.message_id, o.receipt.delivery_count)), None)
        problem = None
        if bad is not None:
            problem = ("MalformedMessageError", "a receipt needs a message_id and a delivery_count")
        elif outcomes:
            with Client(url, config=config) as client:
                try:
                    client.check_outcomes(group, outcomes)
                except (errors.RedeliveryError, ValueError) as exc:
                    problem = (type(exc).__name__, str(exc))
                    bad = _named_outcome(outcomes, str(exc))
        if problem is not None:
            row = {"message_id": bad.receipt.message_id if bad else None,
                   "delivery_count": bad.receipt.delivery_count if bad else None,
                   "error_type": problem[0], "problem": problem[1]}  # fmt: skip
            yield pa.RecordBatch.from_pylist([row], schema=_problem_arrow_schema())

    return run


def _named_outcome(outcomes: list[Outcome], text: str) -> Outcome | None:
    """The outcome whose message an error text names ("message <id>"), if any."""
    import re

    match = re.search(r"message (\d+)", text)
    wanted = int(match.group(1)) if match else None
    return next((o for o in outcomes if o.receipt.message_id == wanted), None)


def _problem_arrow_schema():
    import pyarrow as pa

    return pa.schema(
        [("message_id", pa.int64()), ("delivery_count", pa.int32()), ("error_type", pa.string()),
         ("problem", pa.string())]
    )  # fmt: skip


def _settle_partition(url: str, group: str, topic: str, run_id: str, config: RedeliveryConfig, at):
    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        outcomes = list(_outcomes_of(batches, group, topic))
        counts = {"acked": 0, "retried": 0, "dead_lettered": 0, "stale": 0}
        if outcomes:
            with Client(url, config=config) as client:
                counts = client.settle(group, outcomes, at=at, marker=(run_id, part))
        yield pa.RecordBatch.from_pylist([{"part": part, **counts}])

    return run
