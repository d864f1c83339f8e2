"""Consume and settle as DataFrames, on both Spark paths: lease commits the delivery counts first
and never leases twice; settle applies each receipt once, however often a task runs."""

from types import SimpleNamespace

import pyarrow as pa
import pytest

from helpers import snapshot
from redelivery.client import Message, Outcome
from redelivery.codec import Receipt
from redelivery.errors import ForeignReceiptError
from redelivery.spark.dataframes import _settle_partition, lease, settle


def test_lease_then_plain_spark_then_settle(client, topic_group, database_url, any_spark):
    client.publish(
        "orders",
        [Message({"n": i, "ok": i % 4 != 0}, key=f"k{i}") for i in range(40)] + [Message(b"\x00\x01")],
    )
    leased = lease(any_spark, "billing", "orders", max_messages=100, invisible_duration=60, url=database_url)
    assert leased.count() == 41 and leased.count() == 41  # evaluated twice, leased once
    counts = client.conn.execute("SELECT DISTINCT delivery_count, state::text FROM deliveries").fetchall()
    assert counts == [(1, "INFLIGHT")]  # committed before the DataFrame came back
    row = leased.filter("key = 'k1'").first()
    assert row["body"] == '{"n":1,"ok":true}' and row["body_binary"] is None and row["group"] == "billing"
    assert leased.filter("content_type = 'application/octet-stream'").first()["body_binary"] == b"\x00\x01"
    # the user's transformation: plain Spark
    from redelivery.spark.session import functions_for

    F = functions_for(leased)  # noqa: N806
    parsed = leased.withColumn("ok", F.get_json_object("body", "$.ok"))
    outcomes = parsed.select(
        "message_id",
        "delivery_count",
        F.when(F.col("ok") == "true", "ack")
        .when(F.col("ok") == "false", "retry")
        .otherwise("reject")
        .alias("outcome"),
        F.lit("not ok").alias("error"),
    ).repartition(3)
    assert settle(outcomes, "billing", "orders", url=database_url) == {
        "acked": 30,
        "retried": 10,
        "dead_lettered": 1,
        "stale": 0,
    }
    stats = client.stats()["orders"]["billing"]
    assert (stats["COMMITTED"], stats["WAITING_RETRY"], stats["DLQ"]) == (30, 10, 1)
    assert lease(any_spark, "billing", "orders", url=database_url).count() == 0  # nothing READY: empty
    # settling the same outcomes again (another job run): every receipt is stale now
    assert settle(outcomes, "billing", "orders", url=database_url)["stale"] == 41


def test_a_retried_settle_task_applies_its_partition_once(client, topic_group, database_url, monkeypatch):
    import pyspark

    monkeypatch.setattr(
        pyspark.TaskContext, "get", staticmethod(lambda: SimpleNamespace(partitionId=lambda: 0))
    )
    client.publish("orders", [{"n": i} for i in range(4)])
    got = client.receive("billing", "orders", 4, 30)
    rows = pa.RecordBatch.from_pylist(
        [
            {
                "message_id": m.message_id,
                "delivery_count": m.delivery_count,
                "outcome": "ack" if i % 2 else "retry",
                "error": "e",
                "delay": None,
                "level": None,
            }
            for i, m in enumerate(got)
        ]
    )
    task = _settle_partition(database_url, "billing", "orders", "run-1", client.config, None)
    first = list(task(iter([rows])))[0].to_pylist()[0]
    again = list(task(iter([rows])))[0].to_pylist()[0]  # Spark ran the task once more
    assert first == again == {"part": 0, "acked": 2, "retried": 2, "dead_lettered": 0, "stale": 0}
    assert client.stale_receipts("billing") == 0


def test_settle_refuses_another_groups_receipts(client, topic_group, database_url, any_spark):
    client.create_group("audit")
    client.subscribe("audit", "orders")
    client.publish("orders", [{"n": 1}])
    leased = lease(any_spark, "audit", "orders", url=database_url)
    client.receive("billing", "orders", 1, 30)
    before = snapshot(client.conn)
    with pytest.raises(ForeignReceiptError):
        settle(
            leased.selectExpr("`group`", "message_id", "delivery_count", "'ack' AS outcome"),
            "billing",
            "orders",
            url=database_url,
        )
    assert snapshot(client.conn) == before


def test_client_settle_is_all_or_nothing(client, topic_group):
    client.publish("orders", [{"n": 1}, {"n": 2}])
    a, b = client.receive("billing", "orders", 2, 30)
    before = snapshot(client.conn)
    with pytest.raises(ValueError, match="unknown outcome"):
        client.settle("billing", [Outcome(a, "ack"), Outcome(b, "maybe")])
    assert snapshot(client.conn) == before
    done = client.settle(
        "billing",
        [
            Outcome(a, "ack"),
            Outcome(Receipt(b.message_id, 1, "orders", "billing"), "retry", "later", delay=60),
        ],
    )
    assert done == {"acked": 1, "retried": 1, "dead_lettered": 0, "stale": 0}
