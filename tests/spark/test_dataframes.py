"""Consume and settle as DataFrames, on both Spark paths: lease commits the delivery counts first
and never leases twice; settle applies each receipt once, however often a task runs."""

from datetime import timedelta
from types import SimpleNamespace

import pyarrow as pa
import pytest

from helpers import configured, snapshot
from redelivery.client import Message, Outcome
from redelivery.errors import ForeignReceiptError, MalformedMessageError
from redelivery.messaging.codec import Receipt
from redelivery.spark.dataframes import _settle_partition, extend_lease, lease, settle


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


def test_leased_rows_still_worked_on_get_a_longer_lease(client, topic_group, database_url, any_spark):
    """A job that needs more time extends the lease of the rows it still works on: those stay in
    flight past their first lease end, with the same delivery count; the others' leases end (the
    tier run counts a failed delivery and, their 10 s wait past, makes them READY again)."""
    from redelivery.tiers.run import TierRunRequest, run_tier

    client.publish("orders", [{"n": i} for i in range(6)])
    past = client.conn.execute("SELECT now()").fetchone()[0] - timedelta(seconds=120)
    leased = lease(
        any_spark, "billing", "orders", max_messages=10, invisible_duration=5, url=database_url, at=past
    )  # leases that ended 115 s ago
    slow = leased.filter("get_json_object(body, '$.n') >= 3")
    assert extend_lease(slow, "billing", "orders", 3600, url=database_url, at=past) == 3
    now = client.conn.execute("SELECT now()").fetchone()[0]
    run_tier(TierRunRequest(tier="seconds", window_end=now, run_key="e"), url=database_url)
    states = client.conn.execute(
        "SELECT state::text, delivery_count, count(*) FROM deliveries GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    assert states == [("INFLIGHT", 1, 3), ("READY", 1, 3)]  # the others' leases ended: retried, due
    with pytest.raises(MalformedMessageError, match="delivery_count"):
        extend_lease(slow.select("message_id"), "billing", "orders", 60, url=database_url)


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


def leased_outcomes(client, any_spark, database_url, bad_outcome: dict):
    """40 leased messages as outcomes in 4 partitions: all acks but one row of the last partition,
    which gets ``bad_outcome``'s columns."""
    from redelivery.spark.session import functions_for

    client.publish("orders", [{"n": i} for i in range(40)])
    leased = lease(any_spark, "billing", "orders", max_messages=40, url=database_url)
    F = functions_for(leased)  # noqa: N806
    last = client.conn.execute("SELECT max(message_id) FROM deliveries").fetchone()[0]
    is_bad = F.col("message_id") == F.lit(last)
    columns = {
        "outcome": F.lit("ack"),
        "error": F.lit(None).cast("string"),
        "delay": F.lit(None),
        "level": F.lit(None),
    }
    for name, value in bad_outcome.items():
        columns[name] = F.when(is_bad, F.lit(value)).otherwise(columns[name])
    outcomes = leased.repartitionByRange(4, "message_id").select(
        "message_id", "delivery_count", *[v.alias(k) for k, v in columns.items()]
    )
    return outcomes, last


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"outcome": "maybe"}, "unknown outcome 'maybe'"),
        ({"outcome": "retry", "delay": 0}, "delay"),
        ({"outcome": "retry", "delay": 864_001}, "delay"),
        ({"outcome": "retry", "delay": 10, "level": 2}, "not both"),
        ({"outcome": "retry", "level": 99}, "level"),
        ({"outcome": "retry", "error": "nul \x00 inside"}, "NUL"),
    ],
)
def test_settle_refuses_a_bad_outcome_row_before_any_partition_commits(
    client, topic_group, database_url, spark, bad, error
):
    """Issue 16.3a: one bad row in the last partition: one clear error naming its message, and the
    good partitions settle nothing (before: they committed, and the bad one failed as a Spark task
    after its retries)."""
    configured(
        client, {"topic": "orders", "backoff": {"kind": "levels", "levels": "10s 30s"}}, broker="pulsar"
    )
    outcomes, bad_id = leased_outcomes(client, spark, database_url, bad)
    before = snapshot(client.conn)
    with pytest.raises(ValueError, match=error) as raised:
        settle(outcomes, "billing", "orders", url=database_url, config=client.config)
    assert f"message {bad_id}" in str(raised.value) and "\n" not in str(raised.value)
    assert snapshot(client.conn) == before


def test_receipts_of_another_topic_are_refused_before_anything_changes(
    client, topic_group, database_url, spark
):
    """Issue 16.3b: receipts naming a topic their messages are not of: refused, not half applied."""
    client.create_topic("refunds")
    client.subscribe("billing", "refunds")
    client.publish("orders", [{"n": 1}, {"n": 2}])
    a, b = client.receive("billing", "orders", 2, 30)
    before = snapshot(client.conn)
    wrong = Receipt(b.message_id, b.delivery_count, "refunds", "billing")
    with pytest.raises(ForeignReceiptError, match="topic"):
        client.settle("billing", [Outcome(a, "ack"), Outcome(wrong, "retry")])
    from dataclasses import replace

    for call in (client.ack, client.nack, client.reject):
        with pytest.raises(ForeignReceiptError, match="topic"):
            call("billing", [a, replace(b, topic="refunds")])
    assert snapshot(client.conn) == before
    leased = lease(spark, "billing", "refunds", url=database_url)  # nothing READY there: empty
    assert leased.count() == 0
    outcomes = spark.createDataFrame(
        [(a.message_id, a.delivery_count, "ack"), (b.message_id, b.delivery_count, "retry")],
        "message_id long, delivery_count int, outcome string",
    ).repartition(2)
    with pytest.raises(ForeignReceiptError, match="topic"):
        settle(outcomes, "billing", "refunds", url=database_url)
    assert snapshot(client.conn) == before


def test_settle_evaluates_the_outcomes_once(client, topic_group, database_url, any_spark, tmp_path):
    """Issue 16.3c: a UDF with a side effect (a line per call in a file) runs once per row, though
    settle checks every row (and the group) before it settles."""
    from redelivery.spark.session import functions_for

    calls = tmp_path / "calls"
    calls.touch()
    calls.chmod(0o666)
    client.publish("orders", [{"n": i} for i in range(20)])
    leased = lease(any_spark, "billing", "orders", max_messages=20, url=database_url)
    F = functions_for(leased)  # noqa: N806

    def decide(message_id):  # what settle checks: an uncached plan checked, then settled, runs it twice
        with open(str(calls), "a") as fh:
            fh.write(f"{message_id}\n")
        return "ack"

    outcomes = leased.select(
        "group", "message_id", "delivery_count", F.udf(decide, "string")("message_id").alias("outcome")
    )
    assert settle(outcomes.repartition(3), "billing", "orders", url=database_url)["acked"] == 20
    assert len(calls.read_text().split()) == 20


def test_an_ordered_lease_holds_a_key_once_and_settle_keeps_its_order(client, database_url, spark):
    """Issue 31, on Spark: a leased DataFrame holds at most one message of a key (so no key is ever
    in two partitions, whatever the user repartitions), and settle answers as the API does: a
    retried head holds back its key's next message, an acked one releases it (SQS FIFO message
    groups, RocketMQ orderly consumption)."""
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True)
    ids = client.publish("orders", [Message({"n": i}, key=f"k{i % 3}") for i in range(9)])
    leased = lease(spark, "billing", "orders", max_messages=100, invisible_duration=60, url=database_url)
    rows = leased.collect()
    assert sorted(r["key"] for r in rows) == ["k0", "k1", "k2"]
    from redelivery.spark.session import functions_for

    F = functions_for(leased)  # noqa: N806
    outcome = F.when(F.col("key") == "k0", "retry").otherwise("ack").alias("outcome")
    outcomes = leased.select("message_id", "delivery_count", outcome).repartition(3)
    assert settle(outcomes, "billing", "orders", url=database_url)["acked"] == 2
    again = lease(spark, "billing", "orders", max_messages=100, url=database_url).collect()
    assert sorted((r["key"], r["message_id"]) for r in again) == [("k1", ids[4]), ("k2", ids[5])]
    assert client.stats()["orders"]["billing"]["BLOCKED"] == 4  # k0's two behind its retry, k1's, k2's last


def test_a_leased_dataframe_has_the_columns_the_leased_row_declares(client, topic_group, database_url, spark):
    """The DataFrame's columns come from ``ReceivedMessage``'s declaration (issue 39.1): a lease with
    messages and an empty one have the schema ``LEASE_SCHEMA`` says, and every field that declares
    a Spark column is one, with the value a receive would give it."""
    from dataclasses import fields

    from redelivery.rules.leased_row import LEASE_SCHEMA, SPARK_COLUMNS, ReceivedMessage

    declared = [name for f in fields(ReceivedMessage) for name in ([f.name] if f.metadata["spark"] else [])]
    assert set(declared) <= {name for name, _ in SPARK_COLUMNS}
    [message_id] = client.publish("orders", [Message({"n": 1}, key="k", properties={"p": "v"})])
    leased = lease(spark, "billing", "orders", url=database_url)
    empty = lease(spark, "billing", "orders", url=database_url)
    expected = spark.createDataFrame([], LEASE_SCHEMA).schema
    assert leased.schema == expected and empty.schema == expected
    assert leased.columns == [name for name, _ in SPARK_COLUMNS]
    row = leased.first().asDict()
    assert (row["group"], row["topic"], row["message_id"], row["delivery_count"]) == (
        "billing",
        "orders",
        message_id,
        1,
    )
    assert (row["key"], row["body"], row["properties"], row["origin_message_id"]) == (
        "k",
        '{"n":1}',
        {"p": "v"},
        message_id,
    )


def test_a_settle_with_error_classes_groups_its_dead_letters_as_python_does(
    client, topic_group, database_url, spark
):
    """Issue 40: a DataFrame settle's ``error_class`` / ``error_frame`` / ``error_stack`` columns
    make the signature a Python reject of the same exception makes: 30 rejects of three bugs (ids
    varying in their messages) are three groups of 10, one with the Python half's."""
    from redelivery.dead_letters import DlqFilter, groups
    from redelivery.rules.failures import describe

    def declined(n):
        try:
            raise LookupError(f"order {n} not found in shard {n % 7}")
        except LookupError as exc:
            return exc

    client.publish("orders", [{"n": i} for i in range(36)])
    python_half = client.receive("billing", "orders", 6, 60)
    client.reject("billing", python_half, error=[declined(100 + i) for i in range(6)])
    failure = describe(declined(1))
    leased = lease(spark, "billing", "orders", max_messages=30, invisible_duration=60, url=database_url)
    rows = [
        (r["message_id"], r["delivery_count"], "reject", *parts)
        for i, r in enumerate(leased.orderBy("message_id").collect())
        for parts in [
            (
                f"LookupError: order {i} not found in shard {i % 7}",
                failure.error_class,
                failure.frame,
                "stack",
            )
            if i % 3 == 0
            else (f"HTTP 503 from payments for {i}", "requests.HTTPError", "shop:pay", None)
            if i % 3 == 1
            else (f"schema v{i} missing field 'amount'", None, None, None)
        ]
    ]
    columns = "message_id long, delivery_count int, outcome string, error string, error_class string, "
    outcomes = spark.createDataFrame(rows, columns + "error_frame string, error_stack string")
    assert settle(outcomes.repartition(3), "billing", "orders", url=database_url)["dead_lettered"] == 30
    found = {g["error_class"]: g["count"] for g in groups(client.conn, DlqFilter(group="billing"))}
    assert found == {"LookupError": 16, "requests.HTTPError": 10, None: 10}
