"""The "Dead letters" page's content (redelivery.airflow.ui.page, .charts) on the real database,
without Airflow: the charts show the state the Client and the tier job made, exactly; every text
is escaped; the page's statements can use their indexes; each group's links to its dead-letter
list are addresses the list reads back as the filter they name. The page in the Airflow UI, the
way from its links to a redrive, and the refusals: tests/airflow/ui/test_operator_ui.py."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC
from html import escape, unescape
from urllib.parse import parse_qsl, quote, urlsplit

import pytest

from helpers import at, page_state
from redelivery.airflow.ui.charts import Bar, Series, columns, horizontal_bars, lines, ticks
from redelivery.airflow.ui.dead_letter_pages import parse_query
from redelivery.airflow.ui.page import page_data, render
from redelivery.dead_letters import DlqFilter
from redelivery.store import statements as S

SVG = "{http://www.w3.org/2000/svg}"


#: What helpers.page_state leaves: per group, live states; billing's retries per level; the tier's runs.
STATES = {
    "billing": {"READY": 5, "INFLIGHT": 7, "WAITING_RETRY": 10, "DLQ": 10, "BLOCKED": 0},
    "audit": {"READY": 4, "INFLIGHT": 0, "WAITING_RETRY": 0, "DLQ": 0, "BLOCKED": 0},
}
WAITING = {1: 6, 3: 4}


@pytest.fixture()
def state(client, topic_group, database_url):
    page_state(client, database_url)
    return client


def charts(html: str) -> dict[str, ET.Element]:
    """Every inline SVG of the page by id, parsed as XML (the SVG must be well formed)."""
    found = {}
    for text in re.findall(r"<svg .*?</svg>", html, re.S):
        svg = ET.fromstring(text)
        found[svg.get("id")] = svg
    return found


def bars(svg: ET.Element) -> dict[str, tuple[str, str, list[str]]]:
    """{data-label: (data-value, title, [texts])} of each bar or point of a chart."""
    return {
        g.get("data-label"): (
            g.get("data-value"),
            g.find(f"{SVG}title").text,
            [t.text for t in g.iter(f"{SVG}text")],
        )
        for g in svg.iter(f"{SVG}g")
    }


def test_page_data_is_the_state(state):
    data = page_data(state.conn)
    shown = {
        g["name"]: {k: g[k] for k in ("READY", "INFLIGHT", "WAITING_RETRY", "DLQ", "BLOCKED")}
        for g in data["groups"]
    }
    assert shown == STATES
    assert [g["name"] for g in data["groups"]] == ["billing", "audit"]  # most dead letters first
    assert {g["name"]: g["waiting"] for g in data["groups"]} == {"billing": WAITING, "audit": {}}
    runs = data["lateness"]["seconds"]
    assert [(r[0], r[1], r[2], r[3]) for r in runs] == [
        (at(13), 4, 2.0, 2.0),
        (at(56), 4, 5.0, 5.0),
        (at(60), 0, None, None),
    ]
    [billing, audit] = data["groups"]
    assert (billing["queues"], billing["reasons"]) == ([("%DLQ%billing", 10)], [("REJECTED", 10)])
    [failure] = billing["failures"]
    [expected] = state.conn.execute("SELECT error_signature(NULL, 'schema violation', NULL)").fetchone()
    assert (failure["signature"], failure["count"], failure["error"]) == (expected, 10, "schema violation")
    assert (failure["first"], failure["last"], failure["error_class"]) == (at(101), at(101), None)
    assert (billing["oldest"], billing["newest"]) == (at(101), at(101)) and audit["oldest"] is None
    assert data["matched"] == 2 and data["tier_runs"]["seconds"][1:5] == ("t3", at(60), "success", False)


def test_a_failure_links_to_its_dead_letters_by_signature(state):
    """Issue 40: the group's failures table links each signature to the list filtered by it."""
    html = render(page_data(state.conn))
    [(signature, href)] = re.findall(
        r'<a class="failure" data-signature="([0-9a-f]{12})" href="([^"]+)"', html
    )
    request = parse_query(parse_qsl(urlsplit(unescape(href)).query)).filter
    assert (request.group, request.signature) == ("billing", signature)
    assert "schema violation" in html.split('<div class="failures">', 1)[1]


def test_the_charts_show_the_numbers(state):
    html = render(page_data(state.conn))
    svgs = charts(html)
    [signature] = state.conn.execute("SELECT DISTINCT signature FROM dlq_messages").fetchone()
    assert set(svgs) == {
        "states-billing",
        "levels-billing",
        "states-audit",
        "levels-audit",
        "lateness-seconds",
        f"failure-billing-{signature}",  # its dead letters over time
    }
    spans = [
        int(r.get("data-value")) for r in svgs[f"failure-billing-{signature}"].iter() if r.get("data-value")
    ]
    assert len(spans) == 24 and sum(spans) == 10
    for group, expected in STATES.items():
        shown = bars(svgs[f"states-{group}"])
        assert {label: int(v) for label, (v, _, _) in shown.items()} == expected
        for label, (value, title, texts) in shown.items():
            assert title == f"{label}: {value} messages" and texts == [
                label,
                value,
            ]  # labelled with its count
    levels = bars(svgs["levels-billing"])
    assert len(levels) == 16  # every level of the table, zeros too
    assert {k: int(v) for k, (v, _, _) in levels.items() if v != "0"} == {"level 1": 6, "level 3": 4}
    assert levels["level 1"][1] == "level 1 (10s): 6 retries waiting" and "6" in levels["level 1"][2]
    assert levels["level 3"][1] == "level 3 (1m): 4 retries waiting"
    assert bars(svgs["levels-audit"])["level 1"][0] == "0"
    points = bars(svgs["lateness-seconds"])
    assert {k: (v, title) for k, (v, title, _) in points.items()} == {
        "p50 2026-03-01 12:00:13": ("2.0", "2026-03-01 12:00:13: p50 2 s"),
        "p99 2026-03-01 12:00:13": ("2.0", "2026-03-01 12:00:13: p99 2 s"),
        "p50 2026-03-01 12:00:56": ("5.0", "2026-03-01 12:00:56: p50 5 s"),
        "p99 2026-03-01 12:00:56": ("5.0", "2026-03-01 12:00:56: p99 5 s"),
    }  # the run that promoted nothing has no point
    assert "Group billing: 10 dead letters" in html and "Group audit: no dead letters" in html
    assert list(list_links(html)) == ["billing"]  # only a group with dead letters gets the links
    assert "dlq/redrive" not in html and '<form class="redrive"' not in html  # the old form is gone


def test_the_axes_are_linear_from_zero_with_round_ticks():
    assert ticks(10, whole=True) == [0, 2, 4, 6, 8, 10]
    assert ticks(7, whole=True) == [0, 2, 4, 6, 8]
    assert ticks(3, whole=True) == [0, 1, 2, 3]
    assert ticks(0) == [0, 1]
    assert ticks(5.0) == [0, 1, 2, 3, 4, 5]
    assert ticks(0.37) == [0, 0.1, 0.2, 0.3, 0.4]
    assert ticks(123_456, whole=True) == [0, 50_000, 100_000, 150_000]
    svg = ET.fromstring(horizontal_bars("c", "t", [Bar("a", 10, "red"), Bar("b", 5, "blue")], "messages"))
    widths = {g.get("data-label"): float(g.find(f"{SVG}rect").get("width")) for g in svg.iter(f"{SVG}g")}
    assert widths["a"] == pytest.approx(2 * widths["b"])  # linear: twice the count, twice the bar


def test_every_text_is_escaped():
    evil = "<script>alert(1)</script>&\"'"
    out = [
        horizontal_bars(evil, evil, [Bar(evil, 1, evil)], evil, {"group": evil}),
        columns(evil, evil, [Bar(evil, 1, evil, evil, evil)], evil, {"group": evil}),
        lines(evil, evil, [evil, evil], [Series(evil, evil, [1.0, None])], evil, {"tier": evil}),
    ]
    for svg in out:
        assert "<script>" not in svg
        parsed = ET.fromstring(svg)  # well formed: nothing broke out of an attribute or a text
        assert parsed.find(f"{SVG}title").text == evil


def test_a_group_name_on_the_page_is_escaped(client, topic_group):
    data = page_data(client.conn)
    group = {"id": 1, "name": "a&b", "READY": 1, "INFLIGHT": 0, "WAITING_RETRY": 0, "DLQ": 0, "BLOCKED": 0}
    held = {"keys": 0, "list": [], "since": None}
    data["groups"], data["matched"] = (
        [{**group, "oldest": None, "newest": None, "waiting": {}, "held": held}],
        1,
    )
    data["redrives"] = [("<b>run</b>", "g", None, True, "success", 1, 0, None, None, None)]
    html = render(data)
    assert "a&amp;b" in html and "a&b" not in html.replace("a&amp;b", "")
    assert "<b>run</b>" not in html and "&lt;b&gt;run&lt;/b&gt;" in html


@pytest.mark.parametrize(
    "name",
    [
        "RECENT_TIER_LATENESS",
        "PAGE_GROUPS",
        "PAGE_WAITING_PER_LEVEL",
        "PAGE_DLQ_QUEUES",
        "PAGE_DLQ_REASONS",
        "PAGE_DLQ_TOP_FAILURES",
        "PAGE_TIER_RUNS",
        "PAGE_WAITING_AT_LEVELS",
    ],
)
def test_the_page_statements_can_use_their_indexes(state, name):
    """Like the metrics: each live state through its partial index, the dead letters through a
    narrow index, a tier's latest runs through tier_runs_window; never every delivery."""
    state.conn.execute("BEGIN")
    state.conn.execute("SET LOCAL enable_seqscan = off")
    values = {
        "runs": 20,
        "name": "",
        "limit": 200,
        "ids": [1, 2],
        "levels": [1, 2],
        "at": None,
        "error_chars": 9,
    }
    plan = "\n".join(r[0] for r in state.conn.execute("EXPLAIN " + S.ALL[name], values))
    state.conn.execute("ROLLBACK")
    assert not re.search(r"Seq Scan on (deliveries|dlq_messages|tier_runs)\b", plan), plan


def test_an_empty_store_renders(client):
    html = render(page_data(client.conn))
    assert "No messages and no dead letters." in html and not charts(html)


def test_a_refusal_is_one_line_naming_what_failed():
    """Airflow's Params refusal (a JSON schema error, many lines, the value quoted) as the form's
    answer shows it: its first line, the failed keyword, at most 300 characters."""
    from airflow.sdk import Param

    from redelivery.airflow.ui.app import one_line

    cases = [
        (
            Param(None, type=["null", "string"], maxLength=1000),
            "x" * 5000,
            "is too long ('maxLength' failed)",
        ),
        (
            Param([], type="array", items={"type": "string", "enum": ["A"]}),
            ["B"],
            "is not one of ['A'] ('enum' failed)",
        ),
    ]
    for param, value, end in cases:
        with pytest.raises(Exception) as refused:
            param.resolve(value)
        text = one_line(f"Invalid input for param p: {refused.value}")
        assert "\n" not in text and len(text) <= 300 and text.endswith(end), text
        assert text.startswith("Invalid input for param p: ")


def list_links(html: str) -> dict[str, list[tuple[str, str, DlqFilter]]]:
    """Per group, its links to the dead-letter list in page order: (text, href, the filter the list
    reads from the href)."""
    found = {}
    for group, inner in re.findall(r'<p class="browse-links" data-group="([^"]+)">(.*?)</p>', html, re.S):
        links = re.findall(r'<a [^>]*href="([^"]+)"[^>]*>(.*?)</a>', inner)
        found[unescape(group)] = [
            (unescape(text), unescape(href), parse_query(parse_qsl(urlsplit(unescape(href)).query)).filter)
            for href, text in links
        ]
    return found


def test_the_links_offer_undecodable(client, topic_group):
    """A group whose dead letters are UNDECODABLE (a body Python cannot decode) links to them, to be
    inspected and redriven from the list."""
    [mid] = client.publish("orders", [{"n": 1}])
    client.conn.execute(
        "UPDATE messages SET body = convert_to(%s::jsonb::text, 'UTF8') WHERE id = %s",
        ("[" * 3000 + "]" * 3000, mid),
    )
    assert client.receive("billing", "orders", 1, 30) == []  # dead-lettered UNDECODABLE
    html = render(page_data(client.conn))
    [(every, _, _), (text, href, request)] = list_links(html)["billing"]
    assert (every, text) == ("1 dead letter", "UNDECODABLE (1)")
    assert href == "dlq/messages?group=billing&reasons=UNDECODABLE"  # relative: in the UI's frame
    assert request == DlqFilter(group="billing", reasons=["UNDECODABLE"])


# ---- issue 17: every live group, sorted, filtered, capped; one number format; links; words ------


@pytest.fixture()
def groups(state, database_url):
    """page_state, then topic events with groups zeta (12 dead letters: REJECTED), alpha (10: 8
    REJECTED, 2 NEGATIVE_LEVEL), inflight-only (3 in flight, no dead letter) and idle (everything
    acknowledged: nothing live, not on the page)."""
    client = state
    client.create_topic("events")
    for name in ("zeta", "alpha", "inflight-only", "idle"):
        client.create_group(name)
        client.subscribe(name, "events")
    client.publish("events", [{"n": i} for i in range(12)], at=at(200))
    client.reject("zeta", client.receive("zeta", "events", 12, 30, at=at(200)), error="bad", at=at(201))
    got = client.receive("alpha", "events", 10, 30, at=at(200))
    client.reject("alpha", got[:8], error="bad", at=at(201))
    client.reconsume_later("alpha", got[8:], level=-1, at=at(201))
    client.receive("inflight-only", "events", 3, 30, at=at(200))
    client.ack("idle", client.receive("idle", "events", 12, 30, at=at(200)))
    client.conn.execute("DELETE FROM deliveries WHERE state = 'READY' AND topic_id ="
                        " (SELECT id FROM topics WHERE name = 'events')")  # fmt: skip
    return client


def headings(html: str) -> list[str]:
    """The groups' section headings, in page order."""
    return [unescape(h) for h in re.findall(r"<h2 id=\"group-[^\"]*\">(.*?)</h2>", html)]


def visible(html: str) -> str:
    """The page's text as a reader sees it (style, scripts, tags and attribute values left out)."""
    html = re.sub(r"<(style|script)\b.*?</\1>", " ", html, flags=re.S)
    return unescape(re.sub(r"<[^>]*>", " ", html))


def test_every_group_with_live_messages_or_dead_letters_most_dead_letters_first(groups):
    html = render(page_data(groups.conn))
    assert headings(html) == [
        "Group zeta: 12 dead letters",
        "Group alpha: 10 dead letters",
        "Group billing: 10 dead letters",
        "Group audit: no dead letters",
        "Group inflight-only: no dead letters",
    ]  # idle has nothing live: not there


def test_the_group_filter_is_a_case_insensitive_substring_passed_as_a_value(groups):
    def shown(text):
        return [
            h.split(":")[0].removeprefix("Group ") for h in headings(render(page_data(groups.conn, text)))
        ]

    assert shown("BILL") == ["billing"]
    assert shown("l") == ["alpha", "billing", "inflight-only"]
    for text in ("%", "_", "'; DROP TABLE consumer_groups; --", "a\x00b", "x" * 500):
        assert shown(text) == [], text
    html = render(page_data(groups.conn, "<b>&"))
    assert "No group's name contains" in html
    [form] = re.findall(r'<form class="filter" method="get".*?</form>', html, re.S)
    assert 'name="group" value="&lt;b&gt;&amp;"' in form  # the filter is kept, escaped, in the form


def test_a_long_list_is_capped_saying_how_many_more(groups):
    html = render(page_data(groups.conn, "", limit=2))
    assert [h.split(":")[0] for h in headings(html)] == ["Group zeta", "Group alpha"]
    assert "2 of 5 groups shown, 3 more" in visible(html)
    from redelivery.airflow.ui.page import GROUP_LIMIT

    assert GROUP_LIMIT == 200


def test_numbers_have_thousands_separators_everywhere(client, topic_group):
    client.publish("orders", [{"n": i} for i in range(1005)], at=at(0))
    client.reject("billing", client.receive("billing", "orders", 1005, 30, at=at(0)), error="bad", at=at(1))
    html = render(page_data(client.conn))
    text = visible(html)
    assert "Group billing: 1,005 dead letters" in text
    assert "1005" not in text  # headings, overview, tables and charts alike
    assert text.count("1,005") >= 5  # heading, overview, DLQ table, reasons, errors, charts
    svg = charts(html)["states-billing"]
    assert bars(svg)["DLQ"][:2] == ("1005", "DLQ: 1,005 messages")


def test_run_ids_link_to_their_airflow_runs_and_booleans_are_words(state, database_url):
    from redelivery.redrive import RedriveRequest, redrive
    from redelivery.tiers.run import TierRunRequest, run_tier

    quiet = {"url": database_url, "log": lambda *_: None}
    airflow_run = "manual__2026-03-01T12:00:00+00:00"
    redrive(RedriveRequest(group="billing"), run_key=f"dlq_redrive/{airflow_run}", **quiet)
    redrive(RedriveRequest(group="billing", dry_run=False, max_messages=1), run_key="cli/2026-03-01", **quiet)
    tier_run = "scheduled__2026-03-01T12:01:00+00:00"
    run_tier(
        TierRunRequest(tier="minutes", window_end=at(70), run_key=f"redelivery_tier_minutes/{tier_run}/2"),
        url=database_url,
    )
    html = render(page_data(state.conn), ui_root="/ui/")
    quoted = quote(airflow_run, safe="")
    assert (
        f'<a href="/ui/dags/dlq_redrive/runs/{quoted}" data-top>dlq_redrive/{escape(airflow_run)}</a>' in html
    )
    tier_link = f'href="/ui/dags/redelivery_tier_minutes/runs/{quote(tier_run, safe="")}"'
    assert tier_link in html
    assert "<td>cli/2026-03-01</td>" in html and "<td>t3</td>" in html  # CLI and test keys: no link
    [redrives] = re.findall(r"<h2>Latest redrives</h2>.*?</table>", html, re.S)
    assert "True" not in redrives and "False" not in redrives
    assert "<td>dry run</td>" in redrives and "<td>real</td>" in redrives
    [tiers] = re.findall(r"<h2>Latest tier runs</h2>.*?</table>", html, re.S)
    assert "<td>real</td>" in tiers and "True" not in tiers and "False" not in tiers


def test_the_links_offer_only_the_reasons_the_group_has(groups):
    """Each group with dead letters: all of them, then each reason it has, most first, with its
    count; every link's address is the list's own (it reads back as the filter the link names)."""
    links = list_links(render(page_data(groups.conn)))
    assert {g: [text for text, _, _ in found] for g, found in links.items()} == {
        "zeta": ["all 12 dead letters", "REJECTED (12)"],
        "alpha": ["all 10 dead letters", "REJECTED (8)", "NEGATIVE_LEVEL (2)"],  # most dead letters first
        "billing": ["all 10 dead letters", "REJECTED (10)"],
    }
    assert [(href, request) for _, href, request in links["alpha"]] == [
        ("dlq/messages?group=alpha", DlqFilter(group="alpha")),
        ("dlq/messages?group=alpha&reasons=REJECTED", DlqFilter(group="alpha", reasons=["REJECTED"])),
        (
            "dlq/messages?group=alpha&reasons=NEGATIVE_LEVEL",
            DlqFilter(group="alpha", reasons=["NEGATIVE_LEVEL"]),
        ),
    ]


def test_a_name_the_list_refuses_gets_no_link(client, topic_group):
    """A group row older than the naming rule (the schema's check is NOT VALID for old rows): its
    counts as text, escaped, no link the list would refuse, and the page still renders."""
    data = page_data(client.conn)
    group = {"id": 1, "name": "a&b <i>", "READY": 0, "INFLIGHT": 0, "WAITING_RETRY": 0, "DLQ": 3}
    data["groups"], data["matched"] = (
        [{**group, "oldest": None, "newest": None, "waiting": {}, "queues": [], "failures": [],
          "reasons": [("REJECTED", 3)], "BLOCKED": 0, "held": {"keys": 0, "list": [], "since": None}}],
        1,
    )  # fmt: skip
    html = render(data)
    [links] = re.findall(r'<p class="browse-links" data-group="a&amp;b &lt;i&gt;">(.*?)</p>', html)
    assert links == "Browse and redrive: all 3 dead letters · REJECTED (3)" and "<i>" not in html


def test_a_paused_tier_is_shown_at_the_top(state):
    from redelivery.airflow.ui.page import PauseEvent

    data = page_data(state.conn, paused_tiers=["seconds", "half_hours"])
    html = render(data, paused={"seconds": PauseEvent(at(500), "admin", "the REST API"), "half_hours": None})
    banners = re.findall(r'<div class="paused" role="alert" data-tier="([^"]+)">(.*?)</div>', html, re.S)
    assert [tier for tier, _ in banners] == ["seconds", "half_hours"]  # the config's order
    assert html.index('class="paused"') < html.index("<h2")  # at the top
    seconds, half_hours = (visible(text) for _, text in banners)
    assert "Tier seconds is paused in Airflow" in seconds and "redelivery_tier_seconds" in seconds
    assert "delay levels 1 (10s) and 2 (30s) are not promoted" in seconds
    assert "6 retries wait at them, 6 of them due" in seconds  # billing's level-1 retries
    assert "paused since 2026-03-01 12:08:20 UTC by admin through the REST API" in seconds
    assert "delay levels 13 (20m) and 14 (30m) are not promoted" in half_hours
    assert "no retry waits at them" in half_hours
    assert "no pause of it is in Airflow's audit log and no run of it is recorded" in half_hours
    finished = state.conn.execute("SELECT max(finished_at) FROM tier_runs WHERE tier = 'seconds'").fetchone()[
        0
    ]
    html = render(page_data(state.conn, paused_tiers=["seconds"]), paused={"seconds": None})
    when = finished.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"no pause of it is in Airflow's audit log; its last run finished at {when}" in visible(html)
    assert 'class="paused"' not in render(page_data(state.conn))


def test_a_bulk_pause_counts_for_the_dags_its_patterns_matched():
    """``PATCH /api/v2/dags`` writes no DAG id in the audit log, only its query: the page counts it
    for a tier's DAG when the query's patterns matched that DAG, as Airflow 3.3 matches them."""
    from redelivery.airflow.ui.page import bulk_covers

    dag = "redelivery_tier_seconds"
    assert bulk_covers({"dag_id_pattern": "~"}, dag)
    assert bulk_covers({"dag_id_pattern": "TIER_sec"}, dag)  # ILIKE '%term%'
    assert bulk_covers({"dag_id_pattern": "nothing|tier_s"}, dag)
    assert bulk_covers({"dag_id_pattern": "redelivery%seconds"}, dag)
    assert not bulk_covers({"dag_id_pattern": "tier_minutes"}, dag)
    assert bulk_covers({"dag_id_prefix_pattern": "redelivery_tier_"}, dag)
    assert not bulk_covers({"dag_id_prefix_pattern": "tier"}, dag)
    assert not bulk_covers({"dag_id_pattern": "~", "dag_id_prefix_pattern": "other"}, dag)
    assert not bulk_covers({"tags": "tier"}, dag)  # no pattern: Airflow patches no DAG


def test_the_outage_parts_escape_every_text(client, topic_group):
    """A breaker's note and who changed it, a standing redrive's stop reason: as text, never HTML."""
    from redelivery.airflow.ui.outage import held_banners, outage_data, outage_sections
    from redelivery.rules.standing import StandingRedrive
    from redelivery.standing import add, set_state

    client.open_breaker("orders", "billing", by="<b>ops</b>", note="<script>alert(1)</script>")
    add(client.conn, StandingRedrive(name="s1", group="billing"), "ops")
    set_state(client.conn, "s1", "<i>ops</i>", "<img src=x>")
    data = outage_data(client.conn)
    html = "".join(held_banners(data, "/")) + outage_sections(data, "/")
    assert "<script>" not in html and "<img" not in html and "<b>ops</b>" not in html and "<i>ops" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;img src=x&gt;" in html
