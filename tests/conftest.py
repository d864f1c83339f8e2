"""Test fixtures: a real PostgreSQL (the embedded one, database ``redelivery_test``, or
REDELIVERY_TEST_DATABASE_URL), a real local Spark session, and Airflow's environment.

Tests are marked by what they need, so that ``pytest -m "not db and not spark and not airflow and
not browser"`` runs the pure ones without any server: ``db`` and ``spark`` are added here to every
test that uses the ``database_url`` or ``spark`` fixture; ``airflow`` and ``browser`` are set by
the modules that run Airflow or a browser. PostgreSQL is started by the ``database_url`` fixture,
never at import.
"""

from __future__ import annotations

import logging
import os

import pytest

from helpers import REPO_ROOT, at, reset

# the checkout's state folder and config, as the Makefile sets them (before any settings are read)
os.environ.setdefault("REDELIVERY_HOME", str(REPO_ROOT / ".redelivery"))
os.environ.setdefault("REDELIVERY_CONFIG", str(REPO_ROOT / "config" / "redelivery.yaml"))
from redelivery.airflow.env import airflow_environ
from redelivery.settings import get_settings

for key, value in airflow_environ(REPO_ROOT / "dags").items():
    os.environ.setdefault(key, value)
logging.getLogger("py4j").setLevel(logging.WARNING)  # quiet teardown of the shared Spark session


def pytest_sessionfinish(session):
    from helpers import prune_uv_cache

    prune_uv_cache()


def pytest_collection_modifyitems(items):
    for item in items:
        if "database_url" in item.fixturenames:
            item.add_marker(pytest.mark.db)
        if {"spark", "spark_connect", "any_spark"} & set(item.fixturenames):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def database_url() -> str:
    """The test database, started and migrated; also ``REDELIVERY_DATABASE_URL`` from now on."""
    from redelivery.store import embedded
    from redelivery.store.db import migrate

    url = os.environ.get("REDELIVERY_TEST_DATABASE_URL")
    if not url:
        embedded.ensure_running(("redelivery", "airflow", "redelivery_test"))
        url = embedded.url("redelivery_test")
    os.environ["REDELIVERY_DATABASE_URL"] = url
    get_settings.cache_clear()
    migrate(url)
    return url


@pytest.fixture()
def clean_db(database_url):
    """An empty state store (all tables truncated, DLQ tables dropped) before the test."""
    from redelivery.store import db

    with db.connect(database_url, autocommit=True) as conn:
        reset(conn)
    return database_url


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


@pytest.fixture()
def dagbag():
    """The DAGs of dags/ as Airflow loads them, parsed anew for each test: ``dag.test`` runs tasks
    in this process, where Airflow's ParamsDict.update sets the DAG's own Param values from the
    run's conf, so a DAG object kept between tests would carry one run's conf into the next."""
    from airflow.dag_processing.dagbag import DagBag

    from helpers import REPO_ROOT

    return DagBag(dag_folder=str(REPO_ROOT / "dags"))


@pytest.fixture(scope="session")
def spark():
    """A classic local session (a JVM driver in the test process), as spark-submit runs jobs."""
    from redelivery.spark.session import get_spark

    session = get_spark("redelivery-tests", master="local[2,2]")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect():
    """A session on the project's warm Spark Connect server (started if needed)."""
    from redelivery.spark.session import get_spark

    session = get_spark("redelivery-tests", master="connect")
    yield session
    session.stop()


@pytest.fixture(params=["classic", "connect"])
def any_spark(request):
    """Each Spark test once with each path: a classic session and Spark Connect."""
    return request.getfixturevalue("spark" if request.param == "classic" else "spark_connect")


@pytest.fixture()
def dead(client, topic_group):
    """40 dead letters of group billing: 30 rejected ('schema ...'), 10 'timeout' at 2 reconsume times."""
    client.create_topic("refunds")
    client.subscribe("billing", "refunds")
    client.publish("orders", [{"n": i} for i in range(30)], at=at(0))
    client.reject(
        "billing",
        client.receive("billing", "orders", 30, 30, at=at(0)),
        error="schema v2 missing field",
        at=at(1),
    )
    client.create_group("billing", max_reconsume_times=0)
    client.publish("refunds", [{"r": i} for i in range(10)], at=at(0))
    client.nack(
        "billing",
        client.receive("billing", "refunds", 10, 30, at=at(0)),
        error="Timeout calling ERP",
        at=at(100),
    )
    client.create_group("billing", max_reconsume_times=None)
    return client
