"""The operator's view, end to end: a real Airflow 3 (api-server, scheduler, dag-processor) on the
embedded PostgreSQL with the project's DAGs, driven in headless Chromium (Debian's chromium,
Playwright) and through the REST API. Airflow runs the FAB auth manager with real roles: the
operator is ``admin`` (role Admin), and the last section checks what restricted users
(``ROLES``) get."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from html import escape, unescape
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import pytest
import requests

from helpers import REPO_ROOT, at, page_state, run_cli, snapshot
from redelivery.client import Message

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


#: FAB roles of the restricted users, as an operator team would be given them (issue 18).
ROLES = {
    # reads dlq_redrive, its runs and the plugin's page; may not trigger it
    "DlqReader": [
        ("can_read", "Website"),
        ("can_read", "Plugins"),
        ("can_read", "DAG:dlq_redrive"),
        ("can_read", "DAG Run:dlq_redrive"),
    ],
    # reads and triggers the seconds tier: another DAG's rights, none on dlq_redrive
    "TierOperator": [
        ("can_read", "Website"),
        ("can_read", "Plugins"),
        ("can_read", "DAG:redelivery_tier_seconds"),
        ("can_edit", "DAG:redelivery_tier_seconds"),
        ("can_create", "DAG Run:redelivery_tier_seconds"),
    ],
}
#: The users besides ``admin`` (which LocalAirflow makes, role Admin), and their roles.
USERS = {"reader": "DlqReader", "outsider": "TierOperator"}
#: The admin's calls to the API (signed in by the ``local_airflow`` fixture).
api = requests.Session()


@pytest.fixture(scope="module")
def local_airflow(database_url, tmp_path_factory):
    """A running Airflow with its own metadata database (named after the test database) and
    AIRFLOW_HOME, the FAB auth manager, ``USERS`` and ``admin``; ``api`` calls it as the admin."""
    from harness.local_airflow import LocalAirflow

    env = {
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "REDELIVERY_DATABASE_URL": database_url,
    }
    metadata_db = "airflow_e2e_" + urlsplit(database_url).path.strip("/")
    home = tmp_path_factory.mktemp("airflow-home")
    with LocalAirflow(home, metadata_db, env, users=USERS, roles=ROLES) as running:
        api.headers.update(running.session().headers)
        running.unpause("dlq_redrive")  # runs triggered through the API run (the form unpauses by itself)
        # The tier DAGs are active from the start, and their runs would move these tests' state
        # (its times are in the past): paused here, as an operator would, which the page and the
        # metrics then show (test_a_paused_tier_is_shown_at_the_top_and_measured).
        pause_tier_dags(running.url)
        yield running
    api.headers.pop("Authorization", None)


@pytest.fixture(scope="module")
def airflow(local_airflow) -> str:
    """The running Airflow's base URL."""
    return local_airflow.url


def tier_dag_ids() -> list[str]:
    from redelivery.airflow.dags.tiers import dag_id
    from redelivery.config import cached_config

    return [dag_id(t) for t in cached_config().tiers]


def pause_tier_dags(base: str) -> None:
    """Every tier DAG paused at once (Airflow's bulk PATCH, audit event ``patch_dags``), then the
    seconds tier again on its own (``patch_dag``: it was paused already); returns once no tier run
    is running."""
    deadline = time.monotonic() + 120
    while not all(api.get(f"{base}/api/v2/dags/{d}", timeout=30).ok for d in tier_dag_ids()):
        assert time.monotonic() < deadline, "the tier DAGs were never registered"
        time.sleep(2)
    bulk = api.patch(
        f"{base}/api/v2/dags",
        params={"dag_id_pattern": "redelivery_tier_"},
        json={"is_paused": True},
        timeout=30,
    )
    assert bulk.status_code == 200 and bulk.json()["total_entries"] == len(tier_dag_ids()), bulk.text
    time.sleep(1.1)  # the audit log's times: a second apart
    single = api.patch(f"{base}/api/v2/dags/redelivery_tier_seconds", json={"is_paused": True}, timeout=30)
    assert single.status_code == 200, single.text
    settle_tier_runs(base)


def settle_tier_runs(base: str, timeout: float = 180) -> None:
    """Until no run of a tier DAG is running (a queued one of a paused DAG never starts)."""
    deadline, quiet = time.monotonic() + timeout, 0
    while quiet < 2:
        running = [
            r
            for d in tier_dag_ids()
            for r in api.get(
                f"{base}/api/v2/dags/{d}/dagRuns", params={"state": "running"}, timeout=30
            ).json()["dag_runs"]
        ]
        quiet = 0 if running else quiet + 1
        assert time.monotonic() < deadline, f"tier runs still running: {running}"
        time.sleep(2)


@pytest.fixture()
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


def signed_in(chromium, base: str, user: str):
    """A new page of ``chromium`` signed in to Airflow as ``user`` on the FAB login page."""
    from harness.local_airflow import password

    page = chromium.new_page(viewport={"width": 1400, "height": 1400})
    page.goto(f"{base}/auth/login/")
    page.locator('input[name="username"]').fill(user)
    page.locator('input[name="password"]').fill(password(user))
    page.locator('input[type="submit"]').click()
    page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)
    assert "_token" in {c["name"] for c in page.context.cookies()}, f"{user} is not signed in: {page.url}"
    return page


@pytest.fixture()
def browser(chromium, airflow):
    """A page signed in as the admin."""
    return signed_in(chromium, airflow, "admin")


@pytest.fixture()
def dead_letters(client, topic_group):
    client.publish("orders", [{"n": i} for i in range(30)], at=at(0))
    client.reject(
        "billing", client.receive("billing", "orders", 30, 30, at=at(0)), error="schema violation", at=at(1)
    )
    return client


def runs(base: str) -> list[dict]:
    return api.get(
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
        "SELECT run_key, triggered_by, dry_run, status, matched, moved FROM redrive_runs ORDER BY id"
    ).fetchall()
    assert [(a[2], a[3], a[4], a[5]) for a in audit] == [(True, "success", 30, 0), (False, "success", 30, 30)]
    assert audit[1][0] == f"dlq_redrive/{run['dag_run_id']}" and audit[1][1]  # who triggered it
    summary = api.get(
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
    refused = api.post(
        url, json={"logical_date": None, "conf": {"group": "billing", "rate_limit": -1}}, timeout=10
    )
    assert refused.status_code == 400
    missing = api.post(url, json={"logical_date": None, "conf": {"dry_run": False}}, timeout=10)
    assert missing.status_code == 400  # the group is required
    assert {r["dag_run_id"] for r in runs(airflow)} == known and dlq_state(dead_letters)["DLQ"] == 30
    created = api.post(
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
    plugins = api.get(f"{airflow}/api/v2/plugins", timeout=10).json()["plugins"]
    assert any(
        p["name"] == "redelivery" and p["external_views"][0]["url_route"] == "dead-letters" for p in plugins
    )
    browser.goto(f"{airflow}/plugin/dead-letters", wait_until="networkidle")
    frame = browser.frame_locator("iframe").first
    frame.get_by_text("Group billing: 30 dead letters").wait_for(timeout=20_000)
    browser.screenshot(path=str(tmp_path / "dead-letters.png"))
    text = frame.locator("body").inner_text()
    assert "%DLQ%billing" in text and "REJECTED" in text and "schema violation" in text
    assert api.get(f"{airflow}/redelivery/dlq.json", timeout=10).json()[0]["count"] == 30
    scraped = api.get(f"{airflow}/redelivery/metrics", timeout=10)  # Prometheus, same permission
    assert scraped.headers["content-type"].startswith("text/plain") and (
        'redelivery_dlq_messages{dlq="%DLQ%billing",group="billing",reason="REJECTED"} 30.0' in scraped.text
    )


BAD_CONFS = [
    ({"group": "billing", "dead_lettered_from": "yesterday"}, "date-time"),
    ({"group": "billing", "dead_lettered_from": "2026-01-01T00:00:00"}, "date-time"),  # no zone
    ({"group": "billing", "message_ids": [2**63]}, "maximum"),
    (
        {"group": "billing", "rate_limit": 0},
        "rate_limit: 0 is less than or equal to the minimum",
    ),
    ({"group": "g" * 57}, "does not match"),
    ({"group": "billing", "topic": "bad name"}, "topic: 'bad name' does not match"),
    ({"group": "billing", "reasons": ["SOMETIMES"]}, "reasons[0]: 'SOMETIMES' is not one of"),
]


@pytest.mark.parametrize("conf,needle", BAD_CONFS)
def test_params_the_form_cannot_take_are_refused_before_a_run(airflow, dead_letters, conf, needle):
    """The form posts to this same endpoint: a value its schema refuses creates no run."""
    known = {r["dag_run_id"] for r in runs(airflow)}
    refused = api.post(
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
    created = api.post(
        f"{airflow}/api/v2/dags/dlq_redrive/dagRuns", json={"logical_date": None, "conf": conf}, timeout=30
    )
    assert created.status_code == 200, created.text
    run = wait_for_run(airflow, known)
    assert run["state"] == "failed" and dlq_state(dead_letters)["DLQ"] == 30


def task_state(base: str, run_id: str, task_id: str = "redrive") -> str | None:
    return (
        api.get(f"{base}/api/v2/dags/dlq_redrive/dagRuns/{run_id}/taskInstances/{task_id}", timeout=30)
        .json()
        .get("state")
    )


def test_marking_the_redrive_failed_stops_it_and_clearing_it_resumes(airflow, dead_letters):
    """An operator marks a slow redrive failed: it stops between batches with every message in
    one place; clearing the task runs it again under the same run key and it moves the rest."""
    conf = {"group": "billing", "dry_run": False, "rate_limit": 2}  # 30 messages: about 15 s
    created = api.post(
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
    marked = api.patch(
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
    cleared = api.post(
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


# ---- the Dead letters page: its charts, its dry-run redrive form, and what that form refuses ------

#: Screenshots kept after the run as test artifacts (repository root; ignored by git).
ARTIFACTS = REPO_ROOT / "test-artifacts"


@pytest.fixture()
def charted(client, topic_group, database_url):
    """helpers.page_state: billing has 10 dead letters (REJECTED, "schema violation"), retries at
    levels 1 (6) and 3 (4), 5 READY and 7 in flight; audit 4 READY; the seconds tier's runs were
    2 s and 5 s late."""
    page_state(client, database_url)
    return client


def drawn(frame, chart: str, key: str, value: str) -> dict:
    """{data-label: (data-value, title)} of each bar or point of one chart, read from the DOM."""
    marks = frame.locator(f'svg[data-chart="{chart}"][data-{key}="{value}"] g[data-label]')
    return {
        m["label"]: (m["value"], m["title"])
        for m in marks.evaluate_all(
            "els => els.map(e => ({label: e.dataset.label, value: e.dataset.value,"
            " title: e.querySelector('title').textContent}))"
        )
    }


def open_page(page, base: str):
    page.goto(f"{base}/plugin/dead-letters", wait_until="networkidle")
    frame = page.frame_locator("iframe").first
    frame.get_by_text("Group billing: 10 dead letters").wait_for(timeout=20_000)
    return frame


def test_the_page_charts_the_state_in_the_airflow_ui(airflow, browser, charted):
    frame = open_page(browser, airflow)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(path=str(ARTIFACTS / "dead-letters.png"))
    assert drawn(frame, "states", "group", "billing") == {
        "READY": ("5", "READY: 5 messages"),
        "INFLIGHT": ("7", "INFLIGHT: 7 messages"),
        "WAITING_RETRY": ("10", "WAITING_RETRY: 10 messages"),
        "DLQ": ("10", "DLQ: 10 messages"),
    }
    assert drawn(frame, "states", "group", "audit")["READY"] == ("4", "READY: 4 messages")
    levels = drawn(frame, "levels", "group", "billing")
    assert {k: v for k, v in levels.items() if v[0] != "0"} == {
        "level 1": ("6", "level 1 (10s): 6 retries waiting"),
        "level 3": ("4", "level 3 (1m): 4 retries waiting"),
    }
    assert len(levels) == 16
    lateness = drawn(frame, "lateness", "tier", "seconds")
    assert sorted(v[1] for v in lateness.values()) == [
        "2026-03-01 12:00:13: p50 2 s",
        "2026-03-01 12:00:13: p99 2 s",
        "2026-03-01 12:00:56: p50 5 s",
        "2026-03-01 12:00:56: p99 5 s",
    ]
    # the counts are drawn as text, not only in the titles
    bar_texts = frame.locator('svg[data-chart="states"][data-group="billing"] text').all_text_contents()
    assert {"5", "7", "10"} <= set(bar_texts)
    # the whole page as well, outside the iframe (the Airflow UI's frame cuts it at the viewport)
    browser.goto(f"{airflow}/redelivery/dlq", wait_until="networkidle")
    browser.screenshot(path=str(ARTIFACTS / "dead-letters-page.png"), full_page=True)


def test_the_form_triggers_a_dry_run_of_the_group_with_its_filter(airflow, browser, charted, tmp_path):
    """The form posts in the UI's sandboxed frame; the answer takes the whole UI to the run's page."""
    known = {r["dag_run_id"] for r in runs(airflow)}
    frame = open_page(browser, airflow)
    form = frame.locator('form[data-group="billing"]')
    form.locator('select[name="reason"]').select_option("REJECTED")
    form.locator('input[name="error_contains"]').fill("schema")
    form.get_by_role("button").click()
    browser.wait_for_url(re.compile(r"/dags/dlq_redrive/runs/[^/?#]+"), timeout=30_000)
    run = wait_for_run(airflow, known)
    shown = re.search(r"/dags/dlq_redrive/runs/([^/?#]+)", browser.url).group(1)
    assert browser.url.startswith(f"{airflow}/dags/") and unquote(shown) == run["dag_run_id"], browser.url
    browser.get_by_text(run["dag_run_id"]).first.wait_for(timeout=20_000)  # the UI shows the run
    browser.screenshot(path=str(tmp_path / "dry-run-page.png"))
    assert run["state"] == "success"
    assert run["conf"] == {
        "group": "billing",
        "dry_run": True,
        "reasons": ["REJECTED"],
        "error_contains": "schema",
    }
    assert dlq_state(charted) == {"READY": 5, "INFLIGHT": 7, "WAITING_RETRY": 10, "COMMITTED": 3, "DLQ": 10}
    audit = charted.conn.execute(
        "SELECT run_key, triggered_by, dry_run, status, matched, moved FROM redrive_runs"
    ).fetchall()
    assert (
        audit == [(f"dlq_redrive/{run['dag_run_id']}", audit[0][1], True, "success", 10, 0)] and audit[0][1]
    )
    [logged] = trigger_logs(airflow, run["dag_run_id"])  # in Airflow's audit log, as a REST trigger is
    assert logged["owner"] and json.loads(logged["extra"])["conf"] == run["conf"]
    # a top-level page posting the form goes straight to the run; the page after the form names it
    known.add(run["dag_run_id"])
    direct = post_form(airflow, {"group": "billing"}, Origin=airflow, **{"Sec-Fetch-Dest": "document"})
    assert direct.status_code == 303, direct.text
    second = wait_for_run(airflow, known)
    assert direct.headers["location"] == f"/dags/dlq_redrive/runs/{quote(second['dag_run_id'], safe='')}"
    assert second["conf"] == {"group": "billing", "dry_run": True} and second["state"] == "success"
    after = api.get(f"{airflow}/redelivery/dlq/runs/{quote(second['dag_run_id'], safe='')}", timeout=30)
    assert after.status_code == 200 and second["dag_run_id"] in after.text
    assert dlq_state(charted)["DLQ"] == 10


def trigger_logs(base: str, run_id: str | None = None) -> list[dict]:
    """Airflow's audit-log entries of dlq_redrive triggers (``run_id`` None: the refused ones)."""
    entries = api.get(
        f"{base}/api/v2/eventLogs",
        params={"dag_id": "dlq_redrive", "event": "trigger_dag_run", "limit": 100},
        timeout=30,
    ).json()["event_logs"]
    return [e for e in entries if e["run_id"] == run_id]


def post_form(base: str, data: dict, caller: requests.Session = api, **headers) -> requests.Response:
    return caller.post(
        f"{base}/redelivery/dlq/redrive", data=data, headers=headers, allow_redirects=False, timeout=30
    )


def test_a_bad_filter_or_a_cross_origin_post_is_refused_and_creates_nothing(airflow, browser, charted):
    known = {r["dag_run_id"] for r in runs(airflow)}
    frame = open_page(browser, airflow)
    frame.locator('form[data-group="billing"] input[name="error_contains"]').fill("x" * 1001)
    frame.locator('form[data-group="billing"]').get_by_role("button").click()
    refusal = frame.locator("ul.refused li")  # in the frame, under the UI's navigation
    refusal.first.wait_for(timeout=30_000)
    [text] = refusal.all_inner_texts()
    assert text.startswith("error_contains: ") and "is too long" in text and "\n" not in text
    assert len(text) <= 300
    base = {"group": "billing"}
    same = {"Origin": airflow}
    logged = {e["event_log_id"] for e in trigger_logs(airflow)}
    refused = post_form(airflow, {**base, "reason": "SOMETIMES"}, **same)
    assert refused.status_code == 400 and "is not one of" in refused.text, refused.text
    [entry] = [e for e in trigger_logs(airflow) if e["event_log_id"] not in logged]  # audited too
    assert "is not one of" in " ".join(json.loads(entry["extra"])["refused"]) and entry["owner"]
    refused = post_form(airflow, {"group": "bad group!"}, **same)
    assert refused.status_code == 400 and "does not match" in refused.text, refused.text
    since = last_event_id(airflow)
    for headers, origin in (
        ({"Origin": "http://evil.example"}, "'http://evil.example'"),
        ({"Referer": "http://127.0.0.2:1/x"}, "'http://127.0.0.2:1'"),
        ({}, "None"),
        ({"Origin": "null"}, "'null'"),
    ):
        refused = post_form(airflow, base, **headers)
        assert refused.status_code == 403, (headers, refused.status_code, refused.text)
        [entry] = audited(airflow, "admin", since)  # the cross-site post is in the audit log
        assert entry["event"] == "trigger_dag_run" and entry["extra"]["conf"] == {**base, "dry_run": True}
        assert entry["extra"]["refused"] == [f"a POST from origin {origin}, not this api-server's"]
        since = entry["event_log_id"]
    time.sleep(3)
    assert {r["dag_run_id"] for r in runs(airflow)} == known
    assert dlq_state(charted)["DLQ"] == 10


# ---- issue 17: every bad field of a refused dry run; the group filter; run links; paused tiers ---


def test_a_refused_dry_run_names_every_bad_field_one_line_each(airflow, browser, charted):
    """The form's post is checked against dlq_redrive's Params as a whole: every refused value is
    a line of its own (Airflow's trigger names only the first, with its JSON schema)."""
    known = {r["dag_run_id"] for r in runs(airflow)}
    logged = {e["event_log_id"] for e in trigger_logs(airflow)}
    frame = open_page(browser, airflow)
    form = frame.locator('form[data-group="billing"]')
    form.locator('input[name="error_contains"]').fill("x" * 1001)
    # values the page never offers, as a crafted post would carry them
    form.evaluate(
        """f => { f.querySelector('input[name="group"]').value = 'bad group!';
                  const o = document.createElement('option'), select = f.querySelector('select');
                  o.value = o.textContent = 'SOMETIMES'; select.appendChild(o);
                  select.value = 'SOMETIMES'; }"""
    )
    form.get_by_role("button").click()
    lines = frame.locator("ul.refused li")
    lines.first.wait_for(timeout=30_000)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(path=str(ARTIFACTS / "dead-letters-refused.png"))
    texts = lines.all_inner_texts()
    assert [t.split(":")[0] for t in texts] == ["group", "reasons[0]", "error_contains"], texts
    assert all("\n" not in t and len(t) <= 300 for t in texts), texts
    page_text = frame.locator("body").inner_text()
    assert "Failed validating" not in page_text and "'type'" not in page_text and "schema" not in page_text
    [entry] = [e for e in trigger_logs(airflow) if e["event_log_id"] not in logged]
    assert [p.split(":")[0] for p in json.loads(entry["extra"])["refused"]] == [
        "group",
        "reasons[0]",
        "error_contains",
    ]
    time.sleep(3)
    assert {r["dag_run_id"] for r in runs(airflow)} == known and dlq_state(charted)["DLQ"] == 10


def test_the_group_filter_is_in_the_address_and_run_ids_open_their_runs(airflow, browser, charted):
    known = {r["dag_run_id"] for r in runs(airflow)}
    created = api.post(
        f"{airflow}/api/v2/dags/dlq_redrive/dagRuns",
        json={"logical_date": None, "conf": {"group": "billing"}},  # a dry run
        timeout=30,
    )
    assert created.status_code == 200, created.text
    run = wait_for_run(airflow, known)
    shared = api.get(f"{airflow}/redelivery/dlq", params={"group": "AUD"}, timeout=30)
    assert "Group audit: no dead letters" in shared.text and "Group billing" not in shared.text
    frame = open_page(browser, airflow)
    frame.locator('form.filter input[name="group"]').fill("aud")
    frame.locator("form.filter").get_by_role("button").click()
    frame.get_by_text("1 group whose name contains “aud”").wait_for(timeout=20_000)
    frame.get_by_text("Group audit: no dead letters").wait_for(timeout=20_000)
    assert frame.get_by_text("Group billing: 10 dead letters").count() == 0
    framed = next(f for f in browser.frames if "/redelivery/dlq" in f.url)
    assert framed.url.endswith("/redelivery/dlq?group=aud"), framed.url  # a link to share
    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(path=str(ARTIFACTS / "dead-letters-filtered.png"))
    frame = open_page(browser, airflow)
    frame.get_by_role("link", name=f"dlq_redrive/{run['dag_run_id']}").click()
    browser.wait_for_url(re.compile(r"/dags/dlq_redrive/runs/[^/?#]+"), timeout=30_000)
    assert browser.url == f"{airflow}/dags/dlq_redrive/runs/{quote(run['dag_run_id'], safe='')}"


def event_time(base: str, event: str, dag_id: str | None) -> str:
    """The newest audit-log entry's time of ``event`` (of ``dag_id``), as the page writes times."""
    from datetime import UTC, datetime

    entries = api.get(
        f"{base}/api/v2/eventLogs", params={"event": event, "order_by": "-when", "limit": 100}, timeout=30
    ).json()["event_logs"]
    [newest, *_] = [e for e in entries if e["dag_id"] == dag_id]
    when = datetime.fromisoformat(newest["when"].replace("Z", "+00:00"))
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_a_paused_tier_is_shown_at_the_top_and_measured(airflow, browser, charted):
    """The fixture paused every tier DAG in bulk, then the seconds tier alone again: each is paused
    since the bulk pause. The page says so at the top and /redelivery/metrics has a gauge per tier;
    unpaused, a tier leaves both."""
    frame = open_page(browser, airflow)
    banners = frame.locator("div.paused")
    assert banners.count() == 4
    seconds = frame.locator('div.paused[data-tier="seconds"]').inner_text()
    bulk = event_time(airflow, "patch_dags", None)
    assert "Tier seconds is paused in Airflow" in seconds and "delay levels 1 (10s) and 2 (30s)" in seconds
    assert f"paused since {bulk} by " in seconds, (seconds, bulk)
    assert "6 retries wait at them, 6 of them due" in seconds
    assert "delay levels 15 (1h) and 16 (2h)" in frame.locator('div.paused[data-tier="hours"]').inner_text()
    gauges = lambda: {  # noqa: E731
        line.split('"')[1]: line.rsplit(" ", 1)[1]
        for line in api.get(f"{airflow}/redelivery/metrics", timeout=30).text.splitlines()
        if line.startswith("redelivery_tier_paused{")
    }
    assert gauges() == {"seconds": "1.0", "minutes": "1.0", "half_hours": "1.0", "hours": "1.0"}
    try:
        unpaused = api.patch(
            f"{airflow}/api/v2/dags/redelivery_tier_hours", json={"is_paused": False}, timeout=30
        )
        assert unpaused.status_code == 200
        assert gauges()["hours"] == "0.0"
        page = api.get(f"{airflow}/redelivery/dlq", timeout=30).text
        assert 'data-tier="hours"' not in page and 'data-tier="seconds"' in page
    finally:
        api.patch(f"{airflow}/api/v2/dags/redelivery_tier_hours", json={"is_paused": True}, timeout=30)
        settle_tier_runs(airflow)
    paused_again = event_time(airflow, "patch_dag", "redelivery_tier_hours")
    page = api.get(f"{airflow}/redelivery/dlq", timeout=30).text
    assert f"paused since {paused_again} by " in page.split('data-tier="hours"')[1].split("</div>")[0]


# ---- issue 18: restricted users (FAB roles): who gets the page, and who may trigger its form -----

#: Every route of the page (a run's "dry run triggered" page too) and the audit-log event of its
#: refusal.
PAGE_ROUTES = {
    "/redelivery/dlq": "get_dead_letters_page",
    "/redelivery/dlq.json": "get_dead_letters_json",
    "/redelivery/metrics": "get_redelivery_metrics",
    "/redelivery/dlq/runs/manual__1": "get_dry_run_triggered",
}


def last_event_id(base: str) -> int:
    """The newest entry's id in Airflow's audit log (0: none)."""
    newest = api.get(
        f"{base}/api/v2/eventLogs", params={"order_by": "-event_log_id", "limit": 1}, timeout=30
    ).json()["event_logs"]
    return newest[0]["event_log_id"] if newest else 0


def audited(base: str, owner: str, after: int) -> list[dict]:
    """dlq_redrive's audit-log entries of ``owner`` newer than the entry ``after``, oldest first,
    each with its extra parsed."""
    entries = api.get(
        f"{base}/api/v2/eventLogs",
        params={"dag_id": "dlq_redrive", "owner": owner, "order_by": "-event_log_id", "limit": 100},
        timeout=30,
    ).json()["event_logs"]
    return [
        {**e, "extra": json.loads(e["extra"] or "{}")} for e in reversed(entries) if e["event_log_id"] > after
    ]


def run_ids(base: str) -> set[str]:
    return {r["dag_run_id"] for r in runs(base)}


@pytest.mark.parametrize(
    "user,page_status,refused",
    [("admin", 200, None), ("reader", 200, "trigger"), ("outsider", 403, "read")],
)
def test_who_may_read_the_page_and_trigger_its_form(local_airflow, charted, user, page_status, refused):
    """Through the API with each user's token: a user without dlq_redrive gets 403 and none of the
    state store's data from every route; the form's post is refused (403) to whoever may not
    trigger dlq_redrive (``refused``: the permission missing), and then no run is made and no row
    of the state store changes; an admin gets both. Every refusal is in Airflow's audit log, the
    user as owner, the conf and the reason in extra."""
    base, caller = local_airflow.url, local_airflow.session(user)
    known, before, since = run_ids(base), snapshot(charted.conn), last_event_id(base)
    pages = {path: caller.get(f"{base}{path}", timeout=30) for path in PAGE_ROUTES}
    assert {path: a.status_code for path, a in pages.items()} == dict.fromkeys(PAGE_ROUTES, page_status)
    if page_status == 200:
        assert "Group billing: 10 dead letters" in pages["/redelivery/dlq"].text
        assert pages["/redelivery/dlq.json"].json()[0]["count"] == 10
        assert 'group="billing"' in pages["/redelivery/metrics"].text
    else:  # nothing of the state store leaks
        assert all(a.json() == {"detail": "Forbidden"} for a in pages.values()), pages
    posted = post_form(base, {"group": "billing", "reason": "REJECTED"}, caller, Origin=base)
    conf = {"group": "billing", "dry_run": True, "reasons": ["REJECTED"]}
    entries = audited(base, user, since)
    if refused is None:
        assert posted.status_code == 303, posted.text
        run = wait_for_run(base, known)
        assert run["conf"] == conf and run["state"] == "success"
        assert [(e["event"], e["run_id"], e["extra"]["conf"]) for e in entries] == [
            ("trigger_dag_run", run["dag_run_id"], conf)
        ]
        assert dlq_state(charted)["DLQ"] == 10  # a dry run
        return
    reason = f"{user} may not {refused} dlq_redrive (Airflow: Forbidden)"
    assert posted.status_code == 403 and escape(reason) in posted.text, posted.text
    assert run_ids(base) == known and snapshot(charted.conn) == before  # nothing triggered or changed
    reads = [] if page_status == 200 else [(event, path) for path, event in PAGE_ROUTES.items()]
    assert [(e["event"], e["extra"].get("via")) for e in entries[:-1]] == reads, entries
    assert all(
        e["extra"]["refused"] == [f"{user} may not read dlq_redrive (Airflow: Forbidden)"]
        for e in entries[:-1]
    )
    [trigger] = entries[len(reads) :]
    assert trigger["event"] == "trigger_dag_run" and trigger["run_id"] is None
    assert trigger["extra"]["conf"] == conf and trigger["extra"]["refused"] == [reason]


def test_without_a_session_every_route_is_401_and_nothing_is_logged(airflow, charted):
    """No token, no cookie: 401 from every route, the form's post too; no one to name in the
    audit log, so no entry (Airflow logs none either)."""
    since = last_event_id(airflow)
    for path in PAGE_ROUTES:
        assert requests.get(f"{airflow}{path}", timeout=30).status_code == 401, path
    assert post_form(airflow, {"group": "billing"}, requests.Session(), Origin=airflow).status_code == 401
    logged = api.get(
        f"{airflow}/api/v2/eventLogs",
        params={"dag_id": "dlq_redrive", "order_by": "-event_log_id"},
        timeout=30,
    ).json()["event_logs"]
    assert [e for e in logged if e["event_log_id"] > since] == []


def test_a_reader_sees_the_page_in_the_ui_and_is_refused_its_form(airflow, chromium, charted):
    """Signed in on the login page with role DlqReader: the Dead letters page in the UI's frame;
    its form's button answers, in the frame, that the reader may not trigger dlq_redrive; no run,
    no change, an audit entry."""
    known, before, since = run_ids(airflow), snapshot(charted.conn), last_event_id(airflow)
    page = signed_in(chromium, airflow, "reader")
    frame = open_page(page, airflow)
    frame.locator('form[data-group="billing"]').get_by_role("button").click()
    refusal = frame.locator("ul.refused li")
    refusal.first.wait_for(timeout=30_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dead-letters-reader-refused.png"))
    assert refusal.all_inner_texts() == ["reader may not trigger dlq_redrive (Airflow: Forbidden)"]
    assert "Nothing was triggered." in frame.locator("body").inner_text()
    assert run_ids(airflow) == known and snapshot(charted.conn) == before
    [entry] = audited(airflow, "reader", since)
    assert entry["event"] == "trigger_dag_run" and entry["extra"]["conf"]["group"] == "billing"
    assert entry["extra"]["refused"] == ["reader may not trigger dlq_redrive (Airflow: Forbidden)"]


def test_a_user_without_dlq_redrive_sees_no_page_in_the_ui(airflow, chromium, charted):
    """Signed in with role TierOperator (rights on the seconds tier only): the UI shows that tier,
    the Dead letters frame shows Airflow's refusal and none of the state store; audited."""
    since = last_event_id(airflow)
    page = signed_in(chromium, airflow, "outsider")
    page.goto(f"{airflow}/dags/redelivery_tier_seconds", wait_until="networkidle")
    page.get_by_text("redelivery_tier_seconds").first.wait_for(timeout=20_000)  # a real, working user
    page.goto(f"{airflow}/plugin/dead-letters", wait_until="networkidle")
    frame = page.frame_locator("iframe").first
    frame.get_by_text("Forbidden").wait_for(timeout=20_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dead-letters-outsider.png"))
    assert "billing" not in frame.locator("body").inner_text()
    assert page.goto(f"{airflow}/redelivery/metrics").status == 403
    events = [(e["event"], e["extra"]["via"]) for e in audited(airflow, "outsider", since)]
    assert events == [
        ("get_dead_letters_page", "/redelivery/dlq"),
        ("get_redelivery_metrics", "/redelivery/metrics"),
    ]


# ---- issue 21: the dead letters themselves: browse, filter, inspect, act on a selection ----------

#: A key, an error and a body text that would run script in the page were anything unescaped.
HOSTILE = '</td></pre><script>window.top.__pwned = 1</script><img src=x onerror="window.top.__pwned=2">\'"&'


@pytest.fixture()
def letters(client, topic_group):
    """60 dead letters of billing, newest first: one hostile (JSON body, key and error, at 3 s),
    19 "upstream 503 <i>" (at 2 s), 40 "schema violation" (at 1 s); keys k0..k2 in turn.
    Returns (client, {"hostile": id, "upstream": ids, "schema": ids})."""
    ids = client.publish("orders", [Message({"n": i}, key=f"k{i % 3}") for i in range(59)], at=at(0))
    body = json.dumps({"note": HOSTILE, "amount": 10})
    [hostile] = client.publish("orders", [Message(body, content_type="application/json", key=HOSTILE,
                                                  properties={"tenant": HOSTILE})], at=at(0))  # fmt: skip
    got = {m.message_id: m for m in client.receive("billing", "orders", 60, 30, at=at(0))}
    client.reject("billing", [got[i] for i in ids[:40]], error="schema violation", at=at(1))
    client.reject(
        "billing", [got[i] for i in ids[40:]], error=[f"upstream 503 {i}" for i in range(19)], at=at(2)
    )
    client.reject("billing", got[hostile], error=HOSTILE * 3, at=at(3))
    return client, {"hostile": hostile, "upstream": ids[40:], "schema": ids[:40]}


def listed(frame) -> list[int]:
    return [int(i) for i in frame.locator("tr[data-message-id]").evaluate_all(
        "rows => rows.map(r => r.dataset.messageId)")]  # fmt: skip


def open_list(page, base: str):
    """The Dead letters page in the UI, then billing's list through its link, in the UI's frame."""
    page.goto(f"{base}/plugin/dead-letters", wait_until="networkidle")
    frame = page.frame_locator("iframe").first
    frame.locator("a.browse").first.click()
    frame.locator("tr[data-message-id]").first.wait_for(timeout=20_000)
    return frame


def framed_url(page) -> str:
    return next(f for f in page.frames if "/redelivery/dlq" in f.url).url


def filter_list(page, frame, **fields) -> None:
    """Fill the list's filter form (text fields by name; ``reasons``: boxes to tick), submit it,
    and wait until the frame shows the filtered list."""
    form = frame.locator("form.dlqfilter")
    for name, value in fields.items():
        if name == "reasons":
            for reason in value:
                form.locator(f'input[name="reasons"][value="{reason}"]').check()
        else:
            form.locator(f'input[name="{name}"]').fill(value)
    form.get_by_role("button").click()
    framed = next(f for f in page.frames if "/redelivery/dlq" in f.url)
    framed.wait_for_url(re.compile(r"[?&]error_contains=|[?&]key=|[?&]reasons="), timeout=20_000)
    frame.locator("p.muted").first.wait_for(timeout=20_000)


def test_browse_filter_and_open_a_hostile_dead_letter(airflow, browser, letters):
    client, ids = letters
    dialogs = []
    browser.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    frame = open_list(browser, airflow)
    newest_first = [
        ids["hostile"],
        *sorted(ids["upstream"], reverse=True),
        *sorted(ids["schema"], reverse=True),
    ]
    assert listed(frame) == newest_first[:50]  # a page of 50, newest first
    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(path=str(ARTIFACTS / "dead-letters-browse.png"))
    first = frame.locator(f'tr[data-message-id="{ids["hostile"]}"]').inner_text()
    assert HOSTILE in first and "REJECTED" in first and "%DLQ%billing" in first  # the key and error, as text
    frame.locator("a.next").click()
    next(f for f in browser.frames if "/redelivery/dlq" in f.url).wait_for_url(re.compile("after="))
    frame.get_by_text("no more").wait_for(timeout=20_000)
    assert listed(frame) == newest_first[50:]
    # the filter, in the frame's address: a link to share that opens the same view
    filter_list(browser, frame, error_contains="UPSTREAM", key="k1", reasons=["REJECTED"])
    expected = [i for i in sorted(ids["upstream"], reverse=True) if (i - 1) % 3 == 1]
    assert listed(frame) == expected and len(expected) == 7  # keys k1 among 41..59
    shared = framed_url(browser)
    assert urlsplit(shared).path.endswith("/redelivery/dlq/messages"), shared
    again = api.get(f"{airflow}/redelivery/dlq/messages?{urlsplit(shared).query}", timeout=30).text
    assert [int(i) for i in re.findall(r'data-message-id="(\d+)"', again)] == expected
    browser.screenshot(path=str(ARTIFACTS / "dead-letters-filtered-list.png"))
    # the hostile one: every field shown as text, nothing runs
    open_list(browser, airflow)
    frame.get_by_role("link", name=str(ids["hostile"]), exact=True).click()
    frame.locator("pre.body").wait_for(timeout=20_000)
    body = frame.locator("pre.body").inner_text()
    assert json.loads(body) == {"note": HOSTILE, "amount": 10} and body.startswith("{\n  ")  # pretty-printed
    assert frame.locator("pre.error").inner_text() == HOSTILE * 3
    text = frame.locator("body").inner_text()
    assert f"tenant\t{HOSTILE}" in text and "schema violation" not in text
    assert "RECONSUMETIMES" not in text  # rejected at once: never redelivered, no retry properties
    assert frame.locator("script").count() == 1 and frame.locator("img").count() == 0
    browser.screenshot(path=str(ARTIFACTS / "dead-letters-message.png"))
    assert browser.evaluate("window.__pwned") is None and dialogs == []
    assert browser.frames[1].evaluate("window.top.__pwned === undefined")


def test_a_bad_filter_in_the_address_is_one_line_each_and_reads_nothing(airflow, letters):
    answer = api.get(f"{airflow}/redelivery/dlq/messages",
                     params={"group": "billing", "reason": "REJECTED", "dead_lettered_from": "yesterday"},
                     timeout=30)  # fmt: skip
    assert answer.status_code == 400
    lines = [unescape(li) for li in re.findall(r"<li>(.*?)</li>", answer.text)]
    assert lines[0] == "reason: unknown parameter (did you mean 'reasons'?)" and len(lines) == 2
    assert lines[1].startswith("dead_lettered_from: ") and "yesterday" in lines[1]
    assert "data-message-id" not in answer.text
    missing = api.get(f"{airflow}/redelivery/dlq/messages/999999", params={"group": "billing"}, timeout=30)
    assert missing.status_code == 404 and "has no dead letter 999999" in unescape(missing.text)
    unknown = api.get(f"{airflow}/redelivery/dlq/messages", params={"group": "nobody"}, timeout=30)
    assert unknown.status_code == 400 and "nobody" in unknown.text


def start_from_the_list(browser, frame) -> None:
    frame.get_by_role("button", name="Start dlq_redrive").click()
    browser.wait_for_url(re.compile(r"/dags/dlq_redrive/runs/[^/?#]+"), timeout=30_000)


def test_select_then_dry_run_then_real_run_of_all_matching(airflow, browser, letters):
    client, ids = letters
    known = run_ids(airflow)
    frame = open_list(browser, airflow)
    ticked = sorted(ids["upstream"])[:3]
    for mid in ticked:
        frame.locator(f'tr[data-message-id="{mid}"] input[name="selected"]').check()
    start_from_the_list(browser, frame)  # dry run is the default
    run = wait_for_run(airflow, known)
    assert run["state"] == "success"
    assert run["conf"] == {"group": "billing", "message_ids": sorted(ticked, reverse=True), "dry_run": True}
    assert dlq_state(client)["DLQ"] == 60
    [entry] = trigger_logs(airflow, run["dag_run_id"])
    extra = json.loads(entry["extra"])
    assert (
        extra["conf"] == run["conf"] and extra["via"] == "/redelivery/dlq/messages/redrive" and entry["owner"]
    )
    matched = client.conn.execute("SELECT matched, moved FROM redrive_runs WHERE run_key = %s",
                                  (f"dlq_redrive/{run['dag_run_id']}",)).fetchone()  # fmt: skip
    assert matched == (3, 0)
    known.add(run["dag_run_id"])
    # all matching a filter, for real
    frame = open_list(browser, airflow)
    filter_list(browser, frame, error_contains="upstream")
    frame.locator('input[name="selection"][value="all"]').check()
    frame.locator('input[name="run"][value="real"]').check()
    browser.screenshot(path=str(ARTIFACTS / "dead-letters-real-run.png"))
    start_from_the_list(browser, frame)
    run = wait_for_run(airflow, known)
    assert run["state"] == "success"
    assert run["conf"] == {"group": "billing", "error_contains": "upstream", "dry_run": False}
    assert dlq_state(client)["DLQ"] == 41 and dlq_state(client)["READY"] == 19
    moved = {r[0] for r in client.conn.execute("SELECT message_id FROM redrive_moves")}
    assert moved == set(ids["upstream"])
    after = api.get(f"{airflow}/redelivery/dlq/messages", params={"group": "billing"}, timeout=30).text
    assert not set(ids["upstream"]) & {int(i) for i in re.findall(r'data-message-id="(\d+)"', after)}


def test_the_selection_downloads_as_json_lines(airflow, browser, letters, database_url):
    from redelivery.dead_letters import DlqFilter, jsonable, select

    client, ids = letters
    frame = open_list(browser, airflow)
    ticked = [ids["hostile"], max(ids["schema"])]  # both on the first page
    for mid in ticked:
        frame.locator(f'tr[data-message-id="{mid}"] input[name="selected"]').check()
    with browser.expect_download(timeout=30_000) as download:
        frame.locator("button.download").click()
    lines = Path(download.value.path()).read_text().splitlines()
    expected = jsonable(select(client.conn, DlqFilter(group="billing", message_ids=ticked), with_body=True))
    assert [json.loads(line) for line in lines] == json.loads(json.dumps(expected, default=str))
    assert download.value.suggested_filename == "dead-letters-billing.jsonl"
    query = {"group": "billing", "selection": "all", "reasons": "REJECTED"}
    everything = api.get(f"{airflow}/redelivery/dlq/messages.jsonl", params=query, timeout=30)
    assert everything.status_code == 200 and len(everything.text.splitlines()) == 60
    cli = run_cli("dlq", "list", "--group", "billing", "--limit", "100", "--json", database_url=database_url)
    assert [json.loads(line) for line in everything.text.splitlines()] == json.loads(cli.stdout)


def test_a_reader_browses_but_may_not_redrive_and_an_outsider_sees_nothing(
    airflow, chromium, letters, local_airflow
):
    client, ids = letters
    known, before, since = run_ids(airflow), snapshot(client.conn), last_event_id(airflow)
    page = signed_in(chromium, airflow, "reader")
    frame = open_list(page, airflow)
    start = frame.get_by_role("button", name="Start dlq_redrive")
    assert (
        start.is_disabled()
        and "reader may not trigger dlq_redrive" in frame.locator("p.refusal").inner_text()
    )
    # the button turned back on in the page, as a crafted post would be: Airflow's permission refuses it
    frame.locator(f'tr[data-message-id="{ids["hostile"]}"] input[name="selected"]').check()
    frame.locator('input[name="run"][value="real"]').check()
    start.evaluate("b => b.disabled = false")
    start.click()
    refusal = frame.locator("ul.refused li")
    refusal.first.wait_for(timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "dead-letters-reader-real-run-refused.png"))
    assert refusal.all_inner_texts() == ["reader may not trigger dlq_redrive (Airflow: Forbidden)"]
    assert "real run" in frame.locator("body").inner_text()
    time.sleep(3)
    assert run_ids(airflow) == known and snapshot(client.conn) == before
    [entry] = audited(airflow, "reader", since)
    assert entry["event"] == "trigger_dag_run" and entry["extra"]["via"] == "/redelivery/dlq/messages/redrive"
    assert entry["extra"]["conf"] == {"group": "billing", "message_ids": [ids["hostile"]], "dry_run": False}
    outsider = local_airflow.session("outsider")
    for path in ("/redelivery/dlq/messages", f"/redelivery/dlq/messages/{ids['hostile']}",
                 "/redelivery/dlq/messages.jsonl"):  # fmt: skip
        answer = outsider.get(f"{airflow}{path}", params={"group": "billing", "selection": "all"}, timeout=30)
        assert answer.status_code == 403 and "billing" not in answer.text, path


def test_a_cross_origin_or_bad_selection_post_is_refused_and_audited(airflow, letters):
    client, ids = letters
    known, before, since = run_ids(airflow), snapshot(client.conn), last_event_id(airflow)
    url = f"{airflow}/redelivery/dlq/messages/redrive"
    form = {"group": "billing", "selected": str(ids["hostile"]), "run": "real"}
    crossed = api.post(
        url, data=form, headers={"Origin": "http://evil.example"}, allow_redirects=False, timeout=30
    )
    assert crossed.status_code == 403
    bad_form = {**form, "reasons": "SOMETIMES", "selection": "none"}
    bad = api.post(url, data=bad_form, headers={"Origin": airflow}, allow_redirects=False, timeout=30)
    assert bad.status_code == 400
    lines = [unescape(li) for li in re.findall(r"<li>(.*?)</li>", bad.text)]
    assert [line.split(":")[0] for line in lines] == ["selection", "reasons.0"], lines
    nothing = api.post(
        url, data={"group": "billing"}, headers={"Origin": airflow}, allow_redirects=False, timeout=30
    )
    assert nothing.status_code == 400 and "no message is ticked" in nothing.text
    time.sleep(3)
    assert run_ids(airflow) == known and snapshot(client.conn) == before
    entries = audited(airflow, "admin", since)
    assert [e["extra"]["refused"][0].split(":")[0] for e in entries] == [
        "a POST from origin 'http", "selection", "selected"]  # fmt: skip
    assert entries[0]["extra"]["conf"] == {
        "group": "billing",
        "message_ids": [ids["hostile"]],
        "dry_run": False,
    }
