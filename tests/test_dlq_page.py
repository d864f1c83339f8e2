"""The "Dead letters" page's content (redelivery.airflow.dlq_page, .charts) on the real database,
without Airflow: the charts show the state the Client and the tier job made, exactly; every text
is escaped; the page's statements can use their indexes. The page in the Airflow UI, its form and
its refusals: tests/test_operator_ui.py."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from helpers import at, page_state
from redelivery import statements as S
from redelivery.airflow.charts import Bar, Series, columns, horizontal_bars, lines, ticks
from redelivery.airflow.dlq_page import page_data, render

SVG = "{http://www.w3.org/2000/svg}"


#: What helpers.page_state leaves: per group, live states; billing's retries per level; the tier's runs.
STATES = {
    "billing": {"READY": 5, "INFLIGHT": 7, "WAITING_RETRY": 10, "DLQ": 10},
    "audit": {"READY": 4, "INFLIGHT": 0, "WAITING_RETRY": 0, "DLQ": 0},
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
    assert {g: {s: n for s, n in c.items()} for g, c in data["states"].items()} == {
        "billing": STATES["billing"],
        "audit": {"READY": 4},  # a state without deliveries has no row
    }
    assert data["waiting"] == {"billing": WAITING}
    runs = data["lateness"]["seconds"]
    assert [(r[0], r[1], r[2], r[3]) for r in runs] == [
        (at(13), 4, 2.0, 2.0),
        (at(56), 4, 5.0, 5.0),
        (at(60), 0, None, None),
    ]
    assert [(g["group"], g["count"]) for g in data["groups"]] == [("billing", 10)]


def test_the_charts_show_the_numbers(state):
    html = render(page_data(state.conn))
    svgs = charts(html)
    assert set(svgs) == {
        "states-billing",
        "levels-billing",
        "states-audit",
        "levels-audit",
        "lateness-seconds",
    }
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
    assert html.count('<form class="redrive"') == 1  # only a group with dead letters gets the form


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
    data = {
        "groups": [],
        "states": {"a&b": {"READY": 1}},
        "waiting": {},
        "lateness": {},
        "tiers": [],
        "redrives": [],
    }
    data["redrives"] = [("<b>run</b>", "g", None, True, "success", 1, 0, None)]
    html = render(data)
    assert "a&amp;b" in html and "a&b" not in html.replace("a&amp;b", "")
    assert "<b>run</b>" not in html and "&lt;b&gt;run&lt;/b&gt;" in html


@pytest.mark.parametrize("name", ["GROUP_STATE_COUNTS", "GROUP_WAITING_PER_LEVEL", "RECENT_TIER_LATENESS"])
def test_the_page_statements_can_use_their_indexes(state, name):
    """Like the metrics: each live state through its partial index, the dead letters through a
    narrow index, a tier's latest runs through tier_runs_window; never every delivery."""
    state.conn.execute("BEGIN")
    state.conn.execute("SET LOCAL enable_seqscan = off")
    plan = "\n".join(
        r[0]
        for r in state.conn.execute("EXPLAIN " + S.ALL[name], {"n": 20} if "%(n)s" in S.ALL[name] else None)
    )
    state.conn.execute("ROLLBACK")
    assert not re.search(r"Seq Scan on (deliveries|dlq_messages|tier_runs)\b", plan), plan


def test_an_empty_store_renders(client):
    html = render(page_data(client.conn))
    assert "No messages and no dead letters." in html and not charts(html)


def test_a_refusal_is_one_line_naming_what_failed():
    """Airflow's Params refusal (a JSON schema error, many lines, the value quoted) as the form's
    answer shows it: its first line, the failed keyword, at most 300 characters."""
    from airflow.sdk import Param

    from redelivery.airflow.ui import one_line

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


def test_the_dry_run_form_offers_undecodable(client, topic_group):
    """A group whose dead letters are UNDECODABLE (a body Python cannot decode) can dry-run them."""
    [mid] = client.publish("orders", [{"n": 1}])
    client.conn.execute(
        "UPDATE messages SET body = convert_to(%s::jsonb::text, 'UTF8') WHERE id = %s",
        ("[" * 3000 + "]" * 3000, mid),
    )
    assert client.receive("billing", "orders", 1, 30) == []  # dead-lettered UNDECODABLE
    html = render(page_data(client.conn))
    [form] = re.findall(r'<form class="redrive".*?</form>', html, re.S)
    assert '<option value="UNDECODABLE">UNDECODABLE (in this group)</option>' in form
