"""The page "Under a real Airflow" (docs/airflow.md, moved there from README), followed as
written: its bash blocks run as they are (only the port is another free one, and AIRFLOW_HOME and
Airflow's metadata database are the test's own), under ``airflow standalone``. Nothing is unpaused
through the API: retries that a consumer nacked come back within their tier's window, and the REST
redrive of "Operating it" (docs/operating.md) runs with a token got as the Airflow page says. A
misspelt conf key is refused at trigger time."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from helpers import REPO_ROOT, docs_page

pytestmark = pytest.mark.airflow

DEFAULT_PORT = "localhost:8080"


def bash_blocks(page: str, heading: str) -> list[str]:
    """The ```bash blocks of the section (or paragraph) of ``docs/<page>`` that starts with
    ``heading``, up to the next heading of any level."""
    text = docs_page(page)
    start = text.index(heading)
    end = re.search(r"^#{1,6} ", text[start + len(heading) :], re.M)
    section = text[start : start + len(heading) + (end.start() if end else len(text))]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def run_block(block: str, env: dict, port: int) -> str:
    """A page's block in bash (set -e) from the checkout's root, as a user pastes it; its output."""
    script = "set -euo pipefail\n" + block.replace(DEFAULT_PORT, f"localhost:{port}")
    done = subprocess.run(
        ["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"the page's block failed:\n{block}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, database_url):
    """The Airflow page's first block (airflow-env, then ``airflow standalone``) running; yields
    (env, port)."""
    from harness.local_airflow import free_port, fresh_metadata_db

    [start, token, *_] = bash_blocks("airflow.md", "## On this machine: `airflow standalone`")
    assert "airflow standalone" in start and "/auth/token" in token
    home, port = tmp_path_factory.mktemp("standalone"), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER")}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://localhost:{port}/execution/",
        AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),  # another Airflow may run here
        AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
        REDELIVERY_DATABASE_URL=database_url,
    )
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = fresh_metadata_db("airflow_readme", env)
    log = open(home / "standalone.log", "w")
    proc = subprocess.Popen(
        ["bash", "-c", start.replace(DEFAULT_PORT, f"localhost:{port}")],
        cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_until_ready(port, home, proc)
        yield env, port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def wait_until_ready(port: int, home, proc, timeout: float = 300) -> None:
    """Until the scheduler and the dag-processor are healthy, the DAGs parsed and the password
    written; else fail with the end of standalone's output."""
    deadline = time.monotonic() + timeout
    password_file = home / "simple_auth_manager_passwords.json.generated"
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            health = requests.get(f"http://localhost:{port}/api/v2/monitor/health", timeout=5).json()
            if health["scheduler"]["status"] == "healthy" and password_file.exists():
                if dag_ids(port, token_for(port, home)) >= {"dlq_redrive", "redelivery_tier_seconds"}:
                    return
        except (requests.RequestException, ValueError, KeyError):
            pass
        time.sleep(2)
    raise AssertionError(
        "airflow standalone did not come up:\n" + (home / "standalone.log").read_text()[-3000:]
    )


def token_for(port: int, home) -> str:
    password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
    answer = requests.post(
        f"http://localhost:{port}/auth/token", json={"username": "admin", "password": password}, timeout=10
    )
    return answer.json()["access_token"]


def dag_ids(port: int, token: str) -> set[str]:
    dags = requests.get(
        f"http://localhost:{port}/api/v2/dags", headers={"Authorization": f"Bearer {token}"}, timeout=10
    ).json()
    return {d["dag_id"] for d in dags["dags"]}


def state_count(client, state: str) -> int:
    return client.stats()["orders"]["billing"][state]


def wait_for(condition, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(1)
    raise AssertionError(f"{what} within {timeout} s")


def test_nacked_retries_come_back_within_their_tier_window_without_unpausing(standalone, client, topic_group):
    env, port = standalone
    client.publish("orders", [{"n": i} for i in range(5)])
    client.nack("billing", client.receive("billing", "orders", 5, 30), error="ERP timeout")  # level 1: 10 s
    assert state_count(client, "WAITING_RETRY") == 5
    wait_for(
        lambda: state_count(client, "READY") == 5, "the seconds tier (never unpaused) promoted the retries"
    )
    [(run_key, lateness)] = client.conn.execute(
        "SELECT run_key, (summary->'lateness_seconds'->>'max')::float8 FROM tier_runs"
        " WHERE tier = 'seconds' AND status = 'success' AND (summary->>'promoted')::int > 0"
    ).fetchall()
    assert run_key.startswith("redelivery_tier_seconds/scheduled__")  # the scheduler's run
    assert 0 <= lateness <= 10  # due within the window the run promoted: at most one 10 s window late


def test_readme_rest_redrive_with_a_token_got_as_readme_says(standalone, client, topic_group):
    env, port = standalone
    client.publish("orders", [{"n": i} for i in range(3)])
    client.reject("billing", client.receive("billing", "orders", 3, 30), error="schema violation")
    [_, token_block, *_] = bash_blocks("airflow.md", "## On this machine: `airflow standalone`")
    [trigger_block] = bash_blocks("operating.md", "**Redrive them.**")
    answer = json.loads(run_block(token_block + "\n" + trigger_block, env, port))
    run_key = f"dlq_redrive/{answer['dag_run_id']}"
    status = wait_for(
        lambda: client.conn.execute(
            "SELECT status, matched, moved FROM redrive_runs WHERE run_key = %s AND status <> 'running'",
            (run_key,),
        ).fetchone(),
        "README's redrive finished",
    )
    assert status == ("success", 3, 3) and state_count(client, "READY") == 3


def test_a_misspelt_conf_key_is_refused_at_trigger_time(standalone, client, topic_group):
    """An operator's typo never widens a redrive: HTTP 400 naming the key and the one meant, no run."""
    env, port = standalone
    token = token_for(port, Path(env["AIRFLOW_HOME"]))
    url = f"http://localhost:{port}/api/v2/dags/dlq_redrive/dagRuns"
    headers = {"Authorization": f"Bearer {token}"}
    before = requests.get(url, headers=headers, timeout=10).json()["total_entries"]
    conf = {"group": "billing", "max_mesages": 10, "dry_run": False, "rate_limit": -1}
    refused = requests.post(url, headers=headers, json={"logical_date": None, "conf": conf}, timeout=10)
    assert refused.status_code == 400
    lines = refused.json()["detail"].splitlines()
    assert lines[1:] == [
        "max_mesages: unknown key (did you mean 'max_messages'?)",
        "rate_limit: -1 is less than or equal to the minimum of 0",
    ], lines
    assert requests.get(url, headers=headers, timeout=10).json()["total_entries"] == before
    unauthenticated = requests.post(url, json={"logical_date": None, "conf": conf}, timeout=10)
    assert unauthenticated.status_code == 401  # Airflow's own answer: the check says nothing to strangers
