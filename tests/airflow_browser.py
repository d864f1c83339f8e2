"""Helpers of the browser tests against a real Airflow (tests/airflow/ui): its users and roles,
the admin's API session, Chromium's flags, signed-in pages, dlq_redrive's runs and audit log.
The fixtures that start Airflow and Chromium are in tests/airflow/ui/conftest.py."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import requests

from helpers import REPO_ROOT

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
#: Every browser test needs Debian's chromium (``make test`` installs it) and a real Airflow.
BROWSER_MARKS = [
    pytest.mark.airflow,
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and not os.environ.get("CI"),
        reason="Debian's chromium is not installed (make test installs it)",
    ),
]
#: Screenshots the browser tests keep (not committed).
ARTIFACTS = REPO_ROOT / "test-artifacts"


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
    """Until no tier task is running or queued (a paused tier's batch stops within 10 s, issue 38;
    Airflow marks the run of a paused DAG finished only once it is unpaused, so the task's state
    tells, not the run's; a queued task of a paused DAG never starts)."""
    deadline, quiet = time.monotonic() + timeout, 0
    while quiet < 2:
        busy = [
            ti
            for d in tier_dag_ids()
            for r in api.get(
                f"{base}/api/v2/dags/{d}/dagRuns", params={"state": "running"}, timeout=30
            ).json()["dag_runs"]
            for ti in [
                api.get(
                    f"{base}/api/v2/dags/{d}/dagRuns/{r['dag_run_id']}/taskInstances/apply_window", timeout=30
                ).json()
            ]
            if ti.get("state") in ("running", "queued")
        ]
        quiet = 0 if busy else quiet + 1
        assert time.monotonic() < deadline, f"tier tasks still running: {busy}"
        time.sleep(2)


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


def dlq_state(client) -> dict:
    return client.stats()["orders"]["billing"]


def trigger_logs(base: str, run_id: str | None = None) -> list[dict]:
    """Airflow's audit-log entries of dlq_redrive triggers (``run_id`` None: the refused ones)."""
    entries = api.get(
        f"{base}/api/v2/eventLogs",
        params={"dag_id": "dlq_redrive", "event": "trigger_dag_run", "limit": 100},
        timeout=30,
    ).json()["event_logs"]
    return [e for e in entries if e["run_id"] == run_id]


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


def open_page(page, base: str):
    page.goto(f"{base}/plugin/dead-letters", wait_until="networkidle")
    frame = page.frame_locator("iframe").first
    frame.get_by_text("Group billing: 10 dead letters").wait_for(timeout=20_000)
    return frame


def follow_list_link(frame, reason: str | None = None, group: str = "billing"):
    """From the Dead letters page in the UI's frame (``open_page``), the group's link to its
    dead-letter list (all of them, or ``reason``'s), followed in the frame; returns the frame."""
    links = frame.locator(f'p.browse-links[data-group="{group}"]')
    (links.locator(f'a[data-reason="{reason}"]') if reason else links.locator("a.browse")).click()
    frame.locator("form.dlqfilter").wait_for(timeout=20_000)
    return frame


def post_form(base: str, data: dict, caller: requests.Session = api, **headers) -> requests.Response:
    """A post of the list's selection form for all dead letters matching ``data`` (the filter's
    fields: a dry run unless ``run`` is ``real``), as the page's old dry-run form posted a group's
    filter."""
    return caller.post(
        f"{base}/redelivery/dlq/messages/redrive",
        data={**data, "selection": "all"},
        headers=headers,
        allow_redirects=False,
        timeout=30,
    )
