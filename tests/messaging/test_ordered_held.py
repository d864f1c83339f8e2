"""Held means held (issue 36): a key is held when its head failed (it waits for a retry, or it is a
dead letter that holds the key, on_exhausted halt); a key whose head is in flight is busy. The
operator page lists the held keys, the metric counts them, a halting dead letter says so, and
BLOCKED is a column wherever states are listed."""

from __future__ import annotations

import pytest

from helpers import at
from redelivery.messaging.codec import Message


@pytest.fixture()
def halting(client):
    """Topic ``orders``, group ``billing`` subscribed ordered with on_exhausted halt."""
    client.create_topic("orders")
    client.create_group("billing")
    client.subscribe("billing", "orders", ordered=True, on_exhausted="halt")
    return client


def publish(client, keys: str, clock: float = 0) -> list[int]:
    return client.publish("orders", [Message({"n": i}, key=k) for i, k in enumerate(keys)], at=at(clock))


def the_group(data: dict, name: str = "billing") -> dict:
    [group] = [g for g in data["groups"] if g["name"] == name]
    return group


def test_busy_keys_are_not_held(halting):
    """Four heads in flight, a message BLOCKED behind each, no failure at all: nothing is held
    (issue 36: the page said "4 keys held back behind a failing or dead-lettered message" and
    redelivery_blocked_keys said 4, an alert of noise)."""
    from test_metrics import scrape, value

    from redelivery.airflow.ui.page import page_data, render

    publish(halting, "abcdabcd")
    assert len(halting.receive("billing", "orders", 50, 30, at=at(0))) == 4
    data = page_data(halting.conn)
    group = the_group(data)
    assert (group["held"]["keys"], group["held"]["list"], group["BLOCKED"]) == (0, [], 4)
    html = render(data)
    assert "held back" not in html and "No key is held by a failure" in html
    samples = scrape(halting.conn, at(42))
    assert value(samples, "redelivery_blocked_keys", topic="orders", group="billing") == 0
    assert value(samples, "redelivery_messages", topic="orders", group="billing", state="BLOCKED") == 4


def test_the_page_lists_each_held_key_with_its_head_why_since_when_and_what_waits(halting):
    """Key a's head waits for a retry (two messages behind it), key b's is a dead letter holding
    it (one behind), key c's is in flight (busy: not listed); the metric counts a and b."""
    from test_metrics import scrape, value

    from redelivery.airflow.ui.page import page_data, render

    a1, b1, c1, a2, b2, c2, a3 = publish(halting, "abcabca")
    first = halting.receive("billing", "orders", 50, 30, at=at(0))
    halting.nack("billing", [m for m in first if m.key == "a"], error="timeout", at=at(5))
    halting.reject("billing", [m for m in first if m.key == "b"], error="bad", at=at(7))
    group = the_group(page_data(halting.conn))
    held = group["held"]
    assert held["keys"] == 2 and group["BLOCKED"] == 4
    rows = [(h["topic"], h["key"], h["message_id"], h["why"], h["since"], h["behind"]) for h in held["list"]]
    assert rows == [
        ("orders", "a", a1, "waiting for its retry", at(5), 2),
        ("orders", "b", b1, "dead letter, on_exhausted halt", at(7), 1),
    ]
    html = render(page_data(halting.conn))
    assert "2 keys held by a failure" in html
    assert f"<td class='n'>{b1}</td>" in html and "dead letter, on_exhausted halt" in html
    samples = scrape(halting.conn, at(42))
    assert value(samples, "redelivery_blocked_keys", topic="orders", group="billing") == 2


def test_a_long_key_is_shown_short(halting):
    """A key of any length is held like another; the page shows its start and its length."""
    from redelivery.airflow.ui.page import page_data, render

    long = "k" * 5000
    publish(halting, [long, long])
    halting.nack("billing", halting.receive("billing", "orders", 50, 30, at=at(0)), error="x", at=at(1))
    [row] = the_group(page_data(halting.conn))["held"]["list"]
    assert (row["key"], row["behind"]) == (long, 1)
    html = render(page_data(halting.conn))
    assert long not in html and "(5,000 characters)" in html


def test_a_halting_dead_letter_says_so_in_the_list_and_on_its_page(halting):
    """The dead letters of a halt subscription that hold their key are marked, with how many
    messages wait behind them; a dead letter whose key moved on (redriven and dead again, say)
    is not."""
    from redelivery.airflow.ui.dead_letter_pages import letters_table, message_page, parse_query
    from redelivery.dead_letters import DlqFilter, browse, message

    a1, a2, a3 = publish(halting, "aaa")
    halting.reject("billing", halting.receive("billing", "orders", 50, 30, at=at(0)), error="bad")
    rows, _ = browse(halting.conn, DlqFilter(group="billing"))
    assert [(r["message_id"], r["halting"], r["behind"]) for r in rows] == [(a1, True, 2)]
    html = letters_table(rows, DlqFilter(group="billing"), "/redelivery/dlq/messages")
    assert "holds its key: 2 behind" in html
    letter = message(halting.conn, "billing", a1)
    assert (letter["halting"], letter["behind"]) == (True, 2)
    query = parse_query([("group", "billing")])
    page = message_page(letter, query, "/redelivery/dlq/messages", "/", None)
    assert "It holds its key" in page and "2 messages of the key wait behind it" in page


def test_blocked_is_a_column_wherever_states_are_listed(halting, clean_db, tmp_path):
    """redelivery stats (its header names every count it prints), the page's group table and its
    states chart, the demo's chart."""
    from demo.report import STACK, write_chart
    from helpers import run_cli
    from redelivery.airflow.ui.page import page_data, render

    publish(halting, "aa")
    halting.receive("billing", "orders", 50, 30, at=at(0))
    out = run_cli("stats", database_url=clean_db)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split()[-6:] == ["READY", "INFLIGHT", "WAITING_RETRY", "COMMITTED", "DLQ", "BLOCKED"]
    assert row.split()[2:] == ["0", "1", "0", "0", "0", "1"]
    html = render(page_data(halting.conn))
    assert "<th>BLOCKED</th>" in html and 'data-label="BLOCKED"' in html
    assert "BLOCKED" in STACK
    from datetime import UTC, datetime

    moment = datetime(2026, 1, 2, tzinfo=UTC)
    counts = {"READY": 0, "INFLIGHT": 1, "WAITING_RETRY": 0, "COMMITTED": 0, "DLQ": 0, "BLOCKED": 1}
    path = write_chart(tmp_path / "chart.png", [(moment, {"billing": counts})], [], ["billing"])
    assert path.stat().st_size > 0
