"""What must never break slowly or for everyone: a bad subscription stops nothing else, windows
never run ahead of the database's clock, the level table cannot shrink under waiting messages,
nothing leaks, deleting a topic races with nothing, the embedded database needs its password."""

import json
import os
import stat
import threading
from datetime import timedelta

import psycopg
import pytest

from helpers import at, configured, wait_for_session, waiting_for_a_lock
from redelivery.client import Client
from redelivery.config import RedeliveryConfig
from redelivery.errors import (
    ConfigError,
    InvalidNameError,
    InvalidWindowError,
    SchemaNotMigratedError,
    UnknownTopicError,
)
from redelivery.store import embedded, maintenance
from redelivery.tiers.run import TierRunRequest, run_tier

LONG_GROUP = "g" * 56  # fits the name rule; "orders-<group>-DLQ" (Pulsar naming) does not fit 63 bytes


def test_group_names_leave_room_for_their_queue_names(client):
    client.create_group("g" * 56)  # %RETRY%<56 chars> is 63 bytes
    with pytest.raises(InvalidNameError, match="1 to 56"):
        client.create_group("g" * 57)
    with pytest.raises(InvalidNameError):
        client.create_topic("orders\n")  # a trailing newline is not a name


def test_a_pair_whose_queue_names_cannot_be_tables_is_refused_at_subscribe(client):
    client.create_topic("orders")
    client.create_group(LONG_GROUP)
    configured(client, {"dead_letter": {"style": "pulsar"}, "retry_naming": {"style": "pulsar"}})
    with pytest.raises(InvalidNameError, match="cannot subscribe"):
        client.subscribe(LONG_GROUP, "orders")
    assert client.stats() == {}


def test_one_unresolvable_subscription_never_stops_the_others(client, topic_group, database_url):
    """A config changed after the subscriptions were made: one of them can no longer be resolved.
    Tier runs report it and move every other one; publishing to its topic still works."""
    client.create_group(LONG_GROUP)
    client.subscribe(LONG_GROUP, "orders")  # fine under the RocketMQ naming
    client.publish("orders", [{"n": i} for i in range(3)], at=at(0))
    client.nack("billing", client.receive("billing", "orders", 3, 30, at=at(0)), at=at(0))
    client.receive(LONG_GROUP, "orders", 3, 5, at=at(0))
    changed = configured(client, {"group": LONG_GROUP, "dead_letter": {"style": "pulsar"}})
    summary = run_tier(
        TierRunRequest(tier="seconds", window_end=at(10), run_key="bad"), url=database_url, config=changed
    )
    assert summary["promoted"] == 3 and summary["retried_after_lease_expiry"] == 0
    [problem] = summary["unresolved_subscriptions"]
    assert problem["group"] == LONG_GROUP and "longer than 63 bytes" in problem["error"]
    assert client.stats()["orders"][LONG_GROUP]["INFLIGHT"] == 3  # left alone
    assert len(client.publish("orders", [{"n": 9}])) == 1


def test_a_window_never_ends_after_the_database_clock(client, topic_group, database_url):
    now = client.conn.execute("SELECT now()").fetchone()[0]
    with pytest.raises(InvalidWindowError, match="after the database's clock"):
        run_tier(
            TierRunRequest(tier="seconds", window_end=now + timedelta(seconds=1), run_key="early"),
            url=database_url,
        )
    assert client.conn.execute("SELECT count(*) FROM tier_runs").fetchone()[0] == 0
    assert (
        run_tier(TierRunRequest(tier="seconds", window_end=now, run_key="now"), url=database_url)["promoted"]
        == 0
    )


def test_a_level_table_that_drops_waiting_levels_is_refused(client, topic_group, database_url):
    client.publish("orders", [{"n": 1}, {"n": 2}], at=at(0))
    client.reconsume_later(
        "billing", client.receive("billing", "orders", 2, 30, at=at(0)), delay=3600, at=at(0)
    )
    shrunk = RedeliveryConfig.model_validate(
        {"delay_levels": "10s 30s 1m", "tiers": [{"name": "seconds", "levels": [1, 2, 3], "window": "10s"}]}
    )
    with pytest.raises(ConfigError, match="2 at level 15"):
        run_tier(
            TierRunRequest(tier="seconds", window_end=at(10), run_key="shrunk"),
            url=database_url,
            config=shrunk,
        )
    with pytest.raises(ConfigError, match="levels beyond it"):
        Client(database_url, config=shrunk)


def identity_values(conn) -> dict:
    return dict(
        conn.execute(
            """SELECT sequencename, last_value FROM pg_sequences
               WHERE schemaname = 'redelivery' AND sequencename IN
                 ('topics_id_seq', 'consumer_groups_id_seq', 'dead_letter_queues_id_seq')"""
        ).fetchall()
    )


def test_repeated_calls_use_up_no_identity_values(client, topic_group):
    client.publish("orders", [{"n": 1}])
    client.receive("billing", "orders", 1, 30)  # registers the group's DLQ name
    before = identity_values(client.conn)
    for _ in range(20):
        client.create_topic("orders")
        client.create_group("billing")
        with Client(client.url) as other:
            other.publish("orders", [{"n": 1}])  # resolves the policy table: registers the DLQ name again
            other.receive("billing", "orders", 1, 30)
    assert identity_values(client.conn) == before


def test_cleanup_deletes_only_what_is_past_its_retention(client, topic_group, database_url):
    [first] = client.publish("orders", [{"n": 1}], batch_id="old")
    client.publish("orders", [{"n": 2}], batch_id="new")
    run_tier(TierRunRequest(tier="seconds", window_end=at(10), run_key="old-run"), url=database_url)
    client.conn.execute(
        "UPDATE publish_batches SET published_at = now() - interval '8 days' WHERE batch_id = 'old'"
    )
    client.conn.execute("UPDATE tier_runs SET finished_at = now() - interval '8 days'")
    deleted = maintenance.cleanup(client.conn, client.config, limit=1)
    assert deleted["publish_batches"] == 1 and deleted["tier_runs"] == 1
    assert client.conn.execute("SELECT batch_id FROM publish_batches").fetchall() == [("new",)]
    again = client.publish("orders", [{"n": 3}, {"n": 4}], batch_id="old")  # past its retention: a new batch
    assert len(again) == 2 and first not in again
    assert client.publish("orders", [{"n": 3}, {"n": 4}], batch_id="old") == again  # and only it replays
    assert client.stats()["orders"]["billing"]["READY"] == 4


def test_settle_markers_have_their_own_retention(client, topic_group, database_url, tmp_path):
    """Settle markers (``settle_parts``: a Spark task's part settled once) are kept for
    ``retention.settle_markers``, not for the tier runs' setting (default: 7d, as before)."""
    from helpers import run_cli
    from redelivery.client import Outcome

    assert RedeliveryConfig().retention.settle_markers == "7d"
    client.publish("orders", [{"n": 1}, {"n": 2}, {"n": 3}])
    for part, got in enumerate(client.receive("billing", "orders", 3, 30)):
        assert client.settle("billing", [Outcome(got, "ack")], marker=("spark-run", part))["acked"] == 1
    client.conn.execute("UPDATE settle_parts SET settled_at = now() - interval '3 days' WHERE part = 0")
    client.conn.execute("UPDATE settle_parts SET settled_at = now() - interval '30 hours' WHERE part = 1")

    def parts():
        return [p for (p,) in client.conn.execute("SELECT part FROM settle_parts ORDER BY part")]

    # tier runs kept for a day only: the markers keep their own (default) 7 days
    config = RedeliveryConfig(retention={"tier_runs": "1d"})
    assert maintenance.cleanup(client.conn, config)["settle_parts"] == 0
    assert parts() == [0, 1, 2]
    config = RedeliveryConfig(retention={"tier_runs": "30d", "settle_markers": "2d"})
    assert maintenance.cleanup(client.conn, config)["settle_parts"] == 1
    assert parts() == [1, 2]
    path = tmp_path / "redelivery.yaml"  # the command reads it from the config file
    path.write_text("retention:\n  tier_runs: 30d\n  settle_markers: 1d\n")
    done = run_cli("cleanup", "--json", database_url=database_url, env={"REDELIVERY_CONFIG": str(path)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["settle_parts"] == 1 and parts() == [2]


def test_a_sequence_that_caches_message_ids_is_refused(client, topic_group, clean_db):
    """Consume offsets need a topic's ids to grow in commit order: with a sequence cache, another
    session's cached ids can be below an offset a receive already moved past, and that message would
    never be delivered. A client refuses such a schema; with the schema's CACHE 1, publishes of two
    sessions reach the group in order, none passed."""
    client.conn.execute("ALTER SEQUENCE message_ids CACHE 50")
    try:
        with pytest.raises(SchemaNotMigratedError, match="CACHE 1"):
            Client(clean_db)
    finally:
        client.conn.execute("ALTER SEQUENCE message_ids CACHE 1")
    with Client(clean_db) as other:
        other.publish("orders", [{"n": 0}])
        client.publish("orders", [{"n": 1}], batch_id="b")
        assert [m.body["n"] for m in client.receive("billing", "orders", 10, 30)] == [0, 1]
        other.publish("orders", [{"n": 2}, {"n": 3}], batch_id="c")
        assert [m.body["n"] for m in client.receive("billing", "orders", 10, 30)] == [2, 3]


@pytest.mark.timeout(120)  # a race: were a lock never granted, fail rather than hang
def test_deleting_a_topic_while_a_message_is_dead_lettered_leaves_no_dead_letter(
    client, topic_group, clean_db
):
    client.publish("orders", [{"n": 1}, {"n": 2}])
    first, second = client.receive("billing", "orders", 2, 30)
    client.reject("billing", first)  # the DLQ table exists before the race
    got = [second]
    with Client(clean_db) as other:
        other.conn.execute("BEGIN")
        assert other.reject("billing", got) == 1  # dead-lettered, not committed yet
        deleting = threading.Thread(target=lambda: client.delete_topic("orders"))
        deleting.start()
        # the delete waits for the dead-lettering transaction's row lock
        wait_for_session(
            clean_db, waiting_for_a_lock("DELETE_TOPIC_DELIVERIES"), "the delete waiting for the row"
        )
        assert deleting.is_alive()
        other.conn.execute("COMMIT")
        deleting.join(10)
        assert not deleting.is_alive()
    assert client.conn.execute("SELECT count(*) FROM dlq_messages").fetchone()[0] == 0
    assert client.conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 0


@pytest.mark.timeout(120)  # a race: were a lock never granted, fail rather than hang
@pytest.mark.parametrize("default_isolation", ["read committed", "repeatable read"])
def test_deleting_a_topic_while_it_is_published_to_leaves_nothing_behind(
    client, topic_group, clean_db, default_isolation
):
    """No foreign key checks a publish row by row (migration 0008): the delete waits for the publish
    holding the topic, then takes its messages and deliveries too. Its statements need READ
    COMMITTED (a fresh snapshot after the wait): redelivery's connections ask for it, whatever the
    database's default."""
    database = client.conn.execute("SELECT current_database()").fetchone()[0]
    client.conn.execute(
        f"ALTER DATABASE {database} SET default_transaction_isolation = '{default_isolation}'"
    )
    try:
        client.publish("orders", [{"n": 0}])
        with Client(clean_db) as deleter, Client(clean_db) as other:
            assert (
                deleter.conn.execute("SHOW default_transaction_isolation").fetchone()[0] == "read committed"
            )
            other.conn.execute("BEGIN")
            assert len(other.publish("orders", [{"n": i} for i in range(50)], retry=False)) == 50
            deleting = threading.Thread(target=lambda: deleter.delete_topic("orders"))
            deleting.start()
            # the delete waits for the publishing transaction (which holds the topic row)
            wait_for_session(
                clean_db, waiting_for_a_lock("LOCK_TOPIC_FOR_DELETE"), "the delete waiting for the publish"
            )
            assert deleting.is_alive()
            other.conn.execute("COMMIT")
            deleting.join(10)
            assert not deleting.is_alive()
            for table in ("messages", "deliveries", "publish_batches", "subscriptions"):
                assert client.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
            with pytest.raises(UnknownTopicError):  # its cached topic id is gone: nothing is written
                other.publish("orders", [{"n": 1}], batch_id="after-delete")
        assert client.conn.execute("SELECT count(*) FROM publish_batches").fetchone()[0] == 0
    finally:
        client.conn.execute(f"ALTER DATABASE {database} RESET default_transaction_isolation")


def test_the_embedded_database_requires_its_password(database_url):
    if not database_url.startswith("postgresql://postgres:"):
        pytest.skip("runs against the embedded PostgreSQL")
    mode = stat.S_IMODE(os.stat(embedded.password_file()).st_mode)
    assert mode == 0o600
    port = embedded.get_settings().pg_port
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=5)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(f"postgresql://postgres:wrong@127.0.0.1:{port}/postgres", connect_timeout=5)
    assert embedded.password() in embedded.url()


@pytest.mark.parametrize("where", ["url", "PGOPTIONS"])
def test_session_options_the_user_gives_are_kept(database_url, monkeypatch, where):
    """A user's ``-c statement_timeout=...`` (in the URL or libpq's PGOPTIONS) reaches the session;
    the schema's search_path and READ COMMITTED still win over the user's own."""
    from redelivery.store import db

    user = "-c statement_timeout=4321 -c search_path=public -c default_transaction_isolation=serializable"
    url = database_url
    if where == "url":
        sep = "&" if "?" in url else "?"
        url = f"{url}{sep}options={user.replace(' ', '%20').replace('=', '%3D')}"
    else:
        monkeypatch.setenv("PGOPTIONS", user)
    with db.connect(url) as conn:
        shown = [conn.execute(f"SHOW {name}").fetchone()[0] for name in ("statement_timeout", "search_path")]
        isolation = conn.execute("SHOW default_transaction_isolation").fetchone()[0]
    assert shown == ["4321ms", "redelivery,public"] and isolation == "read committed"
