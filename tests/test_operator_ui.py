"""The operator's view, end to end: a real Airflow 3 (api-server, scheduler, dag-processor) on the
embedded PostgreSQL with the project's DAGs, driven in headless Chromium (Debian's chromium,
Playwright) and through the REST API."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import requests

from helpers import at

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


@pytest.fixture(scope="module")
def airflow(database_url, tmp_path_factory):
    """A running Airflow with its own metadata database and AIRFLOW_HOME; yields the base URL."""
    from redelivery.airflow.local import LocalAirflow

    env = {
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "REDELIVERY_DATABASE_URL": database_url,
    }
    with LocalAirflow(tmp_path_factory.mktemp("airflow-home"), "airflow_e2e", env) as running:
        running.unpause("dlq_redrive")  # runs triggered through the API run (the form unpauses by itself)
        yield running.url


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


BAD_CONFS = [
    ({"group": "billing", "dead_lettered_from": "yesterday"}, "date-time"),
    ({"group": "billing", "dead_lettered_from": "2026-01-01T00:00:00"}, "date-time"),  # no zone
    ({"group": "billing", "message_ids": [2**63]}, "maximum"),
    ({"group": "billing", "rate_limit": 0}, "exclusiveMinimum"),
    ({"group": "g" * 57}, "pattern"),
    ({"group": "billing", "topic": "bad name"}, "pattern"),
    ({"group": "billing", "reasons": ["SOMETIMES"]}, "enum"),
]


@pytest.mark.parametrize("conf,needle", BAD_CONFS)
def test_params_the_form_cannot_take_are_refused_before_a_run(airflow, dead_letters, conf, needle):
    """The form posts to this same endpoint: a value its schema refuses creates no run."""
    known = {r["dag_run_id"] for r in runs(airflow)}
    refused = requests.post(
        f"{airflow}/api/v2/dags/dlq_redrive/dagRuns", json={"logical_date": None, "conf": conf}, timeout=30
    )
    assert refused.status_code == 400 and needle in refused.text, refused.text
    assert {r["dag_run_id"] for r in runs(airflow)} == known and dlq_state(dead_letters)["DLQ"] == 30


def test_a_backwards_time_range_fails_before_anything_moves(airflow, dead_letters):
    known = {r["dag_run_id"] for r in runs(airflow)}
    conf = {
        "group": "billing",
        "dry_run": False,
        "dead_lettered_from": "2026-02-01T00:00:00Z",
        "dead_lettered_to": "2026-01-01T00:00:00Z",
    }
    created = requests.post(
        f"{airflow}/api/v2/dags/dlq_redrive/dagRuns", json={"logical_date": None, "conf": conf}, timeout=30
    )
    assert created.status_code == 200, created.text
    run = wait_for_run(airflow, known)
    assert run["state"] == "failed" and dlq_state(dead_letters)["DLQ"] == 30


def task_state(base: str, run_id: str, task_id: str = "redrive") -> str | None:
    return (
        requests.get(f"{base}/api/v2/dags/dlq_redrive/dagRuns/{run_id}/taskInstances/{task_id}", timeout=30)
        .json()
        .get("state")
    )


def test_marking_the_redrive_failed_stops_it_and_clearing_it_resumes(airflow, dead_letters):
    """An operator marks a slow redrive failed: it stops between batches with every message in
    one place; clearing the task runs it again under the same run key and it moves the rest."""
    conf = {"group": "billing", "dry_run": False, "rate_limit": 2}  # 30 messages: about 15 s
    created = requests.post(
        f"{airflow}/api/v2/dags/dlq_redrive/dagRuns", json={"logical_date": None, "conf": conf}, timeout=30
    ).json()
    run_id = created["dag_run_id"]
    key = f"dlq_redrive/{run_id}"
    moved = lambda: dead_letters.conn.execute(  # noqa: E731
        "SELECT moved FROM redrive_runs WHERE run_key = %s", (key,)
    ).fetchone()
    deadline = time.monotonic() + 120
    while not (moved() and moved()[0] >= 4) and time.monotonic() < deadline:
        time.sleep(0.5)
    marked = requests.patch(
        f"{airflow}/api/v2/dags/dlq_redrive/dagRuns/{run_id}/taskInstances/redrive",
        json={"new_state": "failed"},
        timeout=30,
    )
    assert marked.status_code == 200, marked.text
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline:
        status = dead_letters.conn.execute(
            "SELECT status, moved FROM redrive_runs WHERE run_key = %s", (key,)
        ).fetchone()
        if status[0] != "running":
            break
        time.sleep(0.5)
    assert status[0] == "stopped" and 4 <= status[1] < 30, status
    state = dlq_state(dead_letters)
    assert state["READY"] == status[1] and state["READY"] + state["DLQ"] == 30  # every message in one place
    cleared = requests.post(
        f"{airflow}/api/v2/dags/dlq_redrive/clearTaskInstances",
        json={
            "dag_run_id": run_id,
            "task_ids": ["redrive"],
            "dry_run": False,
            "only_failed": False,
            "reset_dag_runs": True,
        },
        timeout=30,
    )
    assert cleared.status_code == 200, cleared.text
    deadline = time.monotonic() + 180
    row = None
    while time.monotonic() < deadline:
        row = dead_letters.conn.execute(
            "SELECT status, moved FROM redrive_runs WHERE run_key = %s", (key,)
        ).fetchone()
        if row[0] == "success":
            break
        time.sleep(1)
    assert row == ("success", 30) and dlq_state(dead_letters)["READY"] == 30
    moves = dead_letters.conn.execute(
        "SELECT count(*), count(DISTINCT message_id) FROM redrive_moves"
    ).fetchone()
    assert moves == (30, 30)
