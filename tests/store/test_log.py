"""The log (redelivery.store.log): partitions made when a publish needs one and ahead of need,
without stopping publishers; retention that drops whole partitions only when no group needs them,
holds them for a group that lags, and never loses an unfinished message; consume offsets that
start at the log's end or its beginning."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest

from helpers import at, message_state, wait_for_session, waiting_for_a_lock
from redelivery.client import Client, Message
from redelivery.metrics import render
from redelivery.redrive import RedriveRequest, redrive
from redelivery.store import db, log, maintenance
from redelivery.store import statements as S
from redelivery.tiers.run import TierRunRequest, run_tier

HOUR = 3600
DAY = 86400


def partitions(conn) -> list[tuple]:
    """(name, starts_at, ends_at) of every partition, oldest first."""
    return [(p.name, p.starts_at, p.ends_at) for p in log.partitions(conn)]


def test_a_publish_makes_the_partition_of_its_time(client, topic_group):
    assert partitions(client.conn) == []
    client.publish("orders", [{"n": 1}], at=at(0))
    client.publish("orders", [{"n": 2}], at=at(HOUR + 5))
    client.publish("orders", [{"n": 3}], at=at(HOUR + 10))  # the same hour: no new partition
    assert partitions(client.conn) == [
        ("messages_20260301t120000", at(0), at(HOUR)),
        ("messages_20260301t130000", at(HOUR), at(2 * HOUR)),
    ]
    got = client.receive("billing", "orders", 10, 30, at=at(2 * HOUR))
    assert [m.body["n"] for m in got] == [1, 2, 3]


def test_a_partition_fills_the_gap_its_neighbours_leave(client, topic_group):
    """A span made with another partition length is cut where its neighbours already are."""
    log.ensure_partition(client.conn, at(0), 60)  # 12:00-12:01
    log.ensure_partition(client.conn, at(600), 60)  # 12:10-12:11
    made = log.ensure_partition(client.conn, at(300), HOUR)
    assert made == "messages_20260301t120100"
    assert partitions(client.conn)[1][1:] == (at(60), at(600))
    assert log.ensure_partition(client.conn, at(300), HOUR) is None  # once


@pytest.mark.timeout(120)
def test_making_a_partition_never_waits_for_a_publish_nor_stops_one(client, topic_group, clean_db):
    """A partition is attached in SHARE UPDATE EXCLUSIVE mode: an open publish (its rows copied,
    uncommitted) does not hold it up, and an open attach does not hold up a publish."""
    client.publish("orders", [{"n": 0}], at=at(0))
    with Client(clean_db) as publisher, psycopg.connect(clean_db, autocommit=True) as maker:
        publisher.conn.execute("BEGIN")
        publisher.publish("orders", [{"n": 1}], at=at(1), retry=False)  # holds its rows and the topic
        maker.execute("SET search_path TO redelivery")
        maker.execute("SET lock_timeout = '5s'")  # a wait would fail the test, not hang it
        assert log.ensure_partition(maker, at(DAY), HOUR) == "messages_20260302t120000"
        publisher.conn.execute("COMMIT")
        with maker.transaction():  # an attach left open: a publish into another partition goes on
            maker.execute(S.ADVISORY_XACT_LOCK, {"namespace": log.PARTITION_LOCK, "key": 1})
            log_table = psycopg.sql.Identifier(log.LOG_SCHEMA, "messages_20260303t120000")
            maker.execute(S.CREATE_LOG_PARTITION.format(partition=log_table))
            maker.execute(
                S.ATTACH_LOG_PARTITION.format(
                    partition=log_table,
                    starts_at=psycopg.sql.Literal(at(2 * DAY)),
                    ends_at=psycopg.sql.Literal(at(2 * DAY + HOUR)),
                )
            )
            record = {"partition_name": "messages_20260303t120000", "starts_at": at(2 * DAY)}
            maker.execute(S.REGISTER_LOG_PARTITION, {**record, "ends_at": at(2 * DAY + HOUR)})
            publisher.conn.execute("SET lock_timeout = '5s'")
            assert len(publisher.publish("orders", [{"n": 2}], at=at(2), retry=False)) == 1
            publisher.conn.execute("RESET lock_timeout")
    assert [m.body["n"] for m in client.receive("billing", "orders", 10, 30, at=at(10))] == [0, 1, 2]


def retention_at(conn, when, retention=DAY):
    return log.drop_expired_partitions(conn, retention, at=when)


def test_retention_drops_what_every_group_finished_and_a_lagging_group_holds_the_rest(client, topic_group):
    client.create_group("audit")
    client.subscribe("audit", "orders")
    old = client.publish("orders", [{"n": i} for i in range(3)], at=at(0))
    client.publish("orders", [{"n": 9}], at=at(2 * DAY))
    client.ack("billing", client.receive("billing", "orders", 3, 30, at=at(10)))
    # audit has not read the first hour yet: it holds it, and says so
    result = retention_at(client.conn, at(2 * DAY + 60))
    assert (result.dropped, result.held) == ([], {("orders", "audit"): ["messages_20260301t120000"]})
    scraped = render(client.conn, at=at(2 * DAY + 60), retention_seconds=DAY).decode()
    assert 'redelivery_log_held_partitions{group="audit",topic="orders"} 1.0' in scraped
    got = client.receive("audit", "orders", 3, 30, at=at(2 * DAY + 60))
    client.nack("audit", got[:1], at=at(2 * DAY + 60))  # an unfinished delivery row holds it too
    client.ack("audit", got[1:])
    assert retention_at(client.conn, at(2 * DAY + 120)).held == {
        ("orders", "audit"): ["messages_20260301t120000"]
    }
    [retry] = client.receive("audit", "orders", 1, 30, at=at(2 * DAY + 300))  # no tier run yet:
    assert retry.body["n"] == 9  # the retry waits, the log's next message comes
    client.ack("audit", [retry])
    from redelivery.tiers.run import TierRunRequest, run_tier

    run_tier(TierRunRequest(tier="seconds", window_end=at(2 * DAY + 400), run_key="t"), url=client.url)
    [again] = client.receive("audit", "orders", 1, 30, at=at(2 * DAY + 400))
    assert again.message_id == old[0] and again.delivery_count == 2
    client.ack("audit", [again])
    result = retention_at(client.conn, at(2 * DAY + 500))
    assert (result.dropped, result.held) == (["messages_20260301t120000"], {})
    assert [p[0] for p in partitions(client.conn)] == ["messages_20260303t120000"]
    stats = client.stats()["orders"]
    assert stats["billing"]["COMMITTED"] == 3 and stats["billing"]["READY"] == 1
    assert stats["audit"]["COMMITTED"] == 4


def test_a_partition_left_detached_is_dropped_or_attached_again(client, topic_group, database_url):
    """A retention run cut off after its detach leaves a detached, recorded partition: the next
    run checks it again: a group that needs it gets it back, else it is dropped."""
    client.publish("orders", [{"n": 1}], at=at(0))
    client.publish("orders", [{"n": 2}], at=at(2 * DAY))
    [first] = client.receive("billing", "orders", 1, 30, at=at(10))
    client.conn.execute("ALTER TABLE messages DETACH PARTITION redelivery_log.messages_20260301t120000")
    result = retention_at(client.conn, at(2 * DAY + 60))  # the in-flight delivery needs it
    assert result.reattached == ["messages_20260301t120000"] and result.dropped == []
    assert client.ack("billing", first) == 1
    client.conn.execute("ALTER TABLE messages DETACH PARTITION redelivery_log.messages_20260301t120000")
    assert retention_at(client.conn, at(2 * DAY + 60)).dropped == ["messages_20260301t120000"]
    assert client.conn.execute(
        "SELECT to_regclass('redelivery_log.messages_20260301t120000')"
    ).fetchone() == (None,)


def test_a_dead_letter_redriven_after_retention_goes_back_into_the_log(client, topic_group, database_url):
    [mid] = client.publish("orders", [Message({"n": 1, "big": "x" * 100}, key="k")], at=at(0))
    client.publish("orders", [{"n": 2}], at=at(2 * DAY))
    [got] = client.receive("billing", "orders", 1, 30, at=at(10))
    client.reject("billing", got, error="bad", at=at(11))
    assert retention_at(client.conn, at(2 * DAY + 60)).dropped == ["messages_20260301t120000"]
    assert message_state(client.conn, mid) is None  # the log no longer holds it; its dead letter does
    result = redrive(RedriveRequest(group="billing", dry_run=False, rate_limit=None), run_key="late",
                     url=database_url, log=lambda *_: None)  # fmt: skip
    assert result["moved"] == 1
    assert partitions(client.conn)[0][0] == "messages_20260301t120000"  # made again for it
    again = client.receive("billing", "orders", 10, 30, at=at(2 * DAY + 100))
    assert [(m.message_id, m.key, m.body["n"], m.delivery_count, m.redrive_count) for m in again] == [
        (mid, "k", 1, 2, 1),  # the same message, id and time, from its dead letter's copy
        (again[1].message_id, None, 2, 1, 0),
    ]
    assert again[0].published_at == at(0)
    client.ack("billing", again)
    assert retention_at(client.conn, at(2 * DAY + 200)).dropped == ["messages_20260301t120000"]


def _dead_letters_of_dropped_hours(client, groups=("billing",), hours=1) -> list[int]:
    """A message in each of the log's first ``hours`` hours, rejected by each of ``groups`` (dead
    letters keep a copy of it), then those hours dropped by retention two days later."""
    ids = [client.publish("orders", [{"n": h}], at=at(h * HOUR))[0] for h in range(hours)]
    client.publish("orders", [{"n": 99}], at=at(2 * DAY))
    for group in groups:
        client.reject(group, client.receive(group, "orders", hours, 30, at=at(10)), error="bad", at=at(11))
    assert len(retention_at(client.conn, at(2 * DAY + 60)).dropped) == hours
    return ids


@pytest.mark.timeout(120)
def test_two_redrives_putting_back_the_same_dropped_message_both_move(client, topic_group, database_url):
    """Issue 27, defect 6: two groups' dead letters of one message the log dropped, redriven at
    once. billing's batch has put the message back, uncommitted (its batch, here by hand: the order
    in which PostgreSQL runs a statement's data-modifying parts is not fixed); audit's waits for
    it, then finds the message there and moves its dead letter (it failed with a raw
    UniqueViolation)."""
    client.create_group("audit")
    client.subscribe("audit", "orders", start="earliest")
    [mid] = _dead_letters_of_dropped_hours(client, groups=("billing", "audit"))
    results = {}

    def run(group: str) -> None:
        results[group] = redrive(RedriveRequest(group=group, dry_run=False), run_key=f"r-{group}",
                                 url=database_url, log=lambda *_: None)  # fmt: skip

    log.ensure_partition(client.conn, at(0), HOUR)  # made again for it, as a redrive makes it
    with psycopg.connect(database_url) as first:  # billing's batch, its message back in the log
        first.execute(
            "INSERT INTO redelivery.messages"
            " (topic_id, id, key, body, content_type, properties, published_at)"
            " SELECT topic_id, message_id, key, body, content_type, properties, published_at"
            " FROM redelivery.dlq_messages WHERE message_id = %s AND group_id = %s",
            (mid, client.conn.execute("SELECT id FROM consumer_groups WHERE name = 'billing'").fetchone()[0]),
        )
        second = threading.Thread(target=run, args=("audit",))
        second.start()
        wait_for_session(database_url, waiting_for_a_lock("REDRIVE_MOVE_BATCH"), "audit's batch waiting")
        first.commit()
        second.join(60)
    run("billing")  # the message is in the log already: its dead letter goes back all the same
    assert (results["billing"]["moved"], results["audit"]["moved"]) == (1, 1)
    for group in ("billing", "audit"):
        [back] = client.receive(group, "orders", 1, 30, at=at(2 * DAY + 100))
        assert (back.message_id, back.redrive_count) == (mid, 1)


@pytest.mark.timeout(120)
def test_a_paced_redrive_survives_retention_between_its_batches(client, topic_group, database_url):
    """Issue 27, defect 6: a paced redrive puts dead letters whose messages left the log back into
    it, a batch at a time; a retention run during a pause drops the partition made for the next
    batch (still empty: nothing holds it). The next batch makes it again instead of failing with
    'no partition of relation messages'."""
    ids = _dead_letters_of_dropped_hours(client, hours=2)
    pauses = []

    def pause(seconds: float) -> None:  # the pacing's wait: a retention run comes meanwhile
        pauses.append(seconds)
        retention_at(client.conn, at(2 * DAY + 60))

    result = redrive(RedriveRequest(group="billing", dry_run=False, rate_limit=1), run_key="paced",
                     url=database_url, log=lambda *_: None, wait=pause)  # fmt: skip
    assert result["moved"] == 2 and result["status"] == "success" and pauses
    back = client.receive("billing", "orders", 10, 30, at=at(2 * DAY + 100))
    assert sorted(m.message_id for m in back if m.redrive_count) == ids


def test_a_subscription_starts_at_the_end_of_the_log_or_at_its_beginning(client, topic_group):
    client.publish("orders", [{"n": 1}, {"n": 2}], at=at(0))
    client.create_group("late")
    client.subscribe("late", "orders")
    client.create_group("replay")
    client.subscribe("replay", "orders", start="earliest")
    with pytest.raises(ValueError, match="latest.*earliest"):
        client.subscribe("late", "orders", start="newest")
    client.subscribe("late", "orders", start="earliest")  # an existing subscription keeps its offset
    client.publish("orders", [{"n": 3}], at=at(1))
    assert [m.body["n"] for m in client.receive("late", "orders", 10, 30)] == [3]
    assert [m.body["n"] for m in client.receive("replay", "orders", 10, 30)] == [1, 2, 3]
    assert client.stats()["orders"]["late"]["READY"] == 0


def test_a_redriven_message_never_goes_to_a_group_that_subscribed_after_it_left_the_log(
    client, topic_group, database_url
):
    """Issue 27, defect 3: once retention dropped every partition, the log's largest id is gone; a
    subscription from the end starts at the id sequence's position instead, so a dead letter put
    back under its old id is not new to it. From the beginning, it starts before the oldest message
    the log holds (none here: the same position)."""
    [mid] = _dead_letters_of_dropped_hours(client)
    client.ack("billing", client.receive("billing", "orders", 1, 30, at=at(2 * DAY + 30)))
    client.conn.execute("DELETE FROM publish_batches")  # the 2-day-later hour goes too
    assert retention_at(client.conn, at(4 * DAY)).dropped == ["messages_20260303t120000"]
    for group, start in (("late", "latest"), ("replay", "earliest")):
        client.create_group(group)
        client.subscribe(group, "orders", start=start)
    redriven = redrive(RedriveRequest(group="billing", dry_run=False), run_key="back", url=database_url,
                       log=lambda *_: None)  # fmt: skip
    assert redriven["moved"] == 1
    assert [m.message_id for m in client.receive("billing", "orders", 10, 30, at=at(4 * DAY))] == [mid]
    assert client.receive("late", "orders", 10, 30, at=at(4 * DAY)) == []
    assert client.receive("replay", "orders", 10, 30, at=at(4 * DAY)) == []
    [new] = client.publish("orders", [{"n": 7}], at=at(4 * DAY))
    for group in ("late", "replay"):
        assert [m.message_id for m in client.receive(group, "orders", 10, 30, at=at(4 * DAY))] == [new]


def test_dead_letters_past_their_retention_are_deleted_and_committed_stays(client, topic_group):
    from redelivery.config import RedeliveryConfig

    client.publish("orders", [{"n": i} for i in range(3)], at=at(0))
    got = client.receive("billing", "orders", 3, 30, at=at(0))
    client.reject("billing", got[:2], error="bad", at=at(0))
    client.ack("billing", got[2:])
    client.conn.execute(
        "UPDATE dlq_messages SET dead_lettered_at = now()"
        " - CASE WHEN message_id = %s THEN interval '31 days' ELSE interval '1 day' END",
        (got[0].message_id,),
    )
    kept = RedeliveryConfig()
    assert maintenance.cleanup(client.conn, kept).get("dead_letters") is None  # kept by default
    config = RedeliveryConfig.model_validate({"retention": {"dead_letters": "30d"}})
    assert maintenance.cleanup(client.conn, config)["dead_letters"] == 1
    assert client.stats()["orders"]["billing"] == {
        "READY": 0, "INFLIGHT": 0, "WAITING_RETRY": 0, "COMMITTED": 1, "DLQ": 1, "BLOCKED": 0,
    }  # fmt: skip


@pytest.mark.timeout(120)
def test_deleting_a_topic_waits_for_a_receive_and_leaves_no_row(client, topic_group, clean_db):
    """A receive holds its subscription while it inserts its delivery rows: the delete waits for it,
    then deletes them with the rest."""
    client.publish("orders", [{"n": i} for i in range(5)])
    with Client(clean_db) as consumer:
        consumer.conn.execute("BEGIN")
        assert len(consumer.receive("billing", "orders", 5, 30)) == 5  # uncommitted
        deleting = threading.Thread(target=lambda: client.delete_topic("orders"))
        deleting.start()
        wait_for_session(clean_db, waiting_for_a_lock("LOCK_SUBSCRIPTIONS_FOR_DELETE"), "the delete waiting")
        consumer.conn.execute("COMMIT")
        deleting.join(30)
    for table in ("messages", "deliveries", "subscriptions", "dlq_messages"):
        assert client.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table


def test_the_maintenance_makes_the_next_partition_ahead(client, topic_group):
    from redelivery.config import RedeliveryConfig

    now = client.conn.execute("SELECT now()").fetchone()[0]
    done = maintenance.cleanup(client.conn, RedeliveryConfig())
    assert done["log_partitions_made"] == 2
    starts = [p[1] for p in partitions(client.conn)]
    assert starts[0] <= now < starts[1] and starts[1] - starts[0] == timedelta(hours=1)
    assert maintenance.cleanup(client.conn, RedeliveryConfig())["log_partitions_made"] == 0


@pytest.mark.timeout(120)
def test_a_detach_cut_off_halfway_never_stops_later_retention(client, topic_group, clean_db):
    """A concurrent detach cancelled while it waits (a user's statement_timeout, a killed
    session) leaves its partition pending; PostgreSQL then refuses any other concurrent detach of
    the log. The next retention run finishes the pending one first, and drops both."""
    [held] = client.publish("orders", [{"n": 0}], at=at(0))
    client.publish("orders", [{"n": 1}], at=at(HOUR))
    client.publish("orders", [{"n": 2}], at=at(2 * DAY))
    got = client.receive("billing", "orders", 3, 30, at=at(10))
    client.ack("billing", [m for m in got if m.message_id != held])  # the first hour is held
    with (
        psycopg.connect(clean_db, autocommit=True) as reader,
        psycopg.connect(clean_db, autocommit=True) as cut,
    ):
        reader.execute("BEGIN")
        reader.execute("SELECT 1 FROM redelivery.messages LIMIT 1")  # the detach waits for this reader
        cut.execute("SET statement_timeout = '300ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            cut.execute(
                "ALTER TABLE redelivery.messages"
                " DETACH PARTITION redelivery_log.messages_20260301t130000 CONCURRENTLY"
            )
        reader.execute("COMMIT")
    assert [p.detach_pending for p in log.partitions(client.conn)] == [False, True, False]
    client.ack("billing", [m for m in got if m.message_id == held])
    client.conn.execute("SET statement_timeout = '5s'")  # the run sets its own: none
    result = retention_at(client.conn, at(2 * DAY + 60))
    assert result.dropped == ["messages_20260301t120000", "messages_20260301t130000"]
    assert client.conn.execute("SHOW statement_timeout").fetchone()[0] == "5s"  # put back


@pytest.mark.timeout(120)
def test_a_subscription_from_the_beginning_waits_for_a_retention_run(client, topic_group, clean_db):
    """A retention run may be detaching a partition (invisible to new snapshots meanwhile): a
    subscription from the beginning waits for it, so that its offset never lands under a partition
    about to go or come back."""
    client.create_group("replay")
    with psycopg.connect(clean_db, autocommit=True) as retention:
        retention.execute(S.ADVISORY_LOCK, log.RETENTION_LOCK)  # a retention run is going on
        subscribing = threading.Thread(target=lambda: client.subscribe("replay", "orders", start="earliest"))
        subscribing.start()
        wait_for_session(
            clean_db, "wait_event_type = 'Lock' AND wait_event = 'advisory'", "the subscribe waiting"
        )
        assert subscribing.is_alive()
        retention.execute(S.ADVISORY_UNLOCK, log.RETENTION_LOCK)
        subscribing.join(30)
    assert "replay" in client.stats()["orders"]


@pytest.mark.timeout(120)
def test_a_receive_caught_in_a_deadlock_with_a_topic_delete_runs_again(
    client, topic_group, clean_db, database_url
):
    """A receive locks its READY rows, then its subscription; a topic delete locks the
    subscriptions, then the rows: PostgreSQL aborts one of them, and the receive runs again instead
    of failing with a deadlock (then finds nothing, looks the topic up again and says it is gone)."""
    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    client.nack("billing", client.receive("billing", "orders", 1, 30, at=at(0)), at=at(0))
    run_tier(TierRunRequest(tier="seconds", window_end=at(20), run_key="due"), url=database_url)
    assert message_state(client.conn, mid)["state"] == "READY"
    client.publish("orders", [{"n": 2}], at=at(0))  # past the offset: the receive locks the subscription
    topic_id = client.conn.execute("SELECT id FROM topics WHERE name = 'orders'").fetchone()[0]
    errors, got = [], []
    with Client(clean_db) as consumer, psycopg.connect(clean_db) as deleter:
        deleter.execute("SET search_path TO redelivery")
        deleter.execute(S.LOCK_TOPIC_FOR_DELETE, {"topic_id": topic_id})
        deleter.execute(S.LOCK_SUBSCRIPTIONS_FOR_DELETE, {"topic_id": topic_id})

        def receive() -> None:
            try:
                got.extend(consumer.receive("billing", "orders", 10, 30))
            except Exception as error:  # noqa: BLE001 (the test reports it)
                errors.append(error)

        receiving = threading.Thread(target=receive)
        receiving.start()
        wait_for_session(clean_db, waiting_for_a_lock("RECEIVE"), "the receive waiting for the subscription")
        deleter.execute(S.DELETE_TOPIC_DELIVERIES, {"topic_id": topic_id})  # waits for the READY row
        deleter.execute(S.DELETE_TOPIC, {"topic_id": topic_id})
        deleter.commit()
        receiving.join(30)
    assert [str(e) for e in errors] == ["unknown topic 'orders'"] and got == []
    assert client.conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 0


def _old_hour_done_and_a_new_message(client) -> None:
    """The log's first hour (12:00) holds one message the group acknowledged, past retention two
    days later; a message of two days later waits, unread."""
    client.publish("orders", [{"n": 0}], at=at(0))
    client.ack("billing", client.receive("billing", "orders", 1, 30, at=at(10)))
    client.publish("orders", [{"n": 9}], at=at(2 * DAY))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["copy", "one statement"])
def test_a_backdated_publish_racing_retention_is_never_lost(client, topic_group, clean_db, monkeypatch, path):
    """Issue 27, defect 1 (the outside audit's loss). A publish at an old time (a backfill's ``at``,
    a Spark publish stamped with its job's start) COPYs into a partition past retention, and
    retention looks at that partition before the publish commits. Before the fix retention saw no
    holder, began to detach it, a receive (whose snapshot no longer showed the partition) took a
    newer message and moved the offset past the hidden one, and retention dropped it: ``publish``
    had returned its id, the group never got it. Now retention waits for the publishers of a
    partition before it looks, and keeps them out while it detaches: the message is delivered.
    Both ways of writing a publish: retention looks after the COPY, or after the locks of a small
    batch's one statement (``publishing.SMALL_BATCH_MESSAGES``)."""
    from redelivery.messaging import publishing

    _old_hour_done_and_a_new_message(client)
    if path == "copy":
        monkeypatch.setattr(publishing, "SMALL_BATCH_MESSAGES", 0)
    hooked = (publishing, "record_published_batch") if path == "copy" else (log, "lock_partition_for_publish")
    record, retired = getattr(*hooked), {}
    reader = psycopg.connect(clean_db, autocommit=True)
    reader.execute("BEGIN")
    reader.execute("SELECT 1 FROM redelivery.messages LIMIT 1")  # a detach would wait for this reader

    def record_while_retention_looks(*args):
        locked = record(*args) if path == "one statement" else None  # its locks, then retention

        def retire() -> None:
            with db.connect(clean_db, autocommit=True) as conn:
                retired["result"] = retention_at(conn, at(2 * DAY + 60))

        retired["thread"] = threading.Thread(target=retire)
        retired["thread"].start()
        wait_for_session(
            clean_db, "wait_event_type = 'Lock' AND query LIKE '/* redelivery:%'", "retention waiting"
        )
        return locked or record(*args)

    monkeypatch.setattr(*hooked, record_while_retention_looks)
    [late] = client.publish("orders", [{"n": 1}], batch_id="late", at=at(1), retry=False)
    monkeypatch.setattr(*hooked, record)
    client.publish("orders", [{"n": 10}], at=at(2 * DAY + 30))  # newer than the late one
    got = client.receive("billing", "orders", 10, 30, at=at(2 * DAY + 60))
    client.ack("billing", got)
    reader.execute("COMMIT")
    reader.close()
    retired["thread"].join(60)
    got += client.receive("billing", "orders", 10, 30, at=at(2 * DAY + 90))
    assert late in {m.message_id for m in got}  # handed to the group, never dropped unseen
    assert sorted(m.body["n"] for m in got) == [1, 9, 10]


@pytest.mark.timeout(120)
def test_a_publish_at_a_time_retention_is_dropping_waits_and_lands_in_the_log(client, topic_group, clean_db):
    """A publish whose time falls in a partition retention is detaching waits for retention to be
    done with it (it neither writes into a partition on its way out nor is refused), then lands in
    a partition made again for its time, and is delivered."""
    _old_hour_done_and_a_new_message(client)
    with psycopg.connect(clean_db, autocommit=True) as reader, Client(clean_db) as publisher:
        reader.execute("BEGIN")
        reader.execute("SELECT 1 FROM redelivery.messages LIMIT 1")  # the detach waits for this reader
        retention = db.connect(clean_db, autocommit=True)
        done = {}
        retiring = threading.Thread(target=lambda: done.update(r=retention_at(retention, at(2 * DAY + 60))))
        retiring.start()
        wait_for_session(clean_db, waiting_for_a_lock("DETACH_LOG_PARTITION"), "the detach waiting")
        publishing = threading.Thread(
            target=lambda: done.update(ids=publisher.publish("orders", [{"n": 1}], at=at(1), retry=False))
        )
        publishing.start()
        wait_for_session(
            clean_db, "wait_event_type = 'Lock' AND wait_event = 'advisory'", "the publish waiting"
        )
        assert publishing.is_alive()
        reader.execute("COMMIT")
        retiring.join(60)
        publishing.join(60)
        retention.close()
    assert done["r"].dropped == ["messages_20260301t120000"]
    got = client.receive("billing", "orders", 10, 30, at=at(2 * DAY + 120))
    assert sorted(m.body["n"] for m in got) == [1, 9] and done["ids"][0] in {m.message_id for m in got}


def test_a_late_receipt_of_a_message_retention_dropped_is_stale_not_foreign(client, topic_group):
    """Issue 27 item 7: a receipt whose message is nowhere (no delivery row, not in the log, no dead
    letter) at or below the group's offset on its topic was handed to the group once: late, it is
    counted stale and lets the valid receipts of its call through. A message of another topic's log,
    or an id past the offset, is still foreign, and the call changes nothing."""
    from helpers import snapshot
    from redelivery.client import Outcome, Receipt
    from redelivery.errors import ForeignReceiptError

    client.create_topic("refunds")
    client.subscribe("billing", "refunds")
    client.publish("orders", [{"n": 1}, {"n": 2}, {"n": 3}], at=at(0))
    late = client.receive("billing", "orders", 3, 30, at=at(10))
    client.ack("billing", late)  # answered in time: the receipts kept are late from now on
    [refund] = client.publish("refunds", [{"n": 0}], at=at(2 * DAY))  # below orders' offset soon
    client.publish("orders", [{"n": i} for i in range(4, 8)], at=at(2 * DAY))
    assert retention_at(client.conn, at(2 * DAY + 60)).dropped == ["messages_20260301t120000"]
    assert message_state(client.conn, late[0].message_id) is None  # the log no longer holds it
    fresh = client.receive("billing", "orders", 4, 30, at=at(2 * DAY + 60))
    assert client.ack("billing", [late[0], fresh[0]]) == 1
    assert client.reject("billing", [late[1], fresh[1]], error="bad", at=at(2 * DAY + 61)) == 1
    assert client.nack("billing", late, at=at(2 * DAY + 61)) == 0
    assert client.settle("billing", [Outcome(late[2], "ack"), Outcome(fresh[2], "retry")]) == {
        "acked": 0, "retried": 1, "dead_lettered": 0, "stale": 1,
    }  # fmt: skip
    assert client.extend_lease("billing", [late[0], fresh[3]], 60, at=at(2 * DAY + 62)) == 1
    assert client.stale_receipts("billing") == 1 + 1 + 3 + 1 + 1
    states = [message_state(client.conn, m.message_id)["state"] for m in fresh]
    assert states == ["COMMITTED", "DLQ", "WAITING_RETRY", "INFLIGHT"]
    beyond = fresh[-1].message_id + 1000  # nowhere, and past the offset: never handed to billing
    before = snapshot(client.conn)
    valid = Receipt(fresh[3].message_id, 1, "orders", "billing")
    for receipt in (Receipt(refund, 1, "orders", "billing"), Receipt(beyond, 1, "orders", "billing")):
        with pytest.raises(ForeignReceiptError, match="not a message of topic 'orders'"):
            client.extend_lease("billing", [receipt, valid], 60, at=at(2 * DAY + 63))  # valid not extended
        with pytest.raises(ForeignReceiptError, match="not a message of topic 'orders'"):
            client.settle("billing", [Outcome(receipt, "ack")])
        with pytest.raises(ForeignReceiptError, match=f"message {receipt.message_id} is not a message"):
            client.settle("billing", [Outcome(valid, "ack"), Outcome(receipt, "ack")])
    assert snapshot(client.conn) == before


@pytest.mark.timeout(120)
def test_emptying_the_store_waits_for_a_partition_being_made_and_leaves_no_table_behind(client, clean_db):
    """A maintenance run of a test's Airflow makes a partition while a test empties the same store
    (the CI failure of stop 55: a table left in ``redelivery_log`` that ``log_partitions`` no longer
    listed, and every later publish of that hour refused with ``DuplicateTable``)."""
    with db.connect(clean_db, autocommit=True) as maker:
        maker.execute("BEGIN")
        maker.execute(S.ADVISORY_XACT_LOCK, {"namespace": log.PARTITION_LOCK, "key": 0})  # ensure_partition's
        emptied = threading.Event()

        def empty() -> None:
            with db.connect(clean_db, autocommit=True) as conn:
                maintenance.empty_state_store(conn)
            emptied.set()

        worker = threading.Thread(target=empty)
        worker.start()
        waiting = "wait_event_type = 'Lock' AND wait_event = 'advisory'"
        wait_for_session(clean_db, waiting, "the emptying", timeout=30)
        assert not emptied.is_set()
        name = log.partition_name(at(0))
        maker.execute(S.CREATE_LOG_PARTITION.format(partition=log._table(name)))
        maker.execute(
            S.REGISTER_LOG_PARTITION, {"partition_name": name, "starts_at": at(0), "ends_at": at(HOUR)}
        )
        maker.execute("COMMIT")
        worker.join(60)
    assert emptied.is_set()
    tables = client.conn.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = %s", (log.LOG_SCHEMA,)
    ).fetchone()[0]
    assert (tables, partitions(client.conn)) == (0, [])
