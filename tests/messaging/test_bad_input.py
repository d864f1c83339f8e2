"""Bad input gets a clear error and changes nothing."""

from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from helpers import at, snapshot
from redelivery.client import Message, Outcome
from redelivery.errors import (
    BatchTooLargeError,
    InvalidBatchIdError,
    InvalidDelayError,
    InvalidLevelError,
    InvalidNameError,
    MalformedMessageError,
    NotSubscribedError,
    UnknownGroupError,
    UnknownTopicError,
)
from redelivery.messaging.codec import JSON


@pytest.fixture()
def inflight(client, topic_group):
    client.publish("orders", [{"n": i} for i in range(3)])
    got = client.receive("billing", "orders", 2, 30)
    return got


@pytest.mark.parametrize(
    "call,error,needle",
    [
        (lambda c, m: c.publish("nope", [{"n": 1}]), UnknownTopicError, "unknown topic 'nope'"),
        (lambda c, m: c.receive("nope", "orders"), UnknownGroupError, "unknown consumer group 'nope'"),
        (lambda c, m: c.receive("billing", "nope"), UnknownTopicError, "unknown topic"),
        (lambda c, m: c.ack("nope", m), UnknownGroupError, "unknown consumer group"),
        (lambda c, m: c.nack("nope", m), UnknownGroupError, "unknown consumer group"),
        (lambda c, m: c.subscribe("nope", "orders"), UnknownGroupError, "unknown consumer group"),
        (lambda c, m: c.dlq_list("nope"), UnknownGroupError, "unknown consumer group"),
        (lambda c, m: c.reconsume_later("billing", m, delay=0), InvalidDelayError, "1 to 864000"),
        (lambda c, m: c.reconsume_later("billing", m, delay=864001), InvalidDelayError, "864000"),
        (lambda c, m: c.reconsume_later("billing", m, delay=1.5), InvalidDelayError, "whole seconds"),
        (lambda c, m: c.reconsume_later("billing", m, level=1.5), InvalidLevelError, "not an integer"),
        (lambda c, m: c.reconsume_later("billing", m, level=True), InvalidLevelError, "not an integer"),
        (lambda c, m: c.reconsume_later("billing", m, delay=10, level=2), ValueError, "not both"),
        (lambda c, m: c.nack("billing", m, error=["only one"]), ValueError, "2 errors|1 errors"),
        (lambda c, m: c.receive("billing", "orders", 0), ValueError, "max_messages"),
        (lambda c, m: c.receive("billing", "orders", 10, 0), ValueError, "invisible_duration"),
        (lambda c, m: c.receive("billing", "orders", 10, 43201), ValueError, "invisible_duration"),
        (lambda c, m: c.ack("billing", [{"message_id": 1}]), TypeError, "ReceivedMessage"),
        (
            lambda c, m: c.publish("orders", [{"ok": 1}, {"bad": float("nan")}]),
            MalformedMessageError,
            "message 1",
        ),
        (
            lambda c, m: c.publish("orders", [{"ok": 1}, {"bad": object()}]),
            MalformedMessageError,
            "not valid",
        ),
        (
            lambda c, m: c.publish("orders", [Message("{not json", content_type="application/json")]),
            MalformedMessageError,
            "not valid application/json",
        ),
        (
            lambda c, m: c.publish("orders", [Message(b"x", content_type="text/plain")]),
            MalformedMessageError,
            "must be str",
        ),
        (
            lambda c, m: c.publish("orders", [Message("x", content_type="image/png")]),
            MalformedMessageError,
            "content type",
        ),
        (
            lambda c, m: c.publish("orders", [Message({}, properties={"RECONSUMETIMES": "3"})]),
            MalformedMessageError,
            "reserved",
        ),
        (
            lambda c, m: c.publish("orders", [Message({}, properties={"n": 3})]),
            MalformedMessageError,
            "str to str",
        ),
        (lambda c, m: c.publish("orders", [Message({}, key=5)]), MalformedMessageError, "key"),
        (lambda c, m: c.create_topic("bad name; drop table"), InvalidNameError, "invalid"),
        (lambda c, m: c.create_group("x" * 60), InvalidNameError, "invalid"),
        (lambda c, m: c.create_group("ok", max_reconsume_times=-2), ValueError, "from -1"),
        # names: a trailing newline, not a str
        (lambda c, m: c.create_topic("orders\n"), InvalidNameError, "invalid"),
        (lambda c, m: c.create_group(5), InvalidNameError, "invalid"),
        (lambda c, m: c.receive(5, "orders"), InvalidNameError, "invalid"),
        (lambda c, m: c.publish(b"orders", [{"n": 1}]), InvalidNameError, "invalid"),
        (lambda c, m: c.create_group("ok", max_reconsume_times=2**31), ValueError, "2147483647"),
        # bodies and properties PostgreSQL's jsonb would refuse
        (lambda c, m: c.publish("orders", [{"text": "a\x00b"}]), MalformedMessageError, "u0000"),
        (
            lambda c, m: c.publish("orders", [Message('"a\\u0000b"', content_type=JSON)]),
            MalformedMessageError,
            "u0000",
        ),
        (
            lambda c, m: c.publish("orders", [Message({}, properties={"p": "a\x00"})]),
            MalformedMessageError,
            "u0000",
        ),
        # keys and property names PostgreSQL's text cannot hold: NUL, a lone surrogate (not UTF-8)
        (
            lambda c, m: c.publish("orders", [{"n": 1}, Message({}, key="k\x00")]),
            MalformedMessageError,
            r"message 1: key has a \\u0000",
        ),
        (
            lambda c, m: c.publish("orders", [{"n": 1}, Message({}, key="k\ud800")]),
            MalformedMessageError,
            "message 1: key has a lone surrogate",
        ),
        (
            lambda c, m: c.publish("orders", [Message({}, properties={"\udc80": "v"})]),
            MalformedMessageError,
            "message 0: property name .* lone surrogate",
        ),
        (
            lambda c, m: c.publish("orders", [Message({}, properties={"p": "\udc80"})]),
            MalformedMessageError,
            "message 0: property 'p' has a lone surrogate",
        ),
        (lambda c, m: c.publish("orders", [Message("NaN", content_type=JSON)]), MalformedMessageError, "NaN"),
        (
            lambda c, m: c.publish("orders", [Message({}, properties=[("a", "b")])]),
            MalformedMessageError,
            "mapping",
        ),
        (
            lambda c, m: c.publish("orders", [Message("[" * 5000 + "]" * 5000, content_type=JSON)]),
            MalformedMessageError,
            "not valid",
        ),
        # batch ids
        (lambda c, m: c.publish("orders", [{"n": 1}], batch_id="b" * 201), InvalidBatchIdError, "1 to 200"),
        (lambda c, m: c.publish("orders", [{"n": 1}], batch_id=7), InvalidBatchIdError, "invalid"),
        (lambda c, m: c.publish("orders", [{"n": 1}], batch_id=""), InvalidBatchIdError, "invalid"),
        # counts and limits
        (lambda c, m: c.dlq_list("billing", limit=-1), ValueError, "limit"),
        (lambda c, m: c.receive("billing", "orders", 2**40), ValueError, "max_messages"),
        (lambda c, m: c.receive("billing", "orders", 10, True), ValueError, "invisible_duration"),
    ],
)
def test_bad_input_raises_and_changes_nothing(client, inflight, call, error, needle):
    before = snapshot(client.conn)
    with pytest.raises(error, match=needle):
        call(client, inflight)
    assert snapshot(client.conn) == before


def test_receive_from_a_topic_the_group_does_not_subscribe(client, topic_group):
    client.create_topic("other")
    before = snapshot(client.conn)
    with pytest.raises(NotSubscribedError, match="not subscribed"):
        client.receive("billing", "other")
    assert snapshot(client.conn) == before


def test_malformed_message_in_a_large_batch_publishes_nothing(client, topic_group):
    batch = [{"n": i} for i in range(10_000)] + [{"bad": float("inf")}]
    with pytest.raises(MalformedMessageError, match="message 10000"):
        client.publish("orders", batch)
    assert client.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_a_batch_larger_than_the_backlog_cap_is_refused_at_once(client, topic_group):
    from helpers import configured

    configured(client, {"topic": "orders", "max_ready_backlog": 5})
    before = snapshot(client.conn)
    with pytest.raises(BatchTooLargeError, match="can never fit"):
        client.publish("orders", [{"n": i} for i in range(6)])
    assert client.publish_waits == []  # not retried as flow control
    assert snapshot(client.conn) == before


#: JSON texts at the edges of what PostgreSQL's jsonb takes: lone surrogates, numeric's range (131,072
#: digits before the point, 16,383 after), huge integers, constants, \u0000, long strings.
EDGE_BODIES = [
    '"\\ud800"', '"\\udc00x"', '"\\ud800\\udc00"', "1e131071", "1e131072", "1e-16383", "1e-16384",
    "1.5e-16383", "123456789012345678901234567890", "9" * 5000, "1e999", "-0", "[1,2", '{"a": 1}',
    '"a\\u0000b"', '"a\\\\u0000b"', "NaN", "-Infinity", '"' + "x" * 20_000 + '"', "0." + "1" * 16_383,
    "0." + "1" * 16_384, '{"n": 0.' + "5" * 16_384 + "}", "1E-16384", "1e400", "1E+400", "1e308",
    '{"a": "one-way", "n": 1e-5}', "[" + "1e-300," * 3000 + "1]",
]  # fmt: skip


@pytest.mark.parametrize("text", EDGE_BODIES, ids=lambda t: t[:24])
def test_a_json_body_is_accepted_exactly_when_postgresql_takes_it(database_url, text):
    """Bodies are parsed in Python only (PostgreSQL no longer parses them on publish): the check
    must refuse what jsonb refuses. (Nesting deeper than Python's recursion limit is the one case
    Python refuses and PostgreSQL may take.)"""
    import psycopg

    from redelivery.messaging.codec import check_json_text
    from redelivery.store import db

    with db.connect(database_url, autocommit=True) as conn:
        try:
            conn.execute("SELECT %s::jsonb IS NOT NULL", (text,))
            postgresql = True
        except psycopg.errors.DataError:
            postgresql = False
    try:
        check_json_text(text)
        python = True
    except ValueError:
        python = False
    assert python == postgresql


@pytest.mark.parametrize(
    "text", [*EDGE_BODIES, "[" * 600 + "]" * 600, "[" * 400 + "]" * 400], ids=lambda t: t[:24]
)
def test_one_body_is_refused_exactly_when_a_batch_of_them_is(text):
    """A small batch checks its JSON bodies one at a time (``codec.check_json_body``, issue 42), a
    COPY's a chunk at a time with Arrow (``copy_rows.check_json_bodies``): the same bodies refused."""
    from redelivery.messaging.codec import check_json_body
    from redelivery.messaging.copy_rows import check_json_bodies, message_batch

    def refused(check) -> bool:
        try:
            check()
        except MalformedMessageError:
            return True
        return False

    body = text.encode()
    batch = message_batch(1, at(0), [None, None], [b"{}", body], [JSON, JSON], ["{}", "{}"])
    assert refused(lambda: check_json_body(body, 1)) == refused(lambda: check_json_bodies(batch, str))


@pytest.fixture()
def empty_database(database_url):
    """A new, empty database on the test server (no schema at all); dropped afterwards."""
    import uuid
    from urllib.parse import urlsplit

    from psycopg import sql

    from redelivery.store import db

    name = f"redelivery_empty_{uuid.uuid4().hex[:8]}"
    with db.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlsplit(database_url)._replace(path=f"/{name}").geturl()
    finally:
        with db.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_client_on_a_database_never_migrated_says_to_run_the_upgrade(empty_database):
    """A library does not change a schema behind its caller's back: it refuses, saying how."""
    from redelivery.client import Client
    from redelivery.errors import RedeliveryError, SchemaNotMigratedError
    from redelivery.store import db

    with pytest.raises(SchemaNotMigratedError, match="redelivery db upgrade") as refused:
        Client(empty_database)
    assert isinstance(refused.value, RedeliveryError) and "\n" not in str(refused.value)
    assert "no redelivery schema" in str(refused.value)
    with db.connect(empty_database, autocommit=True) as conn:  # and it created nothing
        assert conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'redelivery%'"
        ).fetchone() == (0,)


def test_a_client_on_an_older_schema_names_its_revision_and_the_upgrade(empty_database):
    from redelivery.client import Client
    from redelivery.errors import SchemaNotMigratedError
    from redelivery.store import db

    db.migrate(empty_database, revision="0007")
    with pytest.raises(
        SchemaNotMigratedError,
        match=f"at revision 0007, but this version needs {db.head_revision()}: run `redelivery db upgrade`",
    ):
        Client(empty_database)
    db.migrate(empty_database)  # what the message says to do
    with Client(empty_database) as client:
        assert client.stats() == {}


def jsonb_takes(database_url, text: str) -> bool:
    import psycopg

    from redelivery.store import db

    with db.connect(database_url, autocommit=True) as conn:
        try:
            conn.execute("SELECT %s::jsonb IS NOT NULL", (text,))
            return True
        except psycopg.errors.DataError:
            return False


@pytest.mark.parametrize("text", EDGE_BODIES, ids=lambda t: t[:24])
def test_a_json_body_is_published_exactly_when_jsonb_takes_it(client, topic_group, database_url, text):
    """The publish path end to end: the client's check of what only jsonb refuses, then PostgreSQL's
    IS JSON as the row is written. A refusal names the message and changes nothing. (The log's
    partition of now exists, as the maintenance job makes it ahead: a publish that finds none
    makes it before its COPY, whatever the COPY then refuses.)"""
    from redelivery.store import log

    log.ensure_partitions_ahead(client.conn, client.config.retention.seconds("partition"))
    before = snapshot(client.conn)
    try:
        client.publish("orders", [{"n": 1}, Message(text, content_type=JSON)])
        published = True
    except MalformedMessageError as refused:
        assert str(refused).startswith("message 1: body is not valid application/json")
        assert snapshot(client.conn) == before
        published = False
    assert published == jsonb_takes(database_url, text)


@pytest.mark.parametrize("text", EDGE_BODIES, ids=lambda t: t[:24])
def test_a_json_body_is_published_from_spark_exactly_when_jsonb_takes_it(
    client, topic_group, database_url, monkeypatch, text
):
    """The same through a Spark publish's task and driver (the task run as Spark runs it): the
    task's vectorized checks, then PostgreSQL's in the driver's COPY, the row named either way."""
    import pyarrow as pa
    import pyspark

    from redelivery.spark.publishing import publish_staged, stage_partition

    monkeypatch.setattr(
        pyspark.TaskContext, "get", staticmethod(lambda: type("T", (), {"partitionId": lambda: 0}))
    )
    rows = pa.RecordBatch.from_pydict({
        "key": pa.array(["a", "b"]), "body": pa.array([b'{"n": 1}', text.encode()]),
        "content_type": pa.array([JSON, JSON]), "properties": pa.array([None, None], pa.string()),
    })  # fmt: skip
    topic_id, now = client.conn.execute("SELECT id, now() FROM topics WHERE name = 'orders'").fetchone()
    [report] = pa.Table.from_batches(
        stage_partition(database_url, topic_id, "edge", "run-1", now)(iter([rows]))
    ).to_pylist()
    try:
        publish_staged(database_url, topic_id, "edge", "run-1", [report], at=now)
        published = True
    except MalformedMessageError as refused:
        assert "partition 0 message 1: body is not valid application/json" in str(refused)
        published = False
    assert published == jsonb_takes(database_url, text)
    assert client.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == (2 if published else 0)
    assert client.conn.execute("SELECT count(*) FROM publish_staging").fetchone()[0] == 0


#: Every client call that takes ``at``, with the receipts of the ``inflight`` fixture where it answers.
AT_CALLS = {
    "publish": lambda c, m, when: c.publish("orders", [{"n": 9}], at=when),
    "receive": lambda c, m, when: c.receive("billing", "orders", 1, 30, at=when),
    "lease_rows": lambda c, m, when: c.lease_rows("billing", "orders", 1, 30, at=when),
    "nack": lambda c, m, when: c.nack("billing", m, at=when),
    "reconsume_later": lambda c, m, when: c.reconsume_later("billing", m, delay=5, at=when),
    "reject": lambda c, m, when: c.reject("billing", m, at=when),
    "settle": lambda c, m, when: c.settle("billing", [Outcome(x, "ack") for x in m], at=when),
    "extend_lease": lambda c, m, when: c.extend_lease("billing", m, 60, at=when),
}
BAD_AT = [  # (value, error, what the one line says)
    (datetime(9999, 12, 31, tzinfo=UTC), ValueError, "from 1970 to 9000"),  # was a raw OverflowError
    (datetime(9001, 1, 1, tzinfo=UTC), ValueError, "from 1970 to 9000"),
    (datetime(1969, 12, 31, 23, 59, tzinfo=UTC), ValueError, "from 1970 to 9000"),
    (datetime(2026, 3, 1, 12), ValueError, "timezone-aware"),  # was taken as UTC silently
    ("yesterday", TypeError, "got 'yesterday'"),  # was PostgreSQL's word for it
    (date(2026, 3, 1), TypeError, "datetime"),
    (1_772_366_400, TypeError, "datetime"),
]


@pytest.mark.parametrize("when,error,needle", BAD_AT, ids=lambda v: str(v)[:20])
@pytest.mark.parametrize("name", sorted(AT_CALLS))
def test_a_bad_at_is_refused_in_one_line_and_changes_nothing(client, inflight, name, when, error, needle):
    """Issue 27 item 9: ``at`` replaces the database clock: a timezone-aware datetime of years
    1970..9000 (``check_at``), else a one-line error naming the argument, before anything is written."""
    before = snapshot(client.conn)
    with pytest.raises(error, match=needle) as refused:
        AT_CALLS[name](client, inflight, when)
    assert str(refused.value).startswith("at must be") and "\n" not in str(refused.value)
    assert snapshot(client.conn) == before


def test_check_at_takes_any_timezone_within_its_years():
    from redelivery.messaging.receipts import check_at

    east = timezone(timedelta(hours=14))
    for good in (None, datetime(1970, 1, 1, tzinfo=UTC), datetime(9000, 12, 31, 23, 59, tzinfo=UTC),
                 datetime(2026, 3, 1, 12, tzinfo=east)):  # fmt: skip
        assert check_at(good) is good
    with pytest.raises(ValueError, match="from 1970 to 9000"):  # 1969 in UTC
        check_at(datetime(1970, 1, 1, 5, tzinfo=east))
    with pytest.raises(TypeError, match="at must be"):
        check_at(date(2026, 3, 1))
