"""A real Airflow (api-server, scheduler, dag-processor, LocalExecutor) whose state store is only
the connection ``redelivery_db``, kept in Airflow's own database and changed through its REST API
between the tests: no REDELIVERY_DATABASE_URL, the Airflow processes' own REDELIVERY_HOME and
embedded port (issue 28.1, 28.2).

- ``Client()`` in a task: the connection's state store; without the connection the task fails
  naming it, and no embedded PostgreSQL is started in the worker (its data directory would show).
- The "Dead letters" page and its JSON and lists answer 503 with one line saying what is wrong
  (the connection missing, the server unreachable, the password refused, the schema never
  migrated) and where to fix it; ``/redelivery/metrics`` answers 200 with ``redelivery_up 0``, as
  Prometheus exporters do, and ``redelivery_up 1`` once the state store answers."""

from __future__ import annotations

import json
import re
import time
from html import unescape
from urllib.parse import urlsplit

import psycopg
import pytest
import requests
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from helpers import REPO_ROOT, hung_store

pytestmark = pytest.mark.airflow

DAG_ID = "redelivery_client_in_a_task"
CONN = "redelivery_db"
#: A DAG of a user: a task that makes ``Client()`` with no URL, as README's example does.
DAG_FILE = f'''
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

with DAG("{DAG_ID}", schedule=None, start_date=datetime(2026, 1, 1), is_paused_upon_creation=False,
         default_args={{"retries": 2, "retry_delay": timedelta(seconds=1)}}):

    @task
    def publish_one():
        from redelivery.client import Client

        with Client() as client:
            client.create_topic("from-a-task")
            return client.publish("from-a-task", [{{"from": "a task"}}])

    publish_one()
'''


@pytest.fixture(scope="module")
def unmigrated(database_url):
    """A database on the test's server that was never migrated (libpq URL)."""
    name = (urlsplit(database_url).path.strip("/") + "_unmigrated")[:63]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield database_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def hung():
    """A state store that accepts connections and never answers (issue 37.2)."""
    with hung_store() as url:
        yield url


@pytest.fixture(scope="module")
def airflow(database_url, tmp_path_factory):
    """The running Airflow (``LocalAirflow``); ``.state_home`` is its processes' REDELIVERY_HOME."""
    from harness.local_airflow import LocalAirflow, free_port

    dags = tmp_path_factory.mktemp("dags")
    (dags / "client_in_a_task.py").write_text(DAG_FILE)
    (dags / "dlq_redrive.py").write_text((REPO_ROOT / "dags" / "dlq_redrive.py").read_text())
    state_home = tmp_path_factory.mktemp("redelivery-home")
    env = {
        "REDELIVERY_DATABASE_URL": None,  # the connection alone says where the state store is
        f"AIRFLOW_CONN_{CONN.upper()}": None,
        "REDELIVERY_HOME": str(state_home),
        "REDELIVERY_PG_PORT": str(free_port()),  # a second embedded server would start here
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "REDELIVERY_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
        "REDELIVERY_READ_TIMEOUT": str(READ_TIMEOUT),
    }
    metadata = f"airflow_store_{urlsplit(database_url).path.lstrip('/')}"[:63]
    home = tmp_path_factory.mktemp("airflow-home")
    with LocalAirflow(home, metadata, env) as running:
        running.state_home = state_home
        deadline = time.monotonic() + 120
        while not requests.get(f"{running.url}/api/v2/dags/{DAG_ID}", timeout=30).ok:
            assert time.monotonic() < deadline, f"{DAG_ID} was never registered"
            time.sleep(2)
        try:
            yield running
        finally:
            if (state_home / "pgdata").exists():  # the defect: a second embedded server, stopped
                stop_embedded(state_home, env["REDELIVERY_PG_PORT"])


def stop_embedded(home, port: str) -> None:
    """Stop an embedded PostgreSQL started under ``home`` on ``port``."""
    from redelivery.settings import get_settings
    from redelivery.store import embedded

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REDELIVERY_HOME", str(home))
        patch.setenv("REDELIVERY_PG_PORT", port)
        get_settings.cache_clear()
        embedded.stop("immediate")
    get_settings.cache_clear()


def set_connection(base: str, url: str | None) -> None:
    """The connection ``redelivery_db`` in Airflow's database: the libpq URL's fields, or none."""
    requests.delete(f"{base}/api/v2/connections/{CONN}", timeout=30)
    if url is None:
        return
    info = conninfo_to_dict(url)
    fields = {
        "host": info["host"],
        "port": int(info["port"]),
        "login": info["user"],
        "schema": info["dbname"],
    }
    body = {"connection_id": CONN, "conn_type": "redelivery", **fields, "password": info.get("password")}
    answer = requests.post(f"{base}/api/v2/connections", json=body, timeout=30)
    assert answer.status_code == 201, answer.text


def run_task(base: str) -> tuple[str, str]:
    """Trigger the DAG and wait for its run to end: (state, the task's first try's log as text)."""
    state, log, _ = run_task_tries(base)
    return state, log


def run_task_tries(base: str) -> tuple[str, str, int]:
    """Trigger the DAG and wait for its run to end: (state, the task's first try's log as text,
    how many tries it took)."""
    answer = requests.post(f"{base}/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None}, timeout=30)
    assert answer.status_code == 200, answer.text
    run_id = answer.json()["dag_run_id"]
    deadline = time.monotonic() + 180
    while True:
        state = requests.get(f"{base}/api/v2/dags/{DAG_ID}/dagRuns/{run_id}", timeout=30).json()["state"]
        if state not in ("queued", "running"):
            break
        assert time.monotonic() < deadline, f"run {run_id} still {state}"
        time.sleep(1)
    task = f"{base}/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/publish_one"
    log = requests.get(f"{task}/logs/1", headers={"Accept": "application/json"}, timeout=30)
    return state, json.dumps(log.json()), requests.get(task, timeout=30).json()["try_number"]


def test_a_client_in_a_task_without_the_connection_fails_naming_it(airflow, database_url):
    set_connection(airflow.url, None)
    state, log = run_task(airflow.url)
    assert state == "failed"
    assert "the Airflow connection 'redelivery_db' is not defined" in log, log[-3000:]
    assert "AIRFLOW_CONN_REDELIVERY_DB=" in log
    assert not (airflow.state_home / "pgdata").exists()  # no second PostgreSQL in the worker


def test_a_client_in_a_task_uses_the_connection(airflow, client):
    set_connection(airflow.url, client.url)
    state, log = run_task(airflow.url)
    assert state == "success", log[-3000:]
    # the topic and its message are the test database's, the connection's
    assert client.conn.execute("SELECT name FROM topics").fetchall() == [("from-a-task",)]
    assert client.conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    assert not (airflow.state_home / "pgdata").exists()


def wrong_password(url: str) -> str:
    info = conninfo_to_dict(url)
    return f"postgresql://{info['user']}:not-the-password@{info['host']}:{info['port']}/{info['dbname']}"


#: The connection's state, and what the page must say about it (a pattern).
BROKEN = {
    "missing": (None, r"the Airflow connection 'redelivery_db' is not defined"),
    "unreachable": (
        "postgresql://u:p@127.0.0.1:9/redelivery",
        r"cannot reach the state store at 127\.0\.0\.1:9",
    ),
    "wrong password": ("wrong", "authentication failed for user '{user}' at {host}:{port}: "),
    "never migrated": ("unmigrated", r"has no redelivery schema \(it was never migrated\)"),
    # issue 37.2: the page and the metrics waited 130 s for a store that never answers
    "hung": ("hung", r"cannot reach the state store: 127\.0\.0\.1:\d+ did not answer within 2 s"),
}
#: Seconds the Airflow's processes wait for a connection (REDELIVERY_CONNECT_TIMEOUT), and how long
#: an answer of the page may take beyond it.
CONNECT_TIMEOUT, GRACE = 2, 8
#: Seconds a read of the page or the metrics may take (REDELIVERY_READ_TIMEOUT).
READ_TIMEOUT = 3


#: What a Client() in a task logs for a store that cannot serve it (issue 37.4: raw psycopg errors,
#: and 3 tries of a configuration error), and how many tries it takes: a store that cannot be
#: reached may come back (Airflow's retries), the others are configuration errors.
TASK_ERRORS = {
    "missing": ("the Airflow connection 'redelivery_db' is not defined", 1),
    "unreachable": ("check its host and port, and that the server runs in the Airflow connection "
                    "'redelivery_db'", 3),
    "wrong password": ("check its login and password in the Airflow connection 'redelivery_db'", 1),
    "never migrated": ("has no redelivery schema (it was never migrated): run `redelivery db upgrade`", 1),
}  # fmt: skip


@pytest.mark.parametrize("broken", list(TASK_ERRORS))
def test_a_task_says_what_is_wrong_in_one_line_and_retries_only_an_outage(
    airflow, database_url, unmigrated, broken
):
    url = {"wrong": wrong_password(database_url), "unmigrated": unmigrated}.get(
        BROKEN[broken][0], BROKEN[broken][0]
    )
    set_connection(airflow.url, url)
    state, log, tries = run_task_tries(airflow.url)
    said, expected_tries = TASK_ERRORS[broken]
    assert state == "failed" and tries == expected_tries, (state, tries, log[-3000:])
    assert said in log and "AIRFLOW_CONN_REDELIVERY_DB" in log, log[-3000:]
    assert "not-the-password" not in log and not (airflow.state_home / "pgdata").exists()


def up(metrics: str) -> float:
    assert "# HELP redelivery_up " in metrics and "# TYPE redelivery_up gauge" in metrics
    return float(re.search(r"^redelivery_up (\S+)$", metrics, re.M).group(1))


@pytest.mark.parametrize("broken", list(BROKEN))
def test_the_page_and_the_metrics_say_what_is_wrong(airflow, database_url, unmigrated, hung, broken):
    target, said = BROKEN[broken]
    url = {"wrong": wrong_password(database_url), "unmigrated": unmigrated, "hung": hung}.get(target, target)
    if target == "wrong":
        said = re.escape(said.format(**conninfo_to_dict(database_url)))
    set_connection(airflow.url, url)
    for path in ("/redelivery/dlq", "/redelivery/dlq/messages?group=billing", "/redelivery/dlq.json"):
        started = time.monotonic()
        page = requests.get(airflow.url + path, timeout=30)
        assert time.monotonic() - started < CONNECT_TIMEOUT + GRACE, path
        assert page.status_code == 503, (path, page.status_code, page.text[:500])
        text = unescape(page.text)
        assert re.search(said, text), (path, text[:2000])
        assert "the Airflow connection 'redelivery_db'" in text and "Internal Server Error" not in text
        assert "not-the-password" not in text
    started = time.monotonic()
    metrics = requests.get(f"{airflow.url}/redelivery/metrics", timeout=30)
    assert time.monotonic() - started < CONNECT_TIMEOUT + GRACE
    assert metrics.status_code == 200 and up(metrics.text) == 0
    assert "redelivery_messages" not in metrics.text and "not-the-password" not in metrics.text


def test_once_the_connection_is_right_the_page_and_the_metrics_work(airflow, client):
    set_connection(airflow.url, client.url)
    assert requests.get(f"{airflow.url}/redelivery/dlq", timeout=30).status_code == 200
    metrics = requests.get(f"{airflow.url}/redelivery/metrics", timeout=30)
    assert metrics.status_code == 200 and up(metrics.text) == 1


def test_a_read_that_outlasts_the_read_timeout_is_a_503_and_redelivery_up_0(airflow, client):
    """Issue 37.2: a read of the page or the metrics waited as long as a lock was held (a
    migration, a long transaction); now its statement is cancelled after REDELIVERY_READ_TIMEOUT."""
    set_connection(airflow.url, client.url)
    with psycopg.connect(client.url) as holder:
        holder.execute("LOCK redelivery.subscriptions, redelivery.consumer_groups IN ACCESS EXCLUSIVE MODE")
        for path in ("/redelivery/dlq", "/redelivery/dlq.json"):
            started = time.monotonic()
            page = requests.get(airflow.url + path, timeout=30)
            assert time.monotonic() - started < READ_TIMEOUT + GRACE, path
            text = unescape(page.text)
            assert page.status_code == 503 and "did not answer within its statement time-out" in text, text
            assert f"REDELIVERY_READ_TIMEOUT ({READ_TIMEOUT} s)" in text, text
        started = time.monotonic()
        metrics = requests.get(f"{airflow.url}/redelivery/metrics", timeout=30)
        assert time.monotonic() - started < READ_TIMEOUT + GRACE
        assert metrics.status_code == 200 and up(metrics.text) == 0, metrics.text
        holder.rollback()
    assert requests.get(f"{airflow.url}/redelivery/dlq", timeout=30).status_code == 200
