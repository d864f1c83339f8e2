"""Who gets the operator's page and who may redrive from it (issue 18), with FAB roles in a real
Airflow: the admin, a reader of dlq_redrive (``DlqReader``) and a user of another DAG only
(``TierOperator``), through the API with each one's token and in headless Chromium; every refusal
is audited and changes nothing."""

from __future__ import annotations

from html import escape

import pytest
import requests

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
    signed_in,
    wait_for_run,
)
from helpers import snapshot

pytestmark = BROWSER_MARKS


# ---- issue 18: restricted users (FAB roles): who gets the page, and who may trigger its form -----

#: Every route of the page (a run's "dry run triggered" page too) and the audit-log event of its
#: refusal.
PAGE_ROUTES = {
    "/redelivery/dlq": "get_dead_letters_page",
    "/redelivery/dlq.json": "get_dead_letters_json",
    "/redelivery/metrics": "get_redelivery_metrics",
    "/redelivery/dlq/runs/manual__1": "get_dry_run_triggered",
}


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
    posted = post_form(base, {"group": "billing", "reasons": "REJECTED"}, caller, Origin=base)
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
    """Signed in on the login page with role DlqReader: the Dead letters page in the UI's frame,
    and from its REJECTED link billing's list, its redrive button off; turned back on (as a crafted
    post would be), it answers in the frame that the reader may not trigger dlq_redrive; no run, no
    change, an audit entry."""
    known, before, since = run_ids(airflow), snapshot(charted.conn), last_event_id(airflow)
    page = signed_in(chromium, airflow, "reader")
    frame = follow_list_link(open_page(page, airflow), "REJECTED")
    start = frame.get_by_role("button", name="Start dlq_redrive")
    assert start.is_disabled()  # the list says why, and Airflow would refuse the post
    assert "reader may not trigger dlq_redrive" in frame.locator("p.refusal").inner_text()
    frame.locator('input[name="selection"][value="all"]').check()
    start.evaluate("b => b.disabled = false")
    start.click()
    refusal = frame.locator("ul.refused li")
    refusal.first.wait_for(timeout=30_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dead-letters-reader-refused.png"))
    assert refusal.all_inner_texts() == ["reader may not trigger dlq_redrive (Airflow: Forbidden)"]
    assert "Nothing was triggered." in frame.locator("body").inner_text()
    assert run_ids(airflow) == known and snapshot(charted.conn) == before
    [entry] = audited(airflow, "reader", since)
    assert entry["event"] == "trigger_dag_run" and entry["extra"]["via"] == "/redelivery/dlq/messages/redrive"
    assert entry["extra"]["conf"] == {"group": "billing", "reasons": ["REJECTED"], "dry_run": True}
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
