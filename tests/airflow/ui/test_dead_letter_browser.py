"""The dead letters themselves in the operator's page (issue 21), end to end in a real Airflow and
headless Chromium: browse and filter a group's list (the address is the filter), open a dead letter
whose every field is hostile, select and redrive (dry run, real run: the page's only way to
trigger dlq_redrive since issue 39.3, its checks and audit), download the selection; who may do
what."""

from __future__ import annotations

import json
import re
import time
from html import unescape
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from airflow_browser import (
    ARTIFACTS,
    BROWSER_MARKS,
    api,
    audited,
    dlq_state,
    last_event_id,
    run_ids,
    signed_in,
    trigger_logs,
    wait_for_run,
)
from helpers import at, run_cli, snapshot
from redelivery.client import Message

pytestmark = BROWSER_MARKS


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


def test_three_bugs_are_three_failures_on_the_page_each_opening_its_dead_letters(
    airflow, browser, client, topic_group, database_url
):
    """Issue 40's done test, its page half: 3,000 dead letters of three bugs are three failures in
    the group's table (class, count, a sparkline), and a failure's link opens the list of its dead
    letters only."""
    from bugs import three_bugs_dead

    three_bugs_dead(client, database_url)
    browser.goto(f"{airflow}/plugin/dead-letters", wait_until="networkidle")
    frame = browser.frame_locator("iframe").first
    rows = frame.locator("div.failures tr:has(a.failure)")
    rows.first.wait_for(timeout=20_000)
    texts = rows.all_inner_texts()
    assert len(texts) == 3 and all("\t1,000\t" in t for t in texts), texts
    assert sorted(t.split("\t")[1] for t in texts) == ["KeyError", "ValueError", "bugs.PaymentDeclined"]
    bars = frame.locator("div.failures svg.sparkline rect").evaluate_all(
        "bars => bars.map(b => Number(b.dataset.value))"
    )
    assert sum(bars) == 3000  # every dead letter in one span of each sparkline
    ARTIFACTS.mkdir(exist_ok=True)  # the group's section (README shows it: docs/dead-letters-failures.png)
    frame.locator("section.group").first.screenshot(path=str(ARTIFACTS / "dead-letters-failures.png"))
    key_error = frame.locator("div.failures tr:has(a.failure)", has_text="KeyError")
    signature = key_error.locator("a.failure").inner_text()
    key_error.locator("a.failure").click()
    frame.locator("tr[data-message-id]").first.wait_for(timeout=20_000)
    assert f"signature={signature}" in framed_url(browser)
    shown = frame.locator("tr[data-message-id]").all_inner_texts()
    assert len(shown) == 50 and all("KeyError" in row for row in shown)
