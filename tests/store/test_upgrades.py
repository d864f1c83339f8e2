"""Migrations that convert a populated store, each on a database of its own: 0012 (a delivery row
per message and group, COMMITTED kept, becomes the log with offsets), 0013 (batches tagged on
every message become id ranges, fingerprinted by PostgreSQL), 0016 (long and empty keys) and 0020
(dead letters get their signature). Each message keeps its state per
group, and each batch id still publishes once."""

from __future__ import annotations

import pytest
from psycopg import sql

from redelivery.store import db

#: Races with nothing here, but a populated store takes a while: fail rather than hang.
pytestmark = pytest.mark.timeout(300)


# ---- migration 0012: today's layout of then, upgraded to the log -----------------------------------

#: A populated store of the layout before 0012 (a delivery row per message and group, COMMITTED and
#: DLQ rows kept): orders (8 messages) to billing, audit and late (subscribed after the first two:
#: no rows for them), refunds (2) to billing. billing on orders: 2 COMMITTED, 2 READY (one never
#: delivered, one redriven once), 1 INFLIGHT, 1 WAITING_RETRY, 1 DLQ (with its dead letter), and
#: 1 READY never delivered; audit: all COMMITTED; late: 6 READY; billing on refunds: 1 COMMITTED,
#: 1 INFLIGHT. Group totals set.
_OLD_STORE = """
    INSERT INTO topics (name) VALUES ('orders'), ('refunds');
    INSERT INTO consumer_groups (name, promoted, dead_lettered, redriven, stale_receipts)
    VALUES ('billing', 5, 1, 1, 2), ('audit', 0, 0, 0, 0), ('late', 0, 0, 0, 0);
    INSERT INTO subscriptions (topic_id, group_id)
    SELECT t.id, g.id FROM topics t, consumer_groups g
    WHERE (t.name, g.name) IN (('orders', 'billing'), ('orders', 'audit'), ('orders', 'late'),
                               ('refunds', 'billing'));
    INSERT INTO messages (topic_id, key, body, content_type, published_at)
    SELECT t.id, 'k' || i, convert_to('{"n": ' || i || '}', 'UTF8'), 'application/json',
           '2026-03-01 12:00+00'::timestamptz + i * interval '1 second'
    FROM generate_series(1, 10) i JOIN topics t ON t.name = CASE WHEN i <= 8 THEN 'orders' ELSE 'refunds' END;
    INSERT INTO deliveries (message_id, group_id, topic_id, state, delivery_count, reconsume_times,
                            delay_level, due_at, invisible_until, last_error, attempts,
                            redrive_count, ready_at)
    SELECT m.id, g.id, m.topic_id, x.state::delivery_state, x.count, x.reconsume, x.level,
           x.due::timestamptz, x.lease::timestamptz,
           x.error, x.attempts::jsonb, x.redriven, m.published_at
    FROM (VALUES
        ('billing', 1, 'COMMITTED', 1, 0, NULL, NULL, NULL, NULL, '[]', 0),
        ('billing', 2, 'COMMITTED', 3, 2, NULL, NULL, NULL, 'e2',
         '[{"delivery": 1, "outcome": "nack"}, {"delivery": 2, "outcome": "nack"}]', 0),
        ('billing', 3, 'READY', 0, 0, NULL, NULL, NULL, NULL, '[]', 0),
        ('billing', 4, 'INFLIGHT', 2, 1, 1, NULL, '2099-01-01 00:00+00', 'e4',
         '[{"delivery": 1, "outcome": "nack"}]', 0),
        ('billing', 5, 'WAITING_RETRY', 1, 1, 1, '2026-03-01 12:10+00', NULL, 'e5',
         '[{"delivery": 1, "outcome": "nack"}]', 0),
        ('billing', 6, 'DLQ', 2, 1, NULL, NULL, NULL, 'bad',
         '[{"delivery": 1, "outcome": "nack"}, {"delivery": 2, "outcome": "rejected"}]', 0),
        ('billing', 7, 'READY', 4, 0, NULL, NULL, NULL, 'e7', '[{"delivery": 4, "outcome": "rejected"}]', 1),
        ('billing', 8, 'READY', 0, 0, NULL, NULL, NULL, NULL, '[]', 0),
        ('billing', 9, 'COMMITTED', 1, 0, NULL, NULL, NULL, NULL, '[]', 0),
        ('billing', 10, 'INFLIGHT', 1, 0, NULL, NULL, '2099-01-01 00:00+00', NULL, '[]', 0)
    ) AS x(grp, n, state, count, reconsume, level, due, lease, error, attempts, redriven)
    JOIN consumer_groups g ON g.name = x.grp
    JOIN messages m ON m.key = 'k' || x.n
    UNION ALL
    SELECT m.id, g.id, m.topic_id,
           CASE WHEN g.name = 'audit' THEN 'COMMITTED' ELSE 'READY' END::delivery_state,
           CASE WHEN g.name = 'audit' THEN 1 ELSE 0 END, 0, NULL, NULL, NULL, NULL, '[]'::jsonb, 0,
           m.published_at
    FROM messages m JOIN topics t ON t.id = m.topic_id AND t.name = 'orders'
    JOIN consumer_groups g ON g.name = 'audit' OR (g.name = 'late' AND m.key NOT IN ('k1', 'k2'));
    INSERT INTO dead_letter_queues (name) VALUES ('%DLQ%billing');
    """


def _old_store(url: str) -> None:
    with db.connect(url, autocommit=True) as conn:
        conn.execute(_OLD_STORE)  # no parameters: the % of the DLQ's name is sent as it is
        conn.execute("SELECT setval('messages_id_seq', 100)")  # ids a deleted topic had taken
        [dlq_id] = conn.execute("SELECT id FROM dead_letter_queues").fetchone()
        conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF dlq_messages FOR VALUES IN ({})").format(
                sql.Identifier("redelivery_dlq", "%DLQ%billing"), sql.Literal(dlq_id)
            )
        )
        conn.execute(
            "INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, key, body,"
            " content_type, properties, published_at, reason, last_error, delivery_count, reconsume_times,"
            " attempts, redrive_count)"
            " SELECT %s, d.group_id, m.id, m.topic_id, m.id, m.key, m.body, m.content_type, m.properties,"
            " m.published_at, 'REJECTED', d.last_error, d.delivery_count, d.reconsume_times, d.attempts, 0"
            " FROM deliveries d JOIN messages m ON m.id = d.message_id WHERE d.state = 'DLQ'",
            (dlq_id,),
        )


#: The old layout's counts per (topic, group, state), as its STATE_COUNTS read them.
_OLD_COUNTS = """
    SELECT t.name, g.name, d.state::text, count(*) FROM deliveries d
    JOIN topics t ON t.id = d.topic_id JOIN consumer_groups g ON g.id = d.group_id GROUP BY 1, 2, 3"""


def test_the_log_migration_keeps_every_message_state_per_group(fresh_url):
    """0012 converts a populated store: each message keeps its state per group (the unfinished
    rows with their counts, leases and histories; COMMITTED history becomes offsets; dead letters
    stay), ``stats`` and the group totals are what they were, old receipts still answer, and the
    log goes on from the last id."""
    from helpers import message_state
    from redelivery.client import Client
    from redelivery.messaging.codec import ReceivedMessage
    from redelivery.redrive import RedriveRequest, redrive

    db.migrate(fresh_url, "0011")
    _old_store(fresh_url)
    with db.connect(fresh_url) as conn:
        before = {(t, g, s): n for t, g, s, n in conn.execute(_OLD_COUNTS)}
        totals = conn.execute("SELECT name, promoted, dead_lettered, redriven, stale_receipts"
                              " FROM consumer_groups ORDER BY 1").fetchall()  # fmt: skip
        rows = {(m, g): r for m, g, *r in conn.execute(
            "SELECT d.message_id, g.name, d.state::text, d.delivery_count, d.reconsume_times, d.delay_level,"
            " d.due_at, d.invisible_until, d.attempts, d.redrive_count"
            " FROM deliveries d JOIN consumer_groups g ON g.id = d.group_id")}  # fmt: skip
    db.migrate(fresh_url)
    with Client(fresh_url) as client:
        after = {(t, g, s): n for t, groups in client.stats().items() for g, c in groups.items()
                 for s, n in c.items() if n}  # fmt: skip
        assert after == before
        assert client.conn.execute("SELECT name, promoted, dead_lettered, redriven, stale_receipts"
                                   " FROM consumer_groups ORDER BY 1").fetchall() == totals  # fmt: skip
        for (m, group), (state, count, reconsume, level, due, lease, attempts, redriven) in rows.items():
            now = message_state(client.conn, m, group)
            if state == "COMMITTED":
                assert now["state"] == "COMMITTED", (m, group, now)
                continue
            kept = (
                now["state"],
                now["delivery_count"],
                now["reconsume_times"],
                now["attempts"],
                now["redrive_count"],
            )
            assert kept == (state, count, reconsume, attempts, redriven), (m, group)
            if state != "DLQ":
                assert (now["delay_level"], now["due_at"], now["invisible_until"]) == (level, due, lease)
        inflight = client.conn.execute(
            "SELECT message_id FROM deliveries WHERE state = 'INFLIGHT' AND delivery_count = 2"
        ).fetchone()[0]
        # an old consumer's receipt: its delivery, received before the upgrade
        receipt = ReceivedMessage(message_id=inflight, group="billing", topic="orders", key=None, body=None,
                                  content_type="application/json", properties={}, published_at=None,
                                  delivery_count=2, reconsume_times=1, delay_level=None, invisible_until=None,
                                  origin_message_id=inflight, last_error=None, redrive_count=0)  # fmt: skip
        assert client.ack("billing", [receipt]) == 1
        got = client.receive("billing", "orders", 10, 30)  # the READY rows, each one more delivery
        assert sorted((m.body["n"], m.delivery_count, m.redrive_count) for m in got) == [
            (3, 1, 0),
            (7, 5, 1),
            (8, 1, 0),
        ]
        assert len(client.receive("late", "orders", 10, 30)) == 6  # never the two before it subscribed
        assert client.receive("audit", "orders", 10, 30) == []
        [new] = client.publish("orders", [{"n": 11}])
        assert new > 100  # never an id the old sequence gave (redrive_moves may still name it)
        assert [m.message_id for m in client.receive("audit", "orders", 10, 30)] == [new]
    moved = redrive(RedriveRequest(group="billing", dry_run=False, rate_limit=None), run_key="after",
                    url=fresh_url, log=lambda *_: None)  # fmt: skip
    assert moved["moved"] == 1
    with Client(fresh_url) as client:
        again, new_one = client.receive("billing", "orders", 10, 30)  # the READY row first, then the log
        assert (again.body["n"], again.delivery_count, again.redrive_count) == (6, 3, 1)
        assert (new_one.body["n"], new_one.delivery_count) == (11, 1)


def test_the_log_migration_gives_a_future_publish_time_a_partition_of_its_own(fresh_url):
    """Issue 27, defect 10: one message published at 2099 in an old store. Before, 0012's partition
    ran from the beginning of time to the hour after the newest message (2099): every later message
    landed in it and retention could drop nothing. Now it ends with the current hour, and the
    message of 2099 gets the partition of its own hour."""
    from datetime import timedelta

    from redelivery.client import Client
    from redelivery.store import log

    db.migrate(fresh_url, "0011")
    with db.connect(fresh_url, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO topics (name) VALUES ('orders');
            INSERT INTO consumer_groups (name) VALUES ('billing');
            INSERT INTO subscriptions (topic_id, group_id) SELECT t.id, g.id FROM topics t, consumer_groups g;
            INSERT INTO messages (topic_id, key, body, content_type, published_at)
            SELECT t.id, k, convert_to('{}', 'UTF8'), 'application/json', p::timestamptz
            FROM topics t,
                 (VALUES ('now', now() - interval '2 days'), ('future', '2099-06-01 10:30+00')) x(k, p);
            INSERT INTO deliveries (message_id, group_id, topic_id, state, delivery_count, ready_at)
            SELECT m.id, g.id, m.topic_id, 'COMMITTED', 1, m.published_at FROM messages m, consumer_groups g;
            """)
    db.migrate(fresh_url)
    with Client(fresh_url) as client:
        now = client.conn.execute("SELECT now()").fetchone()[0]
        upgraded, future = log.partitions(client.conn)
        assert upgraded.name == "messages_upgraded" and upgraded.ends_at <= now + timedelta(hours=1)
        assert (future.name, future.ends_at - future.starts_at) == (
            "messages_20990601t100000",
            timedelta(hours=1),
        )
        assert client.conn.execute(
            "SELECT tableoid::regclass::text FROM messages WHERE key = 'future'"
        ).fetchone() == ("redelivery_log.messages_20990601t100000",)
        [new] = client.publish("orders", [{"n": 1}], at=now + timedelta(hours=3))
        where = client.conn.execute("SELECT tableoid::regclass::text FROM messages WHERE id = %s", (new,))
        assert where.fetchone()[0] not in (
            "redelivery_log.messages_upgraded",
            "redelivery_log.messages_20990601t100000",
        )
        client.ack("billing", client.receive("billing", "orders", 10, 30))
        dropped = log.drop_expired_partitions(client.conn, 86400, at=now + timedelta(days=3)).dropped
        assert dropped[0] == "messages_upgraded" and "messages_20990601t100000" not in dropped


# ---- migration 0013: batches as id ranges, fingerprinted by PostgreSQL -----------------------------

#: Batches of the layout before 0013 (every message tagged with its batch id, fingerprints made by
#: the client): 'whole' (3 messages, all in the log), 'partial' (2 of its 3 messages left: the third
#: was dropped), 'gone' (no message left), 'odd' and 'even' (published at once before 0012, their
#: ids interleaved); and a Spark publish's staged row of the old format.
_TAGGED_BATCHES = """
    INSERT INTO topics (name) VALUES ('orders');
    INSERT INTO consumer_groups (name) VALUES ('billing');
    INSERT INTO subscriptions (topic_id, group_id) SELECT t.id, g.id FROM topics t, consumer_groups g;
    CREATE TABLE redelivery_log.messages_old PARTITION OF messages
        FOR VALUES FROM ('2026-03-01 12:00+00') TO ('2026-03-01 13:00+00');
    INSERT INTO log_partitions (partition_name, starts_at, ends_at)
    VALUES ('messages_old', '2026-03-01 12:00+00', '2026-03-01 13:00+00');
    INSERT INTO messages (topic_id, key, body, content_type, publish_batch, published_at)
    SELECT t.id, 'k' || i, convert_to('{"n": ' || i || '}', 'UTF8'), 'application/json',
           CASE WHEN i <= 3 THEN 'whole' ELSE 'partial' END, '2026-03-01 12:00+00'
    FROM generate_series(1, 5) i, topics t;
    INSERT INTO messages (topic_id, key, body, content_type, publish_batch, published_at)
    SELECT t.id, 'i' || i, convert_to('{"i": ' || i || '}', 'UTF8'), 'application/json',
           CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END, '2026-03-01 12:00+00'
    FROM generate_series(1, 4) i, topics t;
    INSERT INTO publish_batches (batch_id, topic_id, message_count, fingerprint, published_at)
    SELECT b, t.id, CASE WHEN b IN ('even', 'odd') THEN 2 ELSE 3 END, '3:0123456789abcdef',
           '2026-03-01 12:00+00'
    FROM unnest(ARRAY['whole', 'partial', 'gone', 'even', 'odd']) b, topics t;
    INSERT INTO publish_staging (batch_id, run_id, part, seq, key, body, content_type)
    VALUES ('unfinished', 'r', 0, 0, NULL, '\\x7b7d', 'application/json');
    """


def test_the_range_migration_keeps_every_batch_published_once(fresh_url):
    """0013 on a store with tagged batches: a batch whose messages are all in the log gets their
    range and PostgreSQL's fingerprint (the same content publishes nothing more, other content is a
    conflict); one whose messages partly left keeps its count to compare; the log refuses a body
    that is not JSON; an old-format staged row is gone."""
    from redelivery.client import Client, Message
    from redelivery.errors import BatchConflictError, BatchExpiredError, MalformedMessageError

    db.migrate(fresh_url, "0012")
    with db.connect(fresh_url, autocommit=True) as conn:
        conn.execute(_TAGGED_BATCHES)
    db.migrate(fresh_url)
    with Client(fresh_url) as client:
        ids = [r[0] for r in client.conn.execute("SELECT id FROM messages ORDER BY id")]
        at = client.conn.execute("SELECT '2026-03-01 12:30+00'::timestamptz").fetchone()[0]
        messages = [Message(f'{{"n": {i}}}', key=f"k{i}", content_type="application/json") for i in (1, 2, 3)]
        assert client.publish("orders", messages, batch_id="whole", at=at) == ids[:3]
        with pytest.raises(BatchConflictError, match="other content"):
            client.publish("orders", [Message('{"n": 9}', key="k1")] + messages[1:], batch_id="whole", at=at)
        partial = [Message({"n": i}, key=f"k{i}") for i in (4, 5, 6)]
        # 3 messages, 2 still in the log: compared by its count, and said to have left the log (its
        # ids, given by its first publish, cannot all be given again)
        with pytest.raises(BatchExpiredError, match="left the log"):
            client.publish("orders", partial, batch_id="partial", at=at)
        with pytest.raises(BatchConflictError, match="other content"):
            client.publish("orders", partial[:2], batch_id="partial", at=at)
        with pytest.raises(BatchExpiredError, match="left the log"):  # recorded, nothing left
            client.publish("orders", partial, batch_id="gone", at=at)
        odd = [Message(f'{{"i": {i}}}', key=f"i{i}", content_type="application/json") for i in (1, 3)]
        assert client.publish("orders", odd, batch_id="odd", at=at) == [ids[5], ids[7]]  # not ids[6]
        with pytest.raises(BatchConflictError, match="other content"):
            client.publish("orders", odd[:1] * 2, batch_id="odd", at=at)
        assert client.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 9
        with pytest.raises(MalformedMessageError, match="message 0: body is not valid application/json"):
            client.publish("orders", [Message("{broken", content_type="application/json")], at=at)
        assert client.conn.execute("SELECT count(*) FROM publish_staging").fetchone()[0] == 0
        [new] = client.publish("orders", [{"n": 7}], batch_id="new", at=at)
        assert client.publish("orders", [{"n": 7}], batch_id="new", at=at) == [new]


# ---- migration 0016: ordering keys by digest, "" no key ------------------------------------------

#: An ordered store of 0015, as its statements left it: billing subscribed ordered (halt) to orders,
#: its offset past 4 messages. Key "a": its head INFLIGHT, one BLOCKED; key "": a HALTED head (its
#: dead letter) and one BLOCKED. Past the offset a message with a key of 3,000 characters that do
#: not compress (``%(long)s``: 0015's every receive failed on it), then a message of key "b".
_ORDERED_STORE = """
    INSERT INTO topics (name) VALUES ('orders');
    INSERT INTO consumer_groups (name) VALUES ('billing');
    INSERT INTO subscriptions (topic_id, group_id, ordered, on_exhausted, consume_offset, messages_taken)
    SELECT t.id, g.id, true, 'halt', 0, 4 FROM topics t, consumer_groups g;
    INSERT INTO messages (topic_id, key, body, content_type, published_at)
    SELECT t.id, k, convert_to('{}', 'UTF8'), 'application/json', now()
    FROM topics t, unnest(ARRAY['a', '', 'a', '', %(long)s, 'b']) WITH ORDINALITY AS x(k, i) ORDER BY i;
    UPDATE subscriptions SET consume_offset = (SELECT min(id) + 3 FROM messages);
    INSERT INTO dead_letter_queues (name) VALUES ('%DLQ%billing');
    INSERT INTO deliveries (topic_id, group_id, message_id, published_at, key, state, delivery_count,
                            invisible_until, ready_at)
    SELECT m.topic_id, g.id, m.id, m.published_at, m.key, x.state::delivery_state, x.count,
           CASE WHEN x.state = 'INFLIGHT' THEN now() + interval '1 hour' END, m.published_at
    FROM (VALUES (0, 'INFLIGHT', 1), (1, 'HALTED', 1), (2, 'BLOCKED', 0), (3, 'BLOCKED', 0))
        AS x(n, state, count)
    JOIN messages m ON m.id = (SELECT min(id) FROM messages) + x.n, consumer_groups g;
    """


def test_the_digest_migration_unsticks_a_long_key_and_makes_an_empty_key_none(fresh_url):
    """0016 on a store of 0015 that a 3,000-character key had stuck (its btree index refused the
    key: every receive raised ProgramLimitExceeded): the receive hands it out after the upgrade; a
    head and its BLOCKED message keep their order; key "" is no key (its HALTED head goes, its
    dead letter stays, its BLOCKED message is READY)."""
    import os

    import psycopg

    from redelivery.client import Client
    from redelivery.store import catalog, log

    db.migrate(fresh_url, "0015")
    long = os.urandom(1500).hex()
    with db.connect(fresh_url, autocommit=True) as conn:
        log.ensure_partition(conn, conn.execute("SELECT now()").fetchone()[0], 3600)
        for statement in filter(str.strip, _ORDERED_STORE.split(";")):
            conn.execute(statement, {"long": long} if "%(long)s" in statement else None)
        [dlq_id] = conn.execute("SELECT id FROM dead_letter_queues").fetchone()
        catalog.ensure_dlq_tables(conn, {dlq_id})
        conn.execute(
            "INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, key, body,"
            " content_type, properties, published_at, reason, delivery_count, reconsume_times, attempts,"
            " redrive_count) SELECT %s, d.group_id, m.id, m.topic_id, m.id, m.key, m.body, m.content_type,"
            " m.properties, m.published_at, 'REJECTED', 1, 0, '[]', 0"
            " FROM deliveries d JOIN messages m ON m.id = d.message_id WHERE d.state = 'HALTED'",
            (dlq_id,),
        )
        a1, e1, a2, e2, big, b1 = [r[0] for r in conn.execute("SELECT id FROM messages ORDER BY id")]
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):  # what 0015's receive met
            conn.execute(
                "INSERT INTO deliveries (topic_id, group_id, message_id, published_at, key, state,"
                " delivery_count, invisible_until, ready_at) SELECT topic_id, 1, id, published_at, key,"
                " 'INFLIGHT', 1, now(), now() FROM messages WHERE id = %s",
                (big,),
            )
    db.migrate(fresh_url)
    with Client(fresh_url) as client:
        rows = dict(client.conn.execute("SELECT message_id, state::text FROM deliveries").fetchall())
        assert rows == {a1: "INFLIGHT", a2: "BLOCKED", e2: "READY"}
        assert client.conn.execute("SELECT count(*) FROM deliveries WHERE key = ''").fetchone()[0] == 0
        got = client.receive("billing", "orders", 10, 300)
        assert [(m.message_id, m.key) for m in got] == [(e2, ""), (big, long), (b1, "b")]
        ready = "UPDATE deliveries SET state = 'READY', invisible_until = NULL WHERE message_id = %s"
        client.conn.execute(ready, (a1,))
        [head] = client.receive("billing", "orders", 10, 300)
        client.ack("billing", head)
        assert [m.message_id for m in client.receive("billing", "orders", 10, 300)] == [a2]
        states = client.stats()["orders"]["billing"]
        assert (states["DLQ"], states["BLOCKED"], states["INFLIGHT"]) == (1, 0, 4)


# ---- migration 0020: dead letters of text errors get their signature --------------------------------


def _migration_0020():
    import importlib.util

    path = db.MIGRATIONS / "versions" / "0020_error_signatures.py"
    spec = importlib.util.spec_from_file_location("migration_0020", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_signature_migration_gives_the_dead_letters_there_the_signature_of_their_text(fresh_url):
    """0020 on a store of 0019 holding dead letters with text errors (one without, one undecodable,
    one of an ended lease), cut off once after its first steps committed (as a lock timeout or a
    killed job leaves it) and run again: each dead letter gets the signature a new dead letter of
    the same failure gets (the text's, or redelivery's own class's), in batches; a dead letter
    made without one afterwards (a process of the version before) gets it from the trigger."""
    from redelivery.dead_letters import DlqFilter, groups
    from redelivery.store import catalog

    db.migrate(fresh_url, "0019")
    with db.connect(fresh_url, autocommit=True) as conn:
        conn.execute("INSERT INTO topics (name) VALUES ('orders')")
        conn.execute("INSERT INTO consumer_groups (name) VALUES ('billing')")
        [dlq_id] = conn.execute(
            "INSERT INTO dead_letter_queues (name) VALUES ('%DLQ%billing') RETURNING id"
        ).fetchone()
        catalog.ensure_dlq_tables(conn, {dlq_id})
        insert = (
            "INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, body,"
            " content_type, properties, published_at, reason, last_error, delivery_count, reconsume_times,"
            " attempts, redrive_count)"
            " SELECT %s, g.id, i, t.id, i, '{}', 'application/json', '{}', now(), r::dlq_reason, e, 1, 0,"
            " a::jsonb, 0 FROM topics t, consumer_groups g, unnest(%s::text[], %s::text[], %s::text[])"
            " WITH ORDINALITY AS x(e, r, a, i)"
        )
        lease = '[{"outcome": "lease_expired", "error": "lease expired"}]'
        conn.execute(insert, (dlq_id, ["timeout on node 7 after 30 s", "timeout on node 12 after 31 s", None,
                                        "not JSON: nested too deep", "lease expired"],
                              ["REJECTED", "REJECTED", "REJECTED", "UNDECODABLE", "MAX_DELIVERIES_EXCEEDED"],
                              ["[]", "[]", "[]", "[]", lease]))  # fmt: skip
        migration = _migration_0020()  # cut off: its first steps committed, the version still 0019
        conn.execute(migration.FUNCTIONS.replace("%", "%%"))
        conn.execute("ALTER TABLE dlq_messages ADD COLUMN error_class text, ADD COLUMN signature text")
    db.migrate(fresh_url)  # run again: every step again, nothing refused
    with db.connect(fresh_url, autocommit=True) as conn:
        conn.execute(  # a process of the version before: no signature, no class
            "INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, body,"
            " content_type, properties, published_at, reason, last_error, delivery_count, reconsume_times,"
            " attempts, redrive_count) SELECT %s, 1, 6, 1, 6, '{}', 'application/json', '{}', now(),"
            " 'REJECTED', 'timeout on node 3 after 9 s', 1, 0, '[]', 0",
            (dlq_id,),
        )
        found = {g["newest_message_id"]: g for g in groups(conn, DlqFilter(group="billing"))}
        assert sorted(g["count"] for g in found.values()) == [1, 1, 1, 3]
        expected = conn.execute(
            "SELECT error_signature(NULL, 'timeout on node 1 after 1 s', NULL),"
            " error_signature('redelivery.UndecodableBody', 'not JSON: nested too deep', NULL),"
            " error_signature('redelivery.LeaseExpired', 'lease expired', NULL)"
        ).fetchone()
        assert found[6]["signature"] == expected[0] and found[6]["error_class"] is None
        assert (found[4]["signature"], found[4]["error_class"]) == (expected[1], "redelivery.UndecodableBody")
        assert (found[5]["signature"], found[5]["error_class"]) == (expected[2], "redelivery.LeaseExpired")
        assert found[3]["signature"] is not None, "no error text is a signature too"
        assert conn.execute("SELECT count(*) FROM dlq_messages WHERE signature IS NULL").fetchone()[0] == 0
