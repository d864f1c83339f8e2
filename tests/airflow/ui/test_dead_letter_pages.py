"""The dead letters themselves on the operator's page (redelivery.airflow.ui.dead_letter_pages) on
the real database, without Airflow: the address is the redrive's filter and reads back as the same
filter, every refused name or value is a line of its own, the selection's conf passes the
dlq_redrive DAG's Params, and nothing user-written reaches the HTML unescaped. In the Airflow UI,
with roles: tests/airflow/ui/test_dead_letters_ui.py."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from urllib.parse import parse_qsl, urlsplit

import pytest

from helpers import at
from redelivery.airflow.params import conf_problems
from redelivery.airflow.ui.dead_letter_pages import (
    SELECTION_FIELDS,
    BadQuery,
    list_page,
    message_page,
    parse_query,
    posted_conf,
    query_string,
    redrive_conf,
)
from redelivery.client import Message
from redelivery.dead_letters import Cursor, DlqFilter, browse, message

EVIL = "</td></pre><script>alert('x')</script>\"'&<img src=x onerror=alert(1)>"


def pairs(query: str) -> list[tuple[str, str]]:
    return parse_qsl(query, keep_blank_values=True)


def test_a_filter_goes_through_the_address_and_back():
    request = DlqFilter(
        group="billing", topic="orders", reasons=["REJECTED", "LEASE_EXPIRED"], dead_lettered_from=at(10),
        dead_lettered_to=at(20), error_contains="a&b=c %d é", key="k 1/2?#", message_ids=[3, 1, 2],
    )  # fmt: skip
    query = query_string(request, after=Cursor(at(15), 7).token())
    parsed = parse_query(pairs(query), ("after",))
    assert parsed.filter == request and parsed.after == Cursor(at(15), 7)
    assert parse_query(pairs("group=billing&topic=&key=&reasons=")).filter == DlqFilter(group="billing")
    spaced = parse_query(pairs("group=billing&message_ids=1, 2 3&message_ids=4"))
    assert spaced.filter.message_ids == [1, 2, 3, 4]
    naive = parse_query(pairs("group=billing&dead_lettered_from=2026-03-01T12:00:10"))
    assert naive.filter.dead_lettered_from == at(10)  # UTC when no zone is given, as the filter says


@pytest.mark.parametrize(
    "query,lines",
    [
        ("group=billing&reason=REJECTED", ["reason: unknown parameter (did you mean 'reasons'?)"]),
        ("group=billing&topic=a&topic=b", ["topic: given 2 times, takes one value"]),
        ("topic=orders", ["group: "]),
        ("group=bad name!", ["group: "]),
        ("group=billing&reasons=SOMETIMES", ["reasons.0: "]),
        ("group=billing&dead_lettered_from=yesterday", ["dead_lettered_from: "]),
        (
            "group=billing&message_ids=1,two,-3",
            ["message_ids: 'two' is not a message id", "message_ids: '-3' is not a message id"],
        ),  # fmt: skip
        ("group=billing&message_ids=9223372036854775808", ["message_ids.0: "]),
        ("group=billing&after=2026-01-01_5", ["after: not a page cursor"]),
        ("group=billing&key=a%00b", ["key: "]),
        ("group=billing&error_contains=" + "x" * 1001, ["error_contains: "]),
        (
            "group=billing&dead_lettered_from=2026-02-01T00:00:00Z&dead_lettered_to=2026-01-01T00:00:00Z",
            ["filter: dead_lettered_from (2026-02-01T00:00:00+00:00) is after dead_lettered_to"],
        ),  # fmt: skip
        (
            "group=bad name!&reasons=NO&after=x&zzz=1",
            ["zzz: unknown parameter", "after: ", "group: ", "reasons.0: "],
        ),
    ],
)
def test_every_refused_name_or_value_is_a_line_of_its_own(query, lines):
    with pytest.raises(BadQuery) as refused:
        parse_query(pairs(query), ("after",))
    problems = refused.value.problems
    assert len(problems) == len(lines), problems
    for line in lines:
        assert any(p.startswith(line) for p in problems), (line, problems)
    assert all("\n" not in p and len(p) < 300 for p in problems)


def test_the_selection_is_the_ticked_ids_under_the_filter_or_all_of_it(dagbag):
    params = dagbag.get_dag("dlq_redrive").params
    base = "group=billing&reasons=REJECTED&dead_lettered_from=2026-03-01T12:00:10Z&key=k1"
    ticked = parse_query(pairs(base + "&selected=5&selected=7&selection=selected&run=real"), SELECTION_FIELDS)
    conf = redrive_conf(ticked)
    assert conf == {"group": "billing", "reasons": ["REJECTED"], "dead_lettered_from": "2026-03-01T12:00:10Z",
                    "key": "k1", "message_ids": [5, 7], "dry_run": False}  # fmt: skip
    assert conf_problems(params, conf) == []  # the DAG takes it as it is
    everything = redrive_conf(parse_query(pairs(base + "&selected=5&selection=all"), SELECTION_FIELDS))
    assert everything == {k: v for k, v in conf.items() if k != "message_ids"} | {"dry_run": True}
    assert conf_problems(params, everything) == []
    with pytest.raises(BadQuery, match="no message is ticked"):
        redrive_conf(parse_query(pairs(base + "&selection=selected"), SELECTION_FIELDS))
    for bad, line in (("&selection=some", "selection: 'some'"), ("&run=maybe", "run: 'maybe'")):
        with pytest.raises(BadQuery, match=re.escape(line)):
            parse_query(pairs(base + "&selected=1" + bad), SELECTION_FIELDS)
    # a post refused before its values are read is audited with what it asked for
    assert posted_conf(pairs(base + "&selected=5&run=real")) == {**conf, "message_ids": [5]}
    assert posted_conf(pairs("group=bad name!&selected=x")) == {"group": "bad name!", "selected": "x"}


class Tags(HTMLParser):
    """Every start tag of a page with its attributes, and its text, as a browser would parse it."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def assert_nothing_runs(html: str) -> Tags:
    """The page's only script is its own (TOP_LINKS), no element has an event handler, and the
    hostile text is there as text."""
    tags = Tags(html)
    assert [t for t, _ in tags.tags].count("script") == 1
    assert not [a for _, attrs in tags.tags for a in attrs if a.startswith("on")]
    assert [t for t, _ in tags.tags if t == "img"] == []
    return tags


@pytest.fixture()
def hostile(client, topic_group):
    """Three dead letters of billing whose key, error, body and properties are hostile HTML."""
    body = f'{{"x": {json.dumps(EVIL)}, "n": 1.50}}'
    json_body = Message(body, content_type="application/json", key=EVIL, properties={EVIL: EVIL})
    text_body = Message(EVIL, content_type="text/plain", key="plain")
    client.publish(
        "orders", [json_body, text_body, Message(EVIL.encode() + b"\x00\xff", key="binary")], at=at(0)
    )
    client.reject("billing", client.receive("billing", "orders", 3, 30, at=at(0)), error=EVIL * 10, at=at(1))
    return client


def test_the_list_escapes_everything_and_links_its_pages(hostile):
    request = DlqFilter(group="billing", error_contains="<script>")
    rows, after = browse(hostile.conn, request, limit=2)
    query = parse_query(pairs(query_string(request)), ("after",))
    html = list_page(query, rows, after, "/redelivery/dlq/messages", "/redelivery/dlq", None)
    tags = assert_nothing_runs(html)
    text = "".join(tags.text)
    assert EVIL in text and text.count(EVIL[:20]) >= 3  # the key and the shortened errors, as text
    links = [a["href"] for t, a in tags.tags if t == "a" and "href" in a]
    [next_page] = [h for h in links if "after=" in h]
    resumed = parse_query(pairs(urlsplit(next_page).query), ("after",))
    assert resumed.filter == request and resumed.after == after  # the next page keeps the filter
    details = [h for h in links if re.match(r"/redelivery/dlq/messages/\d+\?", h)]
    assert len(details) == 2 and all(parse_query(pairs(urlsplit(h).query)).filter == request for h in details)
    boxes = [a["value"] for t, a in tags.tags if t == "input" and a.get("name") == "selected"]
    assert boxes == [str(r["message_id"]) for r in rows]
    hidden = {(a["name"], a["value"]) for t, a in tags.tags if t == "input" and a.get("type") == "hidden"}
    assert hidden == {("group", "billing"), ("error_contains", "<script>")}  # the filter, as posted
    buttons = [a for t, a in tags.tags if t == "button"]
    assert [b.get("formaction") for b in buttons[1:]] == ["/redelivery/dlq/messages/redrive",
                                                          "/redelivery/dlq/messages.jsonl"]  # fmt: skip
    assert not any("disabled" in b for b in buttons)


def test_a_user_who_may_not_trigger_gets_the_buttons_off(hostile):
    query = parse_query(pairs("group=billing"))
    rows, after = browse(hostile.conn, query.filter)
    html = list_page(
        query, rows, after, "/b", "/o", "reader may not trigger dlq_redrive (Airflow: Forbidden)"
    )
    tags = Tags(html)
    start = [a for t, a in tags.tags if t == "button" and a.get("formaction") == "/b/redrive"]
    assert len(start) == 1 and "disabled" in start[0]
    assert "reader may not trigger dlq_redrive" in "".join(tags.text)


def test_a_message_page_shows_everything_escaped(hostile):
    ids = [r["message_id"] for r in browse(hostile.conn, DlqFilter(group="billing"))[0]]
    query = parse_query(pairs("group=billing&key=x"))
    for mid in ids:
        letter = message(hostile.conn, "billing", mid)
        html = message_page(letter, query, "/redelivery/dlq/messages", "/", None)
        tags = assert_nothing_runs(html)
        text = "".join(tags.text)
        assert EVIL * 10 in text  # the whole last error
        if letter["key"] == "binary":
            assert (EVIL.encode() + b"\x00\xff")[:8].hex(" ") in text and "as hex" in text
        else:
            assert EVIL in text  # the body: JSON pretty-printed or text, as text
        if letter["key"] == EVIL:
            assert '"n": 1.50' in text and text.count(EVIL) >= 4  # key, body, property name and value
        back = [a["href"] for t, a in tags.tags if t == "a" and a.get("href", "").startswith("/redelivery")]
        assert back == ["/redelivery/dlq/messages?group=billing&key=x"]
        selected = [a["value"] for t, a in tags.tags if t == "input" and a.get("name") == "selected"]
        assert selected == [str(mid)]  # its actions act on it alone
