"""A small batch is one statement (``publishing.SMALL_BATCH_MESSAGES``, issue 42): the same
messages, ids, record and refusals as the COPY, in two round trips (one when the partition of the
last publish still holds the time), its batch's row written once."""

import threading
import time

import pytest

from helpers import snapshot
from redelivery.client import Client, Message
from redelivery.errors import BatchConflictError, MalformedMessageError
from redelivery.messaging import publishing

MESSAGES = [
    Message({"n": 1}, key="k1", properties={"source": "api"}),
    Message(b"\x00\xffraw", key=None, content_type="application/octet-stream"),
    Message("text, é", key="k1", content_type="text/plain"),
    Message({"n": 1}, key="k1", properties={"source": "api"}),  # equal to the first
]


def through_copy(monkeypatch) -> None:
    monkeypatch.setattr(publishing, "SMALL_BATCH_MESSAGES", 0)


def stored(conn, ids):
    return conn.execute(
        "SELECT key, body, content_type, properties, published_at FROM messages "
        "WHERE id = ANY(%s) ORDER BY id",
        (ids,),
    ).fetchall()


def batch_record(conn, batch_id):
    return conn.execute(
        "SELECT message_count, fingerprint, last_id - first_id FROM publish_batches WHERE batch_id = %s",
        (batch_id,),
    ).fetchone()


def test_a_small_batch_stores_what_the_copy_stores(client, topic_group, monkeypatch):
    """Both ways write the same rows (keys, bodies, content types, properties, publish time) with
    ids in the caller's order, and record the same fingerprint, so a repeat is compared alike."""
    small = client.publish("orders", MESSAGES, batch_id="small")
    through_copy(monkeypatch)
    copied = client.publish("orders", MESSAGES, batch_id="copied")
    assert small == sorted(small) and len(set(small)) == 4
    assert len({r[4] for r in stored(client.conn, small)}) == 1  # one publish time, the transaction's
    assert [r[:4] for r in stored(client.conn, small)] == [r[:4] for r in stored(client.conn, copied)]
    assert batch_record(client.conn, "small") == batch_record(client.conn, "copied") != (None, None, None)
    got = client.receive("billing", "orders", 10, 30)
    assert [m.body for m in got[:4]] == [{"n": 1}, b"\x00\xffraw", "text, é", {"n": 1}]
    assert [m.key for m in got[:4]] == ["k1", None, "k1", "k1"]


@pytest.mark.parametrize("first", ["small", "copy"])
def test_a_batch_id_means_one_batch_whichever_way_wrote_it(client, topic_group, monkeypatch, first):
    """A batch published one way and repeated the other returns the first publish's ids and adds
    nothing; other content under its id is refused, and changes nothing."""
    with monkeypatch.context() as patched:
        if first == "copy":
            through_copy(patched)
        ids = client.publish("orders", MESSAGES, batch_id="b-1")
    with monkeypatch.context() as patched:
        if first == "small":
            through_copy(patched)
        before = snapshot(client.conn)
        assert client.publish("orders", MESSAGES, batch_id="b-1") == ids
        # in another order: equal messages take the published ids in order (the first and the last)
        assert client.publish("orders", MESSAGES[::-1], batch_id="b-1") == [ids[0], ids[2], ids[1], ids[3]]
        with pytest.raises(BatchConflictError, match="other content"):
            client.publish("orders", MESSAGES[:3], batch_id="b-1")
        assert snapshot(client.conn) == before


def test_a_small_publish_writes_its_batch_row_once(client, topic_group):
    """The batch's row is inserted whole, never updated: no dead tuple of it for a held horizon
    to pin (the COPY path inserts it, then records its range). Counted in PostgreSQL's statistics
    of the table, flushed by the publishing session."""
    stats = "SELECT n_tup_ins, n_tup_upd FROM pg_stat_user_tables WHERE relname = 'publish_batches'"

    def counts():
        client.conn.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.05)
        client.conn.execute("SELECT pg_stat_clear_snapshot()")
        return client.conn.execute(stats).fetchone()

    before = counts()
    for i in range(5):
        client.publish("orders", [{"n": i}])
    deadline = time.monotonic() + 30
    while (after := counts())[0] < before[0] + 5 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert after[0] >= before[0] + 5 and after[1] == before[1]


def test_a_message_jsonb_refuses_is_named_and_nothing_is_written(client, topic_group):
    """What only jsonb refuses in a JSON body is found before anything is sent, as the COPY's
    Arrow check finds it, naming the message by its index."""
    before = snapshot(client.conn)
    bad = Message(b'{"a": "\\u0000"}', content_type="application/json")
    with pytest.raises(MalformedMessageError, match=r"message 1: body is not valid application/json"):
        client.publish("orders", [Message({"n": 1}), bad])
    assert snapshot(client.conn) == before


def test_two_publishes_of_one_small_batch_at_once_write_it_once(client, topic_group, clean_db):
    """Two producers sending the same batch id at the same moment: one writes it, the other's
    claim waits for that transaction, writes nothing, and returns the same ids."""
    results, errors = [], []

    def publish() -> None:
        try:
            with Client(clean_db) as producer:
                results.append(producer.publish("orders", MESSAGES, batch_id="twice", retry=False))
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=publish) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert len(results) == 4 and all(r == results[0] for r in results)
    assert client.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 4


def test_a_repeat_near_a_ready_backlog_cap_returns_its_ids(client, topic_group):
    """A batch published again (its commit's answer lost, say) is answered as a repeat before the
    cap is looked at, as the COPY path answers it: its own messages do not make it a 530."""
    from helpers import configured

    configured(client, {"topic": "orders", "group": "billing", "max_ready_backlog": 10})
    client.publish("orders", [{"n": i} for i in range(4)])
    ids = client.publish("orders", [{"n": i} for i in range(5)], batch_id="near-cap")
    before = snapshot(client.conn)
    assert client.publish("orders", [{"n": i} for i in range(5)], batch_id="near-cap") == ids
    assert snapshot(client.conn) == before


def test_the_sessions_encoding_and_string_settings_change_nothing_stored(client, topic_group, clean_db):
    """A session that asks for LATIN1 and for ``standard_conforming_strings`` off (the URL's
    options, or PGOPTIONS) stores what any other stores, both ways, with the same fingerprint: its
    connections speak UTF8 (``db.SESSION_OPTIONS``) and a small batch's bodies go in binary."""
    from urllib.parse import quote

    options = quote("-c client_encoding=LATIN1 -c standard_conforming_strings=off")
    url = f"{clean_db}{'&' if '?' in clean_db else '?'}options={options}"
    messages = [Message(b"\\x41\x00\xff", key="clé", content_type="application/octet-stream"),
                Message("é\\", key="k", properties={"où": "là"}, content_type="text/plain")]  # fmt: skip
    with Client(url) as odd:
        assert odd.conn.execute("SHOW standard_conforming_strings").fetchone()[0] == "off"
        small = odd.publish("orders", messages, batch_id="odd-small")
    with Client(url) as odd, pytest.MonkeyPatch.context() as patched:
        through_copy(patched)
        copied = odd.publish("orders", messages, batch_id="odd-copy")
    assert [r[:4] for r in stored(client.conn, small)] == [r[:4] for r in stored(client.conn, copied)]
    assert stored(client.conn, small)[0][:2] == ("clé", b"\\x41\x00\xff")
    assert batch_record(client.conn, "odd-small") == batch_record(client.conn, "odd-copy")


def partition_of(conn, ids):
    return conn.execute(
        "SELECT DISTINCT tableoid::regclass::text FROM messages WHERE id = ANY(%s)", (ids,)
    ).fetchall()


def test_a_small_publish_after_one_takes_one_round_trip_and_stores_the_same(client, topic_group, monkeypatch):
    """The partition the last publish went into is the guess: the next small publish sends its
    locks, its statement, its commit and its wake at once, without reading the log's partitions
    first, and stores what the COPY stores."""
    from redelivery.store import log

    first = client.publish("orders", [{"n": 0}])
    monkeypatch.setattr(log, "lock_partition_for_publish", lambda *a: pytest.fail("two round trips"))
    small = client.publish("orders", MESSAGES, batch_id="one-trip")
    monkeypatch.undo()
    through_copy(monkeypatch)
    copied = client.publish("orders", MESSAGES, batch_id="copied")
    assert small == sorted(small) and small[0] > first[0]
    assert [r[:4] for r in stored(client.conn, small)] == [r[:4] for r in stored(client.conn, copied)]
    assert batch_record(client.conn, "one-trip") == batch_record(client.conn, "copied")
    assert partition_of(client.conn, small) == partition_of(client.conn, first)


def test_one_round_trip_repeats_and_conflicts_as_the_copy_does(client, topic_group):
    client.publish("orders", [{"n": 0}])  # the guess
    ids = client.publish("orders", MESSAGES, batch_id="b-2")
    before = snapshot(client.conn)
    assert client.publish("orders", MESSAGES, batch_id="b-2") == ids
    with pytest.raises(BatchConflictError, match="other content"):
        client.publish("orders", MESSAGES[:3], batch_id="b-2")
    assert snapshot(client.conn) == before


def test_a_stale_partition_guess_writes_nothing_and_the_publish_lands_where_its_time_is(
    client, topic_group, monkeypatch
):
    """The guessed partition no longer holds the publish time (the span turned over; retention
    dropped it): the one round trip writes nothing, not even an id's batch claim, and the publish
    takes its two round trips into the partition of its time, which becomes the guess."""
    from datetime import timedelta

    from redelivery.store import log

    first = client.publish("orders", [{"n": 0}])
    right = client.publisher._partition
    now = client.conn.execute("SELECT now()").fetchone()[0]
    elsewhere = log.ensure_partition(client.conn, now + timedelta(days=400), 3600)
    client.publisher._partition = elsewhere
    looked = []
    lock = log.lock_partition_for_publish
    monkeypatch.setattr(log, "lock_partition_for_publish", lambda *a: looked.append(1) or lock(*a))
    [mid] = client.publish("orders", [{"n": 1}], batch_id="after-stale", retry=False)
    assert looked == [1] and client.publisher._partition == right
    assert partition_of(client.conn, [mid]) == partition_of(client.conn, first)
    assert client.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
    assert client.conn.execute("SELECT count(*) FROM publish_batches").fetchone()[0] == 2


def test_a_wake_that_fails_after_the_commit_fails_nothing(client, topic_group, monkeypatch, caplog):
    """The one round trip's wake runs after its commit: its error is logged (the waiting consumers
    receive again within a second), and the publish returns its ids, written once."""
    from redelivery.store import statements as S

    client.publish("orders", [{"n": 0}])
    client.publisher._waited[client.context.topic_id("orders")] = True  # a consumer waited before
    monkeypatch.setattr(S, "NOTIFY_WAITERS", "SELECT * FROM no_such_table")  # not a row refusal
    [mid] = client.publish("orders", [{"n": 1}], batch_id="woken", retry=False)
    assert "waiting consumers not woken" in caplog.text and "no_such_table" in caplog.text
    assert stored(client.conn, [mid])[0][1] == b'{"n":1}'
    assert client.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
