"""The Spark jobs in a real local Spark session (local[2]) against the real PostgreSQL."""

import pytest

from demo.handlers import validate_flight
from helpers import at
from redelivery.errors import MalformedMessageError, UnknownTopicError
from redelivery.spark.consuming import consume
from redelivery.spark.publishing import publish_dataframe
from redelivery.tiers.run import TierRunRequest, run_tier


def test_tier_job_on_spark_moves_each_message_once_across_partitions(
    client, topic_group, database_url, any_spark
):
    client.create_group("strict", max_reconsume_times=0)
    client.subscribe("strict", "orders")
    client.publish("orders", [{"n": i} for i in range(20_000)], at=at(0))
    for _ in range(4):
        client.nack("billing", client.receive("billing", "orders", 5000, 30, at=at(0)), error="x", at=at(0))
    client.receive("strict", "orders", 20_000, 5, at=at(0))
    summary = run_tier(
        TierRunRequest(tier="seconds", window_end=at(10), run_key="spark-1"),
        spark=any_spark,
        url=database_url,
        spark_threshold=0,
    )
    assert summary["partitions"] > 1
    assert summary["promoted"] == 20_000 and summary["by_group"]["billing"]["promoted"] == {"1": 20_000}
    assert summary["by_group"]["strict"]["dead_lettered"] == {"LEASE_EXPIRED": 20_000}
    assert sum(summary["lateness_histogram"]["counts"].values()) == 20_000
    stats = client.stats()["orders"]
    assert stats["billing"]["READY"] == 20_000 and stats["strict"]["DLQ"] == 20_000
    again = run_tier(
        TierRunRequest(tier="seconds", window_end=at(10), run_key="spark-2"),
        spark=any_spark,
        url=database_url,
        spark_threshold=0,
    )
    assert again["promoted"] == 0 and again["dead_lettered"] == 0
    totals = "SELECT name, promoted, dead_lettered FROM consumer_groups ORDER BY 1"  # the metrics' counters
    assert client.conn.execute(totals).fetchall() == [("billing", 20_000, 0), ("strict", 0, 20_000)]
    row = client.conn.execute(
        "SELECT status, (summary->>'promoted')::int FROM tier_runs WHERE run_key = 'spark-1'"
    ).fetchone()
    assert row == ("success", 20_000)


def test_publish_dataframe_in_order_and_once(client, topic_group, database_url, any_spark):
    df = any_spark.createDataFrame(
        [(f"k{i}", f'{{"n": {i}}}') for i in range(1000)], "key string, body string"
    )
    assert publish_dataframe(df, "orders", "batch-a", url=database_url, at=at(0)) == 1000
    assert (
        publish_dataframe(df, "orders", "batch-a", url=database_url, at=at(0)) == 1000
    )  # a re-run adds nothing
    got = client.receive("billing", "orders", 2000, 30)
    assert len(got) == 1000 and [m.body["n"] for m in got] == list(range(1000))
    assert got[7].key == "k7" and got[0].published_at == at(0)
    assert client.conn.execute("SELECT count(*) FROM publish_staging").fetchone()[0] == 0


def test_publish_dataframe_with_a_malformed_body_publishes_nothing(
    client, topic_group, database_url, any_spark
):
    df = any_spark.createDataFrame([('{"n": 1}',), ("{broken",)], "body string")
    with pytest.raises(MalformedMessageError, match=r"partition \d+ message \d+: body is not valid"):
        publish_dataframe(df, "orders", "batch-bad", url=database_url)
    assert client.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    assert client.conn.execute("SELECT count(*) FROM publish_batches").fetchone()[0] == 0
    assert client.conn.execute("SELECT count(*) FROM publish_staging").fetchone()[0] == 0
    with pytest.raises(UnknownTopicError):
        publish_dataframe(df, "nope", "batch-x", url=database_url)


def test_consumer_job_acks_and_rejects(client, topic_group, database_url, any_spark):
    good = {"year": 2013, "month": 1, "day": 1, "carrier": "UA", "flight": 1, "origin": "EWR", "dest": "IAH"}
    client.publish("orders", [good] * 1200 + [{**good, "carrier": None}] * 3)
    counts = consume(
        any_spark,
        group="billing",
        topic="orders",
        handler=validate_flight,
        consumers=2,
        batch_size=100,
        url=database_url,
    )
    assert counts == {"received": 1203, "acked": 1200, "retried": 0, "rejected": 3}
    stats = client.stats()["orders"]["billing"]
    assert stats["COMMITTED"] == 1200 and stats["DLQ"] == 3
    assert {r["last_error"] for r in client.dlq_list("billing")} == {"missing fields ['carrier']"}
