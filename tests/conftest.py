"""Test fixtures: a real PostgreSQL (the embedded one, database ``redelivery_test``, or
REDELIVERY_TEST_DATABASE_URL), a real local Spark session, and Airflow's environment."""

from __future__ import annotations

import logging
import os
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from redelivery import embedded
from redelivery.airflow.env import airflow_environ
from redelivery.settings import get_settings

TEST_URL = os.environ.get("REDELIVERY_TEST_DATABASE_URL")
if not TEST_URL:
    embedded.ensure_running(("redelivery", "airflow", "redelivery_test"))
    TEST_URL = embedded.url("redelivery_test")
os.environ["REDELIVERY_DATABASE_URL"] = TEST_URL
for key, value in airflow_environ().items():
    os.environ.setdefault(key, value)
get_settings.cache_clear()
logging.getLogger("py4j").setLevel(logging.WARNING)  # quiet teardown of the shared Spark session

#: A fixed past instant: tests drive the clock explicitly (``at=``) and windows must not be in the future.
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture(scope="session")
def database_url() -> str:
    from redelivery.db import migrate

    migrate(TEST_URL)
    return TEST_URL


@pytest.fixture()
def clean_db(database_url):
    """An empty state store (all tables truncated, DLQ tables dropped) before the test."""
    from redelivery import db

    with db.connect(database_url, autocommit=True) as conn:
        reset(conn)
    return database_url


def reset(conn) -> None:
    """Empty every table of the state store and drop the DLQ tables."""
    from psycopg import sql

    for (name,) in conn.execute("SELECT name FROM dead_letter_queues").fetchall():
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier("redelivery_dlq", name)))
    conn.execute("TRUNCATE topics, consumer_groups, subscriptions, messages, deliveries, dlq_messages, "
                 "dead_letter_queues, tier_runs, publish_batches, publish_staging RESTART IDENTITY CASCADE")


@pytest.fixture()
def client(clean_db):
    from redelivery.client import Client

    with Client(clean_db) as c:
        yield c


@pytest.fixture()
def topic_group(client):
    """A topic ``orders`` with group ``billing`` (default RocketMQ policy: 16 reconsume times) subscribed."""
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders")
    return "orders", "billing"


@pytest.fixture(scope="session")
def spark():
    from redelivery.spark.session import get_spark

    session = get_spark("redelivery-tests", master="local[2]")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def snapshot(conn) -> list:
    """Every delivery and dead letter, to assert that a failed call changed nothing."""
    deliveries = conn.execute("SELECT * FROM deliveries ORDER BY message_id, group_id").fetchall()
    dead = conn.execute("SELECT group_id, message_id, reason FROM dlq_messages ORDER BY 1, 2").fetchall()
    messages = conn.execute("SELECT count(*) FROM messages").fetchone()
    return [deliveries, dead, messages]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
