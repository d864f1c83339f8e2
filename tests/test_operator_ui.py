"""The operator's view, end to end: a real Airflow 3 (api-server, scheduler, dag-processor) on the
embedded PostgreSQL with the project's DAGs, driven in headless Chromium (Debian's chromium,
Playwright) and through the REST API."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import requests

from helpers import at
from redelivery import embedded

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
pytestmark = [
    pytest.mark.airflow,
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and not os.environ.get("CI"),
        reason="Debian's chromium is not installed (make test installs it)",
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def airflow(database_url, tmp_path_factory):
    """A running Airflow with its own metadata database and AIRFLOW_HOME; yields the base URL."""
    home = tmp_path_factory.mktemp("airflow-home")
    port = free_port()
    with psycopg.connect(embedded.url("postgres"), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS airflow_e2e WITH (FORCE)")
        conn.execute("CREATE DATABASE airflow_e2e")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": embedded.url("airflow_e2e").replace(
            "postgresql://", "postgresql+psycopg2://"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "REDELIVERY_DATABASE_URL": database_url,
    }
    airflow_bin = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow_bin, "db", "migrate"], env=env, check=True, capture_output=True)
    logs = home / "logs-e2e"
    logs.mkdir()
    procs = [
        subprocess.Popen(
            [airflow_bin, *cmd],
            env=env,
            stdout=open(logs / f"{cmd[0]}.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for cmd in (["api-server", "--port", str(port)], ["scheduler"], ["dag-processor"])
    ]
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                dags = requests.get(
                    f"{base}/api/v2/dags", params={"dag_id_pattern": "dlq_redrive"}, timeout=5
                ).json()
                health = requests.get(f"{base}/api/v2/monitor/health", timeout=5).json()
                if dags.get("total_entries") and health["scheduler"]["status"] == "healthy":
                    break
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(2)
        else:
            raise RuntimeError(
                "Airflow did not come up:\n"
                + "\n".join((logs / f).read_text()[-2000:] for f in os.listdir(logs))
            )
        yield base
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture()
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium.new_page(viewport={"width": 1400, "height": 1400})
        chromium.close()


@pytest.fixture()
def dead_letters(client, topic_group):
    client.publish("orders", [{"n": i} for i in range(30)], at=at(0))
    client.reject(
        "billing", client.receive("billing", "orders", 30, 30, at=at(0)), error="schema violation", at=at(1)
    )
    return client


def runs(base: str) -> list[dict]:
    return requests.get(
        f"{base}/api/v2/dags/dlq_redrive/dagRuns", params={"order_by": "-run_after"}, timeout=60
    ).json()["dag_runs"]


def wait_for_run(base: str, known: set[str], timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in runs(base):
            if run["dag_run_id"] not in known and run["state"] in ("success", "failed"):
                return run
        time.sleep(2)
    raise AssertionError(f"no new dlq_redrive run finished in {timeout} s: {runs(base)}")


def trigger_from_form(page, base: str, group: str, dry_run: bool = True, extra: dict | None = None) -> None:
    page.goto(f"{base}/dags/dlq_redrive", wait_until="networkidle")
    page.get_by_role("button", name="Trigger").click()
    dialog = page.get_by_role("dialog")
    dialog.locator('[name="element_group"]').fill(group)
    for name, value in (extra or {}).items():
        dialog.locator(f'[name="element_{name}"]').fill(value)
    dry = dialog.locator('[name="element_dry_run"]')
    if dry.is_checked() != dry_run:
        dry.locator("xpath=..").click()  # the switch's visible control
    assert dry.is_checked() == dry_run
    dialog.get_by_role("button", name="Trigger").click()


def dlq_state(client) -> dict:
    return client.stats()["orders"]["billing"]


def test_redrive_from_the_trigger_form_dry_run_then_real(airflow, browser, dead_letters, tmp_path):
    known = {r["dag_run_id"] for r in runs(airflow)}
    trigger_from_form(browser, airflow, "billing", dry_run=True)
    run = wait_for_run(airflow, known)
    browser.screenshot(path=str(tmp_path / "after-dry-run.png"))
    assert run["state"] == "success" and run["conf"]["dry_run"] is True
    assert dlq_state(dead_letters)["DLQ"] == 30  # a dry run moves nothing
    known.add(run["dag_run_id"])

    trigger_from_form(browser, airflow, "billing", dry_run=False)
    run = wait_for_run(airflow, known)
    assert run["state"] == "success" and run["conf"]["dry_run"] is False
    assert dlq_state(dead_letters)["READY"] == 30 and dlq_state(dead_letters)["DLQ"] == 0
    audit = dead_letters.conn.execute(
        "SELECT run_key, triggered_by, dry_run, status, selected, moved FROM redrive_runs ORDER BY id"
    ).fetchall()
    assert [(a[2], a[3], a[4], a[5]) for a in audit] == [(True, "success", 30, 0), (False, "success", 30, 30)]
    assert audit[1][0] == f"dlq_redrive/{run['dag_run_id']}" and audit[1][1]  # who triggered it
    summary = requests.get(
        f"{airflow}/api/v2/dags/dlq_redrive/dagRuns/{run['dag_run_id']}/taskInstances/redrive/xcomEntries/return_value",
        timeout=10,
    ).json()
    assert '"moved": 30' in str(summary["value"]).replace("'", '"')


def test_bad_params_in_the_form_are_refused_and_nothing_moves(airflow, browser, dead_letters, tmp_path):
    known = {r["dag_run_id"] for r in runs(airflow)}
    trigger_from_form(browser, airflow, "bad group!", dry_run=False, extra={"rate_limit": "-5"})
    browser.get_by_text("Failed to Trigger Dag").wait_for(timeout=15_000)
    browser.screenshot(path=str(tmp_path / "refused.png"))
    time.sleep(3)
    assert {r["dag_run_id"] for r in runs(airflow)} == known
    assert dlq_state(dead_letters)["DLQ"] == 30


def test_rest_api_trigger_and_refusal(airflow, dead_letters):
    url = f"{airflow}/api/v2/dags/dlq_redrive/dagRuns"
    known = {r["dag_run_id"] for r in runs(airflow)}
    refused = requests.post(
        url, json={"logical_date": None, "conf": {"group": "billing", "rate_limit": -1}}, timeout=10
    )
    assert refused.status_code == 400
    missing = requests.post(url, json={"logical_date": None, "conf": {"dry_run": False}}, timeout=10)
    assert missing.status_code == 400  # the group is required
    assert {r["dag_run_id"] for r in runs(airflow)} == known and dlq_state(dead_letters)["DLQ"] == 30
    created = requests.post(
        url,
        json={
            "logical_date": None,
            "conf": {"group": "billing", "dry_run": False, "max_messages": 5, "rate_limit": 1000},
        },
        timeout=10,
    )
    assert created.status_code == 200, created.text
    run = wait_for_run(airflow, known)
    assert run["state"] == "success"
    assert dlq_state(dead_letters)["READY"] == 5 and dlq_state(dead_letters)["DLQ"] == 25


def test_dead_letters_page_in_the_airflow_ui(airflow, browser, dead_letters, tmp_path):
    plugins = requests.get(f"{airflow}/api/v2/plugins", timeout=10).json()["plugins"]
    assert any(
        p["name"] == "redelivery" and p["external_views"][0]["url_route"] == "dead-letters" for p in plugins
    )
    browser.goto(f"{airflow}/plugin/dead-letters", wait_until="networkidle")
    frame = browser.frame_locator("iframe").first
    frame.get_by_text("Group billing: 30 dead letters").wait_for(timeout=20_000)
    browser.screenshot(path=str(tmp_path / "dead-letters.png"))
    text = frame.locator("body").inner_text()
    assert "%DLQ%billing" in text and "REJECTED" in text and "schema violation" in text
    assert requests.get(f"{airflow}/redelivery/dlq.json", timeout=10).json()[0]["count"] == 30
