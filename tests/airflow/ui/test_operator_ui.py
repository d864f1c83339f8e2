"""The operator's view, end to end: a real Airflow 3 (api-server, scheduler, dag-processor) on the
embedded PostgreSQL with the project's DAGs, driven in headless Chromium (Debian's chromium,
Playwright) and through the REST API. Airflow runs the FAB auth manager with real roles: the
operator is ``admin`` (role Admin), and the last section checks what restricted users
(``ROLES``) get."""

from __future__ import annotations

import json
import re
import time
from html import unescape
from urllib.parse import quote, unquote

import pytest

from airflow_browser import (
    ARTIFACTS,
    BROWSER_MARKS,
    api,
    audited,
    dlq_state,
    follow_list_link,
    last_event_id,
    open_page,
    post_form,
    run_ids,
    runs,
    settle_tier_runs,
    trigger_logs,
    wait_for_run,
)
from helpers import at, snapshot

pytestmark = BROWSER_MARKS


@pytest.fixture()
def dead_letters(client, topic_group):
    client.publish("orders", [{"n": i} for i in range(30)], at=at(0))
    client.reject(
        "billing", client.receive("billing", "orders", 30, 30, at=at(0)), error="schema violation", at=at(1)
    )
    return client


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
    assert "Every breaker is closed." in text and "Standing redrives" in text
    # an outage (issue 41): a breaker held open is a banner at the top, its audit and the standing
    # redrives are listed
    from redelivery.rules.standing import StandingRedrive
    from redelivery.standing import add

    dead_letters.open_breaker("orders", "billing", by="ops", note="payments API down")
    add(dead_letters.conn, StandingRedrive(name="after-outage", group="billing"), "ops")
    browser.reload(wait_until="networkidle")
    frame.get_by_text("The breaker of group billing on topic orders is held open").wait_for(timeout=20_000)
    text = frame.locator("body").inner_text()
    assert "closed → held" in text and "payments API down" in text
    assert "after-outage" in text and "after a breaker closed" in text
    assert frame.locator("a", has_text="redelivery_breaker").count() >= 1
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


# ---- the Dead letters page: its charts, its links to a group's list, and what a redrive refuses ---

#: Screenshots kept after the run as test artifacts (repository root; ignored by git).


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


def test_the_page_charts_the_state_in_the_airflow_ui(airflow, browser, charted):
    frame = open_page(browser, airflow)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(path=str(ARTIFACTS / "dead-letters.png"))
    assert drawn(frame, "states", "group", "billing") == {
        "READY": ("5", "READY: 5 messages"),
        "INFLIGHT": ("7", "INFLIGHT: 7 messages"),
        "WAITING_RETRY": ("10", "WAITING_RETRY: 10 messages"),
        "DLQ": ("10", "DLQ: 10 messages"),
        "BLOCKED": ("0", "BLOCKED: 0 messages"),  # a state of its own wherever states are (issue 36.4)
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


def list_frame(browser):
    """The frame showing the plugin's pages (the list after a link was followed)."""
    return next(f for f in browser.frames if "/redelivery/dlq" in f.url)


def test_a_reason_link_leads_to_a_dry_run_of_the_group_with_its_filter(airflow, browser, charted, tmp_path):
    """The page's REJECTED link opens billing's list in the UI's sandboxed frame, under that filter;
    "error contains" filled in the list's filter, all matching started as a dry run (the default):
    the answer takes the whole UI to the run's page."""
    known = {r["dag_run_id"] for r in runs(airflow)}
    frame = follow_list_link(open_page(browser, airflow), "REJECTED")
    form = frame.locator("form.dlqfilter")
    assert form.locator('input[name="reasons"][value="REJECTED"]').is_checked()  # the link's filter
    assert form.locator('input[name="reasons"]:checked').count() == 1
    form.locator('input[name="error_contains"]').fill("schema")
    form.get_by_role("button", name="Filter").click()
    list_frame(browser).wait_for_url(re.compile(r"[?&]error_contains=schema"), timeout=20_000)
    frame.locator("tr[data-message-id]").first.wait_for(timeout=20_000)
    assert frame.locator("tr[data-message-id]").count() == 10
    frame.locator('input[name="selection"][value="all"]').check()
    assert frame.locator('input[name="run"][value="dry_run"]').is_checked()  # a dry run by default
    frame.get_by_role("button", name="Start dlq_redrive").click()
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
    assert dlq_state(charted) == {
        "READY": 5, "INFLIGHT": 7, "WAITING_RETRY": 10, "COMMITTED": 3, "DLQ": 10, "BLOCKED": 0,
    }  # fmt: skip
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


def test_a_bad_filter_or_a_cross_origin_post_is_refused_and_creates_nothing(airflow, browser, charted):
    known = {r["dag_run_id"] for r in runs(airflow)}
    frame = follow_list_link(open_page(browser, airflow))
    frame.locator('form.dlqfilter input[name="error_contains"]').fill("x" * 1001)
    frame.locator("form.dlqfilter").get_by_role("button", name="Filter").click()
    refusal = frame.locator("ul.refused li")  # in the frame, under the UI's navigation
    refusal.first.wait_for(timeout=30_000)
    [text] = refusal.all_inner_texts()
    assert text.startswith("error_contains: ") and "at most 1000 characters" in text and "\n" not in text
    assert len(text) <= 300
    base = {"group": "billing"}
    same = {"Origin": airflow}
    logged = {e["event_log_id"] for e in trigger_logs(airflow)}
    refused = post_form(airflow, {**base, "reasons": "SOMETIMES"}, **same)
    assert refused.status_code == 400 and "Input should be" in refused.text, refused.text
    [entry] = [e for e in trigger_logs(airflow) if e["event_log_id"] not in logged]  # audited too
    assert "Input should be" in " ".join(json.loads(entry["extra"])["refused"]) and entry["owner"]
    refused = post_form(airflow, {"group": "bad group!"}, **same)
    assert refused.status_code == 400 and "is invalid" in refused.text, refused.text
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


def test_the_old_dry_run_form_is_gone_with_the_way_to_the_list(airflow, charted, local_airflow):
    """POST /redelivery/dlq/redrive (the page's form until issue 39.3) answers 410 for one release
    with the list's address, the filter it posted filled in; it triggers and writes nothing, for
    anyone who may read the page (a reader too); anyone else gets the read refusal, audited as a
    read."""
    known, before, since = run_ids(airflow), snapshot(charted.conn), last_event_id(airflow)
    url = f"{airflow}/redelivery/dlq/redrive"

    def hint(answer) -> str:
        [line] = re.findall(r"<p class='gone'>(.*?)</p>", answer.text)
        return unescape(re.sub(r"<[^>]*>", "", line))

    posted = {"group": "billing", "reasons": "REJECTED", "error_contains": "schema"}
    gone = api.post(url, data=posted, headers={"Origin": airflow}, allow_redirects=False, timeout=30)
    assert gone.status_code == 410, gone.text
    assert hint(gone) == (
        "the dry-run form moved: open /redelivery/dlq/messages?group=billing&reasons=REJECTED"
        "&error_contains=schema, choose the messages, and redrive them (a dry run by default)"
    )
    reader = local_airflow.session("reader")  # may read, not trigger: the same answer
    bare = reader.post(url, data={}, headers={"Origin": airflow}, allow_redirects=False, timeout=30)
    assert bare.status_code == 410 and hint(bare) == (
        "the dry-run form moved: open /redelivery/dlq/messages?group=..., "
        "choose the messages, and redrive them (a dry run by default)"
    )
    outsider = local_airflow.session("outsider").post(url, data=posted, allow_redirects=False, timeout=30)
    assert outsider.status_code == 403 and "billing" not in outsider.text
    time.sleep(3)
    assert run_ids(airflow) == known and snapshot(charted.conn) == before
    assert audited(airflow, "admin", since) == [] and audited(airflow, "reader", since) == []
    [refused] = audited(airflow, "outsider", since)  # a refused read, as every route's: no trigger
    assert (refused["event"], refused["extra"]["via"]) == ("get_redelivery_page", "/redelivery/dlq/redrive")


# ---- issue 17: every bad field of a refused dry run; the group filter; run links; paused tiers ---


def test_a_refused_dry_run_names_every_bad_field_one_line_each(airflow, browser, charted):
    """The list's selection is checked by the redrive's own filter (then against dlq_redrive's
    Params): every refused value is a line of its own (Airflow's trigger names only the first,
    with its JSON schema)."""
    known = {r["dag_run_id"] for r in runs(airflow)}
    logged = {e["event_log_id"] for e in trigger_logs(airflow)}
    frame = follow_list_link(open_page(browser, airflow), "REJECTED")
    form = frame.locator("form.select")
    # values the page never offers, as a crafted post would carry them
    form.evaluate(
        """f => { f.querySelector('input[type="hidden"][name="group"]').value = 'bad group!';
                  f.querySelector('input[type="hidden"][name="reasons"]').value = 'SOMETIMES';
                  const e = document.createElement('input');
                  e.type = 'hidden'; e.name = 'error_contains'; e.value = 'x'.repeat(1001);
                  f.appendChild(e); }"""
    )
    form.locator('input[name="selection"][value="all"]').check()
    form.get_by_role("button", name="Start dlq_redrive").click()
    lines = frame.locator("ul.refused li")
    lines.first.wait_for(timeout=30_000)
    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(path=str(ARTIFACTS / "dead-letters-refused.png"))
    texts = lines.all_inner_texts()
    assert [t.split(":")[0] for t in texts] == ["group", "reasons.0", "error_contains"], texts
    assert all("\n" not in t and len(t) <= 300 for t in texts), texts
    page_text = frame.locator("body").inner_text()
    assert "Failed validating" not in page_text and "'type'" not in page_text and "schema" not in page_text
    assert "Nothing was triggered." in page_text
    [entry] = [e for e in trigger_logs(airflow) if e["event_log_id"] not in logged]
    assert [p.split(":")[0] for p in json.loads(entry["extra"])["refused"]] == [
        "group",
        "reasons.0",
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
