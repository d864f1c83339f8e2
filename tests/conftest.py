"""Test fixtures: a real PostgreSQL (the embedded one, database ``redelivery_test``, or
REDELIVERY_TEST_DATABASE_URL), a real local Spark session, and Airflow's environment.

``make test`` runs two pytest-xdist workers (``-n 2``, scheduled by ``pytest_xdist_make_scheduler``):
each worker has a test database and an Airflow metadata database of its own (``own``), and a
module's tests stay on one worker (a package's, where it shares a fixture: ``SHARED_PACKAGES``), so
that a module's Airflow or Spark cluster starts once.

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

#: The pytest-xdist worker this process is ("gw0", "gw1"), or None in a run of one process.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
#: Packages whose modules share a package-scoped fixture: one xdist group each (the browser tests'
#: Airflow takes a minute and more to start).
SHARED_PACKAGES = ("airflow/ui/",)
#: The longest units (their tests' set-up and calls, measured with ``--durations=0``), longest
#: first: each worker takes the next unit when it is done, so a long one taken last leaves the
#: other worker idle at the end.
LONGEST_FIRST = (
    "airflow/ui/",
    "tests/spark/test_cluster.py",
    "tests/airflow/test_tier_batches.py",
    "tests/system/test_demo.py",
    "tests/store/test_plans.py",
    "tests/system/test_readme_airflow.py",
    "tests/system/test_chaos.py",
    "tests/airflow/test_airflow_dags.py",
    "tests/airflow/test_flights_consumer.py",
    "tests/system/test_wheel.py",
)


def own(name: str) -> str:
    """A database of this worker: ``name`` in a run of one process, ``name_gw0`` in worker gw0."""
    return f"{name}_{WORKER}" if WORKER else name


def _own_airflow_metadata() -> None:
    """In a worker, Airflow's metadata database is the worker's own (``dag.test`` runs of two
    workers in one database would meet), when it is the embedded server's (made by the session
    fixture ``worker_databases``, before any test)."""
    from redelivery.store import embedded
    from redelivery.store.db import sqlalchemy_url

    key = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
    if WORKER and os.environ.get(key) == sqlalchemy_url(embedded.url("airflow")):
        os.environ[key] = sqlalchemy_url(embedded.url(own("airflow")))


_own_airflow_metadata()
logging.getLogger("py4j").setLevel(logging.WARNING)  # quiet teardown of the shared Spark session


def pytest_sessionfinish(session):
    from helpers import prune_uv_cache

    if not WORKER:  # once, in the run's main process
        prune_uv_cache()


@pytest.hookimpl(optionalhook=True)  # a run without xdist (-p no:xdist) knows no such hook
def pytest_xdist_make_scheduler(config, log):
    """A module's tests in one worker (a package's, for ``SHARED_PACKAGES``): xdist's own
    ``loadgroup`` marks no longer group with pytest 9 (it rewrites ``item._nodeid``; pytest 9 reads
    ``item._id``)."""
    from xdist.scheduler import LoadScopeScheduling

    def rank(scope: str) -> int:
        return next((n for n, unit in enumerate(LONGEST_FIRST) if unit in scope), len(LONGEST_FIRST))

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return next((package for package in SHARED_PACKAGES if package in path), path)

        def _assign_work_unit(self, node) -> None:
            ordered = sorted(self.workqueue.items(), key=lambda unit: rank(unit[0]))  # stable
            self.workqueue.clear()
            self.workqueue.update(ordered)
            super()._assign_work_unit(node)

    return ByModule(config, log)


def pytest_collection_modifyitems(items):
    for item in items:
        if "database_url" in item.fixturenames:
            item.add_marker(pytest.mark.db)
        if {"spark", "spark_connect", "any_spark"} & set(item.fixturenames):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session", autouse=bool(WORKER))
def worker_databases() -> None:
    """In a worker: the embedded server running, with the worker's own Airflow metadata database (a
    copy of a migrated template: ``harness.local_airflow.fresh_metadata_db``), before any test."""
    from harness.local_airflow import fresh_metadata_db
    from redelivery.store import embedded

    if WORKER and own("airflow") in os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", ""):
        embedded.ensure_running(("redelivery", "airflow"))
        fresh_metadata_db(own("airflow"), dict(os.environ))


@pytest.fixture(scope="session")
def database_url() -> str:
    """The test database (the worker's own under xdist), started and migrated; also
    ``REDELIVERY_DATABASE_URL`` from now on."""
    from redelivery.store import embedded
    from redelivery.store.db import migrate

    url = os.environ.get("REDELIVERY_TEST_DATABASE_URL")
    if url and WORKER:
        pytest.fail("REDELIVERY_TEST_DATABASE_URL is one database for every worker: run with -n 0")
    if not url:
        embedded.ensure_running(("redelivery", "airflow", own("redelivery_test")))
        url = embedded.url(own("redelivery_test"))
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
