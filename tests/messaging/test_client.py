"""Every client state change against a real PostgreSQL."""

import psycopg
import pytest

from helpers import at, message_state
from redelivery.client import Client, Message
from redelivery.errors import UnknownTopicError

FIELDS = ("state", "delivery_count", "reconsume_times", "delay_level", "due_at", "last_error")


def state_of(client, message_id, group="billing"):
    found = message_state(client.conn, message_id, group)
    return None if found is None else tuple(found[f] for f in FIELDS)


def test_publish_gives_each_subscribed_group_its_own_ready_copy(client, topic_group):
    client.create_group("audit")
    client.subscribe("audit", "orders")
    client.create_group("unsubscribed")
    ids = client.publish("orders", [{"n": i} for i in range(3)], at=at(0))
    assert ids == sorted(ids) and len(ids) == 3
    stats = client.stats()
    assert stats["orders"]["billing"]["READY"] == 3
    assert stats["orders"]["audit"]["READY"] == 3
    assert "unsubscribed" not in stats["orders"]
    # one group's progress does not touch the other's
    got = client.receive("billing", "orders", 10, 30, at=at(0))
    assert client.ack("billing", got) == 3
    stats = client.stats()["orders"]
    assert stats["billing"]["COMMITTED"] == 3 and stats["audit"]["READY"] == 3


def test_bodies_round_trip_by_content_type(client, topic_group):
    client.publish(
        "orders",
        [
            {"a": [1, 2]},
            b"\x00\xff",
            Message("plain", content_type="text/plain"),
            Message('{"raw": true}', content_type="application/json", key="k1", properties={"origin": "erp"}),
        ],
    )
    got = client.receive("billing", "orders", 10, 30)
    assert [m.body for m in got] == [{"a": [1, 2]}, b"\x00\xff", "plain", {"raw": True}]
    assert got[3].key == "k1" and got[3].properties == {"origin": "erp"}


def test_receive_claims_oldest_first_and_skips_inflight(client, topic_group):
    client.publish("orders", [{"n": i} for i in range(5)])
    first = client.receive("billing", "orders", 2, 30)
    second = client.receive("billing", "orders", 10, 30)
    assert [m.body["n"] for m in first] == [0, 1]
    assert [m.body["n"] for m in second] == [2, 3, 4]
    assert client.receive("billing", "orders", 10, 30) == []


def test_delivery_count_is_committed_before_messages_are_returned(client, topic_group, clean_db):
    [mid] = client.publish("orders", [{"n": 1}])
    [got] = client.receive("billing", "orders", 1, 30)
    # another connection sees the delivery already counted: nothing left uncommitted
    with psycopg.connect(clean_db) as other:
        count = other.execute(
            "SELECT delivery_count, state::text FROM redelivery.deliveries WHERE message_id = %s", (mid,)
        ).fetchone()
    assert count == (1, "INFLIGHT") and got.delivery_count == 1
    assert got.invisible_until is not None


def test_nack_follows_the_rocketmq_level_table(client, topic_group):
    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    [got] = client.receive("billing", "orders", 1, 30, at=at(0))
    assert client.nack("billing", got, error="timeout calling ERP", at=at(5)) == 1
    state, count, reconsumed, level, due, error = state_of(client, mid)
    assert (state, count, reconsumed, level, error) == ("WAITING_RETRY", 1, 1, 1, "timeout calling ERP")
    assert due == at(15)  # failure time + 10 s (level 1)


def test_reconsume_later_with_delay_level_and_next_level(client, topic_group):
    ids = client.publish("orders", [{"n": i} for i in range(3)], at=at(0))
    a, b, c = client.receive("billing", "orders", 3, 30, at=at(0))
    client.reconsume_later("billing", a, delay=45, at=at(0))
    client.reconsume_later("billing", b, level=14, at=at(0))
    client.reconsume_later("billing", c, at=at(0))
    assert state_of(client, ids[0])[2:5] == (1, 3, at(45))  # 45 s routes to level 3 (1m), due after 45 s
    # level 14 of the broker's 18 levels (RocketMQ broker, "RocketMQ message retry") = 10m,
    # promoted with routing level 12 (10m)
    assert state_of(client, ids[1])[2:5] == (1, 12, at(600))
    assert state_of(client, ids[2])[2:5] == (1, 1, at(10))  # next level after 0 retries = 1


def test_retry_properties_on_redelivery(client, topic_group, database_url):
    from redelivery.tiers.run import TierRunRequest, run_tier

    [mid] = client.publish("orders", [Message({"n": 1}, properties={"tenant": "a"})], at=at(0))
    [first] = client.receive("billing", "orders", 1, 30, at=at(0))
    assert first.properties == {"tenant": "a"}
    client.nack("billing", first, error="e", at=at(0))
    run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="props"), url=database_url)
    [again] = client.receive("billing", "orders", 1, 30, at=at(10))
    assert again.delivery_count == 2 and again.reconsume_times == 1
    assert again.properties == {
        "tenant": "a",
        "REAL_TOPIC": "orders",
        "ORIGIN_MESSAGE_ID": str(mid),
        "RETRY_TOPIC": "%RETRY%billing",
        "RECONSUMETIMES": "1",
    }
    assert again.last_error == "e"


def test_max_reconsume_times_17th_failure_dead_letters(client, topic_group, database_url):
    from redelivery.tiers.run import TierRunRequest, run_tier

    [mid] = client.publish("orders", [{"n": 1}], at=at(0))
    clock = 0
    for attempt in range(1, 18):
        [got] = client.receive("billing", "orders", 1, 30, at=at(clock))
        assert got.delivery_count == attempt and got.reconsume_times == attempt - 1
        client.nack("billing", got, error=f"failure {attempt}", at=at(clock))
        if attempt == 17:
            break
        state, _, reconsumed, level, due, _ = state_of(client, mid)
        assert state == "WAITING_RETRY" and reconsumed == attempt and level == min(attempt, 16)
        clock = (due - at(0)).total_seconds()
        tier = next(t.name for t in client.config.tiers if level in t.levels)
        run_tier(TierRunRequest(tier=tier, window_end=due, run_key=f"r{attempt}"), url=database_url)
    assert state_of(client, mid)[:3] == ("DLQ", 17, 16)
    [dead] = client.dlq_list("billing")
    assert dead["reason"] == "MAX_DELIVERIES_EXCEEDED" and dead["reconsume_times"] == 16
    assert dead["delivery_count"] == 17 and dead["last_error"] == "failure 17" and dead["body"] == {"n": 1}
    assert dead["origin_message_id"] == mid and dead["first_failure_at"] == at(0)
    assert dead["dead_letter_queue"] == "%DLQ%billing"
    assert [a["error"] for a in dead["attempts"]] == [f"failure {n}" for n in range(1, 18)]
    assert [a["delivery"] for a in dead["attempts"]] == list(range(1, 18))


def test_unlimited_reconsume_times_never_dead_letters(client, topic_group):
    client.create_group("patient", max_reconsume_times=-1)
    client.subscribe("patient", "orders")
    [mid] = client.publish("orders", [{"n": 1}])
    for _ in range(20):
        [got] = client.receive("patient", "orders", 1, 30)
        client.nack("patient", got)
        client.conn.execute("UPDATE deliveries SET state = 'READY' WHERE message_id = %s", (mid,))
    assert state_of(client, mid, "patient")[2] == 20


def test_reject_dead_letters_at_once_and_creates_the_dlq_table_then(client, topic_group):
    client.publish("orders", [{"n": 1}, {"n": 2}])
    a, b = client.receive("billing", "orders", 2, 30)
    tables = lambda: client.conn.execute(  # noqa: E731
        "SELECT tablename FROM pg_tables WHERE schemaname = 'redelivery_dlq'"
    ).fetchall()
    client.nack("billing", a)
    assert tables() == []  # a retry does not create it
    assert client.reject("billing", b, error="schema violation") == 1
    assert tables() == [("%DLQ%billing",)]
    rows = client.conn.execute(
        'SELECT reason::text, last_error FROM redelivery_dlq."%DLQ%billing"'
    ).fetchall()
    assert rows == [("REJECTED", "schema violation")]
    assert client.stats()["orders"]["billing"]["DLQ"] == 1


def test_ack_of_a_lost_lease_is_ignored(client, topic_group, database_url):
    from redelivery.tiers.run import TierRunRequest, run_tier

    client.publish("orders", [{"n": 1}], at=at(0))
    [stale] = client.receive("billing", "orders", 1, 5, at=at(0))
    run_tier(
        TierRunRequest(tier="seconds", window_end=at(20), run_key="lease"), url=database_url
    )  # lease ended at 5 s
    [fresh] = client.receive("billing", "orders", 1, 30, at=at(20))
    assert fresh.delivery_count == 2
    assert client.ack("billing", stale) == 0  # the old delivery cannot commit the new one
    assert client.nack("billing", stale) == 0
    assert client.ack("billing", fresh) == 1
    assert client.stats()["orders"]["billing"]["COMMITTED"] == 1


def test_publish_batch_id_applies_once(client, topic_group):
    first = client.publish("orders", [{"n": 1}, {"n": 2}], batch_id="b-1")
    again = client.publish("orders", [{"n": 1}, {"n": 2}], batch_id="b-1")
    assert first == again
    assert client.stats()["orders"]["billing"]["READY"] == 2


def test_publish_large_batch_in_chunks(client, topic_group):
    ids = client.publish("orders", [{"n": i} for i in range(12_345)])
    assert len(ids) == 12_345 and len(set(ids)) == 12_345
    assert client.stats()["orders"]["billing"]["READY"] == 12_345


def test_delete_topic_removes_messages_and_dead_letters(client, topic_group):
    client.publish("orders", [{"n": 1}])
    client.reject("billing", client.receive("billing", "orders", 1, 30))
    client.delete_topic("orders")
    assert client.stats() == {}
    assert client.conn.execute("SELECT count(*) FROM dlq_messages").fetchone()[0] == 0


def test_clients_share_nothing_but_the_database(clean_db, topic_group):
    with Client(clean_db) as other:
        other.publish("orders", [{"n": 1}])
        [got] = other.receive("billing", "orders", 1, 30)
        other.ack("billing", got)
        assert other.stats()["orders"]["billing"]["COMMITTED"] == 1


def test_a_long_lived_client_follows_a_topic_deleted_and_made_again_elsewhere(client, topic_group, clean_db):
    """Issue 27, defect 5: another process deletes the topic and makes it again (a new id). The
    client that kept the old id looks it up again: its receive gets the new topic's messages (it
    returned [] forever), its publish writes to the topic that exists (it raised
    UnknownTopicError), its subscribe subscribes the new one."""
    client.publish("orders", [{"n": 0}])
    assert len(client.receive("billing", "orders", 10, 30)) == 1  # the old id is kept
    with Client(clean_db) as admin:
        admin.delete_topic("orders")
        admin.create_topic("orders")
        admin.create_group("audit")
        admin.subscribe("billing", "orders")
        admin.publish("orders", [{"n": 1}])
    assert [m.body["n"] for m in client.receive("billing", "orders", 10, 30)] == [1]
    [mid] = client.publish("orders", [{"n": 2}])
    client.subscribe("audit", "orders")
    assert [(m.message_id, m.body["n"]) for m in client.receive("billing", "orders", 10, 30)] == [(mid, 2)]
    client.publish("orders", [{"n": 3}])
    assert [m.body["n"] for m in client.receive("audit", "orders", 10, 30)] == [3]
    with Client(clean_db) as admin:
        admin.delete_topic("orders")
    with pytest.raises(UnknownTopicError, match="unknown topic 'orders'"):
        client.publish("orders", [{"n": 4}])
    with pytest.raises(UnknownTopicError, match="unknown topic 'orders'"):
        client.receive("billing", "orders", 10, 30)


def test_the_roles_share_the_clients_connection_when_a_caller_replaces_it(client, topic_group, clean_db):
    """A client is its roles (admin, publisher, consumer) over one connection: a connection the
    caller sets after the old one broke (the crash suite's workers reconnect so) is every role's."""
    topic, group = topic_group
    from redelivery.store import db

    client.conn.close()
    client.conn = db.connect(clean_db, autocommit=True)
    assert client.admin.conn is client.publisher.conn is client.consumer.conn is client.conn
    [message_id] = client.publish(topic, [{"n": 1}])
    [received] = client.receive(group, topic)
    assert received.message_id == message_id and client.ack(group, received) == 1
    assert client.stats()[topic][group]["COMMITTED"] == 1


def test_every_call_the_client_offers_shows_its_roles_signature_and_docstring():
    """help(Client.settle) and an IDE show what Consumer.settle takes (issue 39.4): each call a
    role offers through the client keeps its parameters, return type and docstring."""
    import inspect

    from redelivery.client import Client
    from redelivery.messaging.admin import Administration
    from redelivery.messaging.consuming import Consumer
    from redelivery.messaging.leasing import Receiver
    from redelivery.messaging.publishing import Publisher

    roles = (Administration, Publisher, Receiver, Consumer)
    offered = [name for name, value in vars(Client).items() if hasattr(value, "__wrapped__")]
    assert {"settle", "receive", "publish", "nack", "subscribe", "stats"} <= set(offered)
    for name in offered:
        [role] = [r for r in roles if getattr(r, name, None) is getattr(Client, name).__wrapped__]
        assert inspect.signature(getattr(Client, name)) == inspect.signature(getattr(role, name)), name
        assert getattr(Client, name).__doc__ and getattr(Client, name).__doc__ == getattr(role, name).__doc__
