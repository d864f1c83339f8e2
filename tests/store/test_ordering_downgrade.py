"""Migration 0016's downgrade on a store that holds a key 0015's btree indexes may not hold (issue
36): refused before it changes anything, naming what to finish; a store of short keys goes down."""

from __future__ import annotations

import os

import pytest

from redelivery.store import db

pytestmark = pytest.mark.timeout(300)


def _store(url, key):
    from redelivery.client import Client
    from redelivery.messaging.codec import Message

    with Client(url) as client:
        client.create_topic("orders")
        client.create_group("billing")
        client.subscribe("billing", "orders", ordered=True)
        client.publish("orders", [Message({"n": 0}, key=key), Message({"n": 1}, key=key)])
        assert len(client.receive("billing", "orders", 10, 300)) == 1


def _version_and_invalid_indexes(url):
    with db.connect(url) as conn:
        version = conn.execute("SELECT version_num FROM redelivery.alembic_version").fetchone()[0]
        invalid = conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname LIKE 'redelivery%%' AND NOT i.indisvalid"
        ).fetchall()
    return version, invalid


def test_a_store_of_short_keys_goes_down_to_0015(fresh_url):
    from alembic import command

    db.migrate(fresh_url)
    _store(fresh_url, "k")
    command.downgrade(db.alembic_config(fresh_url), "0015")
    assert _version_and_invalid_indexes(fresh_url) == ("0015", [])


def test_a_long_key_refuses_the_downgrade_and_changes_nothing(fresh_url):
    from alembic import command

    from redelivery.client import Client
    from redelivery.messaging.codec import Message

    db.migrate(fresh_url)
    _store(fresh_url, os.urandom(1500).hex())
    command.downgrade(db.alembic_config(fresh_url), "0016")  # the migrations after it: nothing to refuse
    with pytest.raises(RuntimeError, match="2 live and 0 dead-lettered messages have keys over 1,352 bytes"):
        command.downgrade(db.alembic_config(fresh_url), "0015")
    assert _version_and_invalid_indexes(fresh_url) == ("0016", [])
    db.migrate(fresh_url)  # up to this version's head again
    with Client(fresh_url) as client:  # and the store works on
        other = os.urandom(1500).hex()
        client.publish("orders", [Message({"n": 2}, key=other)])
        assert [m.key for m in client.receive("billing", "orders", 10, 300)] == [other]
