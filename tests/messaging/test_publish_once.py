"""A batch id means one batch, published exactly once: by the API and by Spark, whatever a Spark
task does twice, whatever two runs of one batch do at once."""

import threading
from types import SimpleNamespace
from urllib.parse import urlsplit

import pyarrow as pa
import pytest

from helpers import snapshot
from redelivery.client import Message
from redelivery.errors import BatchConflictError, MalformedMessageError, PublishError
from redelivery.spark.publishing import publish_dataframe, publish_staged, stage_partition
from redelivery.store import db, embedded


def count_messages(client):
    return client.conn.execute("SELECT count(*) FROM messages").fetchone()[0]


def test_a_batch_id_is_one_batch_in_the_api(client, topic_group):
    client.create_topic("refunds")
    first = client.publish("orders", [{"n": 1}, {"n": 2}], batch_id="b-1")
    assert client.publish("orders", [{"n": 1}, {"n": 2}], batch_id="b-1") == first
    # the same rows in another order: the same batch, its ids in the caller's order (issue 27, 8)
    assert client.publish("orders", [{"n": 2}, {"n": 1}], batch_id="b-1") == first[::-1]
    before = snapshot(client.conn)
    with pytest.raises(BatchConflictError, match="other content"):
        client.publish("orders", [{"n": 1}, {"n": 3}], batch_id="b-1")
    with pytest.raises(BatchConflictError, match="another topic"):
        client.publish("refunds", [{"n": 1}, {"n": 2}], batch_id="b-1")
    assert snapshot(client.conn) == before


def arrow_rows(bodies):
    return pa.RecordBatch.from_pydict(
        {
            "key": [None] * len(bodies),
            "body": [b.encode() for b in bodies],
            "content_type": ["application/json"] * len(bodies),
            "properties": [None] * len(bodies),
        }
    )


def staged_run(client, database_url, batch_id, rows, monkeypatch):
    """Run a publish task of partition 0 of run ``run-1`` over ``rows`` as Spark would (its task
    context replaced); return (topic id, publish time, its report)."""
    import pyspark

    monkeypatch.setattr(
        pyspark.TaskContext, "get", staticmethod(lambda: SimpleNamespace(partitionId=lambda: 0))
    )
    topic_id, now = client.conn.execute("SELECT id, now() FROM topics WHERE name = 'orders'").fetchone()
    task = stage_partition(database_url, topic_id, batch_id, "run-1", now)
    [report] = pa.Table.from_batches(task(iter([rows]))).to_pylist()
    return topic_id, now, report


def test_a_task_that_runs_twice_stages_its_partition_once(client, topic_group, database_url, monkeypatch):
    """An executor lost after its task committed: Spark runs the task again. The second attempt
    finds the partition staged and reports what the first one staged."""
    rows = arrow_rows([f'{{"n": {i}}}' for i in range(50)])
    topic_id, now, first = staged_run(client, database_url, "b-twice", rows, monkeypatch)
    _, _, second = staged_run(client, database_url, "b-twice", rows, monkeypatch)
    assert (first["rows"], first["staged"], second["staged"], second["rows"]) == (50, True, False, 50)
    assert client.conn.execute("SELECT sum(rows) FROM publish_staging").fetchone()[0] == 50  # once
    assert publish_staged(database_url, topic_id, "b-twice", "run-1", [second], at=now) == 50
    assert count_messages(client) == 50 and client.stats()["orders"]["billing"]["READY"] == 50
    assert client.conn.execute("SELECT count(*) FROM publish_staging").fetchone()[0] == 0


def test_staged_rows_that_do_not_add_up_publish_nothing(client, topic_group, database_url, monkeypatch):
    """Tasks that report more than the database holds (their rows went elsewhere) publish nothing."""
    topic_id, now, report = staged_run(client, database_url, "b-short", arrow_rows(['{"n": 1}']), monkeypatch)
    missing = {**report, "part": 1}  # a second partition the tasks say they wrote, the database never saw
    with pytest.raises(PublishError, match="another database"):
        publish_staged(database_url, topic_id, "b-short", "run-1", [report, missing], at=now)
    assert count_messages(client) == 0
    assert client.conn.execute("SELECT count(*) FROM publish_batches").fetchone()[0] == 0
    assert client.conn.execute("SELECT count(*) FROM publish_staging").fetchone()[0] == 0


def test_two_runs_of_one_batch_at_once_publish_it_once(client, topic_group, database_url, any_spark):
    """A zombie task and its retry publish the same batch id at the same time."""
    df = any_spark.createDataFrame(
        [(f"k{i}", f'{{"n": {i}}}') for i in range(2000)], "key string, body string"
    ).repartition(4)
    counts, errors = [], []

    def run():
        try:
            counts.append(publish_dataframe(df, "orders", "batch-twice", url=database_url))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and counts == [2000, 2000]
    assert count_messages(client) == 2000
    assert client.conn.execute("SELECT count(DISTINCT key) FROM messages").fetchone()[0] == 2000
    assert client.conn.execute("SELECT count(*) FROM publish_staging").fetchone()[0] == 0


def test_a_batch_id_is_one_batch_in_spark(client, topic_group, database_url, any_spark):
    client.create_topic("refunds")
    df = any_spark.createDataFrame([(f'{{"n": {i}}}',) for i in range(100)], "body string")
    assert publish_dataframe(df, "orders", "batch-s", url=database_url) == 100
    assert publish_dataframe(df.repartition(3), "orders", "batch-s", url=database_url) == 100  # same rows
    other = any_spark.createDataFrame([(f'{{"n": {i}}}',) for i in range(101)], "body string")
    with pytest.raises(BatchConflictError, match="other content"):
        publish_dataframe(other, "orders", "batch-s", url=database_url)
    with pytest.raises(BatchConflictError, match="another topic"):
        publish_dataframe(df, "refunds", "batch-s", url=database_url)
    assert count_messages(client) == 100


def test_the_spark_job_uses_the_libpq_url_as_it_is(client, topic_group, database_url, any_spark):
    """A Unix-socket connection string (no TCP host), as libpq takes it: the rows land in the
    database the URL names. (The JDBC URL made by hand before pointed elsewhere.)"""
    dbname = urlsplit(database_url).path.lstrip("/")  # the test database, whichever it is
    if not database_url.startswith(embedded.url(dbname).rsplit("/", 1)[0] + "/"):
        pytest.skip("needs the embedded PostgreSQL and its socket directory")
    socket_dir = embedded.get_settings().home.resolve() / "pgdata"
    if not (socket_dir / f".s.PGSQL.{embedded.get_settings().pg_port}").exists():
        pytest.skip("the embedded server has no Unix socket: its home is too deep for one")
    url = (f"host={socket_dir} port={embedded.get_settings().pg_port} dbname={dbname} "
           f"user=postgres password={embedded.password()}")  # fmt: skip
    with db.connect(url) as conn:  # the same database, reached another way
        assert conn.execute("SELECT current_database()").fetchone()[0] == dbname
    df = any_spark.createDataFrame([('{"n": 1}',), ('{"n": 2}',)], "body string")
    assert publish_dataframe(df, "orders", "batch-socket", url=url) == 2
    assert client.stats()["orders"]["billing"]["READY"] == 2


@pytest.mark.parametrize(
    "body,needle",
    [('{"text": "a\\u0000b"}', "u0000 character"), ("NaN", "not valid application/json"),
     ("{broken", "not valid application/json")],
)  # fmt: skip
def test_a_body_postgresql_refuses_publishes_nothing_from_spark(
    client, topic_group, database_url, any_spark, body, needle
):
    """The tasks check every body as the API does (PostgreSQL no longer parses them on the way in):
    the driver raises the first bad row's reason, and nothing is published or left staged."""
    df = any_spark.createDataFrame([('{"n": 1}',), (body,)], "body string").coalesce(1)
    with pytest.raises(MalformedMessageError, match=f"partition 0 message 1: .*{needle}"):
        publish_dataframe(df, "orders", "batch-bad", url=database_url)
    with pytest.raises(MalformedMessageError, match=needle):  # the API refuses it for the same reason
        client.publish("orders", [Message(body, content_type="application/json")])
    assert count_messages(client) == 0
    for table in ("publish_staging", "publish_parts", "publish_batches"):
        assert client.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0


@pytest.mark.parametrize(
    "key,properties,needle",
    [
        ("k\x00", None, r"key has a \\u0000"),
        ("k", '{"\\ud800": "v"}', r"property name '\\ud800' has a lone surrogate"),
        ("k", '{"p": "\\udfff"}', "property 'p' has a lone surrogate"),
    ],
    ids=["NUL in the key", "lone surrogate in a property name", "lone surrogate in a property value"],
)
def test_a_key_or_property_postgresql_cannot_store_publishes_nothing_from_spark(
    client, topic_group, database_url, any_spark, key, properties, needle
):
    """Checked in the task as bodies are (one MalformedMessageError naming the row, from the
    driver), not found by PostgreSQL in the COPY, which failed the task and Spark retried it."""
    df = any_spark.createDataFrame(
        [('{"n": 1}', "fine", '{"a": "b"}'), ('{"n": 2}', key, properties)],
        "body string, key string, properties string",
    ).coalesce(1)
    with pytest.raises(MalformedMessageError, match=f"partition 0 message 1: {needle}"):
        publish_dataframe(df, "orders", "batch-bad-key", url=database_url)
    assert count_messages(client) == 0
    for table in ("publish_staging", "publish_parts", "publish_batches"):
        assert client.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0


def test_a_spark_string_that_is_not_utf8_publishes_nothing(client, topic_group, database_url, any_spark):
    """A Spark string can hold bytes that are not UTF-8 (a lone surrogate as Java writes it, ED A0
    80): the task names the row and field instead of failing on the decode, which Spark retried."""
    df = any_spark.createDataFrame(
        [('{"n": 1}', bytearray(b"fine")), ('{"n": 2}', bytearray(b"k\xed\xa0\x80"))], "body string, k binary"
    ).coalesce(1)
    df = df.selectExpr("body", "CAST(k AS STRING) AS key")
    with pytest.raises(MalformedMessageError, match="partition 0 message 1: key is not UTF-8 text"):
        publish_dataframe(df, "orders", "batch-not-utf8", url=database_url)
    assert count_messages(client) == 0


def test_bad_properties_publish_nothing_from_spark(client, topic_group, database_url, any_spark):
    df = any_spark.createDataFrame(
        [('{"n": 1}', '{"a": "b"}'), ('{"n": 2}', '{"RECONSUMETIMES": "3"}')],
        "body string, properties string",
    ).coalesce(1)
    with pytest.raises(
        MalformedMessageError, match="partition 0 message 1: property 'RECONSUMETIMES' is reserved"
    ):
        publish_dataframe(df, "orders", "batch-props", url=database_url)
    df = any_spark.createDataFrame([('{"n": 1}', "[1, 2]")], "body string, properties string")
    with pytest.raises(MalformedMessageError, match="properties must be a mapping"):
        publish_dataframe(df, "orders", "batch-props", url=database_url)
    assert count_messages(client) == 0


def test_a_batch_takes_its_messages_once(client, topic_group):
    """A second record of a batch's messages (a retry that wrote them again) is refused: the range
    a batch recorded never moves to other messages."""
    from redelivery.messaging.publishing import record_published_batch

    [first] = client.publish("orders", [{"n": 1}], batch_id="once")
    topic_id, partition = client.conn.execute(
        "SELECT t.id, l.partition_name FROM topics t, log_partitions l WHERE t.name = 'orders'"
    ).fetchone()
    with pytest.raises(PublishError, match="recorded already"), client.conn.transaction():
        record_published_batch(client.conn, topic_id, "once", first - 1, 1, partition)
    assert client.publish("orders", [{"n": 1}], batch_id="once") == [first]


def test_a_repeat_gives_the_ids_in_the_callers_order_with_equal_messages_too(client, topic_group):
    """Issue 27, defect 8: publish promises the ids in the caller's order; equal messages keep
    theirs in order among themselves."""
    a, b, c = {"n": 1}, {"n": 1}, Message({"n": 2}, key="k")
    first = client.publish("orders", [a, b, c], batch_id="dups")
    assert client.publish("orders", [c, a, b], batch_id="dups") == [first[2], first[0], first[1]]
    assert count_messages(client) == 3


def test_a_repeat_after_retention_dropped_the_batch_says_so(client, topic_group):
    """Issue 27, defect 8: a batch id published again after retention dropped its messages from
    the log gets a one-line error saying so (its ids cannot be given: they were returned then),
    not an empty list for a 3-message batch, and publishes nothing."""
    from helpers import at
    from redelivery.errors import BatchExpiredError
    from redelivery.store import log

    ids = client.publish("orders", [{"n": i} for i in range(3)], batch_id="old", at=at(0))
    client.publish("orders", [{"n": 9}], at=at(2 * 86400))
    client.ack("billing", client.receive("billing", "orders", 3, 30, at=at(10)))
    assert log.drop_expired_partitions(client.conn, 86400, at=at(2 * 86400 + 60)).dropped
    before = snapshot(client.conn)
    with pytest.raises(BatchExpiredError, match=f"ids {ids[0]}..{ids[-1]}.*left the log"):
        client.publish("orders", [{"n": i} for i in range(3)], batch_id="old", at=at(0))
    with pytest.raises(BatchConflictError, match="other content"):  # still compared
        client.publish("orders", [{"n": 5}], batch_id="old", at=at(0))
    assert snapshot(client.conn) == before
