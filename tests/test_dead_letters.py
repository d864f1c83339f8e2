"""Browsing dead letters (redelivery.dead_letters: browse, Cursor, message, export, pretty_json)
on the real database: keyset pages newest first that cover every dead letter once, hold while
others are dead-lettered or redriven, and list exactly what the redrive's filter selects; one
message in full with a bounded body; the plans at any depth. The filter itself, count and select:
tests/test_redrive.py; the pages in HTML: tests/airflow/ui/test_dead_letter_pages.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from helpers import at
from redelivery.client import Message
from redelivery.dead_letters import (
    BODY_PREVIEW_BYTES,
    ERROR_CHARS,
    HEX_PREVIEW_BYTES,
    MAX_MESSAGE_ID,
    Cursor,
    DlqFilter,
    browse,
    count,
    export,
    json_line,
    jsonable,
    message,
    pretty_json,
    select,
)
from redelivery.errors import UnknownGroupError, UnknownTopicError
from redelivery.redrive import RedriveRequest, redrive
from redelivery.store import statements as S

QUIET = {"log": lambda *_: None}


@pytest.fixture()
def dead(client, topic_group):
    """70 dead letters of billing, oldest first: six chunks of 10 orders rejected at 10 s ... 15 s
    (each chunk at one instant: ties), keys k0..k4 in turn, error "schema violation <chunk>";
    then 10 refunds dead-lettered at 100 s (MAX_DELIVERIES_EXCEEDED, "Timeout calling ERP").
    Returns (client, {chunk or "refunds": message ids in id order})."""
    client.create_topic("refunds")
    client.subscribe("billing", "refunds")
    ids = client.publish("orders", [Message({"n": i}, key=f"k{i % 5}") for i in range(60)], at=at(0))
    got = client.receive("billing", "orders", 60, 30, at=at(0))
    assert [m.message_id for m in got] == ids
    for chunk in range(6):
        client.reject("billing", got[chunk * 10 : chunk * 10 + 10], error=f"schema violation {chunk}",
                      at=at(10 + chunk))  # fmt: skip
    client.create_group("billing", max_reconsume_times=0)
    refunds = client.publish("refunds", [{"r": i} for i in range(10)], at=at(0))
    got = client.receive("billing", "refunds", 10, 30, at=at(0))
    client.nack("billing", got, error="Timeout calling ERP", at=at(100))
    client.create_group("billing", max_reconsume_times=None)
    chunks = {chunk: ids[chunk * 10 : chunk * 10 + 10] for chunk in range(6)}
    return client, {**chunks, "refunds": refunds}


def newest_first(ids: dict) -> list[int]:
    """The order the fixture's dead letters must be listed in: latest dead-lettering first, and
    within one instant the highest message id first."""
    order = sorted(ids["refunds"], reverse=True)
    for chunk in range(5, -1, -1):
        order += sorted(ids[chunk], reverse=True)
    return order


def all_pages(conn, request: DlqFilter, limit: int) -> list[list[dict]]:
    pages, after = [], None
    while True:
        rows, after = browse(conn, request, after=after, limit=limit)
        pages.append(rows)
        if after is None:
            return pages
        assert len(pages) < 1000, "the cursor never ended"


def test_pages_are_newest_first_and_cover_every_dead_letter_once(dead):
    client, ids = dead
    pages = all_pages(client.conn, DlqFilter(group="billing"), limit=7)  # pages cut through ties
    listed = [r["message_id"] for page in pages for r in page]
    assert listed == newest_first(ids)
    assert [len(p) for p in pages] == [7] * 10  # 70 rows: the tenth page is full and the last
    first, second = pages[0], pages[1]
    assert {r["topic"] for r in first} == {"refunds"} and first[0]["reason"] == "MAX_DELIVERIES_EXCEEDED"
    assert second[3]["topic"] == "orders" and second[3]["reason"] == "REJECTED"  # 7 + 3 = the 11th row
    assert second[3]["dead_lettered_at"] == at(15) and second[3]["last_error"] == "schema violation 5"
    # one page more than fits: the cursor is None exactly when nothing follows
    rows, after = browse(client.conn, DlqFilter(group="billing"), limit=70)
    assert len(rows) == 70 and after is None
    rows, after = browse(client.conn, DlqFilter(group="billing"), limit=69)
    assert after == Cursor(rows[-1]["dead_lettered_at"], rows[-1]["message_id"])


def test_a_row_holds_what_the_list_shows(dead, database_url):
    client, ids = dead
    # one dead letter of chunk 0 redriven and dead-lettered again, with a long error
    [target] = ids[0][:1]
    redrive(RedriveRequest(group="billing", message_ids=[target], dry_run=False), run_key="r1",
            url=database_url, **QUIET)  # fmt: skip
    [again] = client.receive("billing", "orders", 1, 30, at=at(200))
    client.reject("billing", again, error="x" * 1000 + "<tail>", at=at(201))
    [row], _ = browse(client.conn, DlqFilter(group="billing"), limit=1)
    assert set(row) == {"message_id", "key", "topic", "dead_letter_queue", "reason", "last_error",
                        "error_length", "delivery_count", "reconsume_times", "redrive_count",
                        "dead_lettered_at", "halting", "behind"}  # fmt: skip
    assert (row["halting"], row["behind"]) == (False, None)  # an unordered subscription's
    assert (row["message_id"], row["key"], row["topic"], row["dead_letter_queue"], row["reason"]) == (
        target, "k0", "orders", "%DLQ%billing", "REJECTED")  # fmt: skip
    assert row["last_error"] == "x" * ERROR_CHARS and row["error_length"] == 1006  # shortened, length kept
    assert (row["delivery_count"], row["reconsume_times"], row["redrive_count"]) == (2, 0, 1)
    assert row["dead_lettered_at"] == at(201)


def test_pages_hold_while_others_are_dead_lettered_and_redriven(dead, database_url):
    """Keyset, not OFFSET: after page 1, a new dead letter (newer than every row) and a redrive of
    rows of pages 1 and 3 neither shift page 2 nor repeat a row; redriven rows are gone from the
    pages not read yet, and the new one is on page 1 when the list is opened again."""
    client, ids = dead
    request = DlqFilter(group="billing")
    expected = newest_first(ids)
    page1, after = browse(client.conn, request, limit=10)
    assert [r["message_id"] for r in page1] == expected[:10]
    gone = [expected[0], expected[5], expected[25], expected[27]]  # two of page 1, two of page 3
    redrive(RedriveRequest(group="billing", message_ids=gone, dry_run=False), run_key="r1",
            url=database_url, **QUIET)  # fmt: skip
    [new] = client.publish("orders", [{"late": True}], at=at(300))
    for topic in ("orders", "refunds"):  # the redriven ones are READY again: dead-lettered anew too
        client.reject(
            "billing", client.receive("billing", topic, 10, 30, at=at(300)), error="late", at=at(300)
        )
    rest = []
    while after is not None:
        rows, after = browse(client.conn, request, after=after, limit=10)
        rest += [r["message_id"] for r in rows]
    assert rest == [m for m in expected[10:] if m not in gone]
    reopened, _ = browse(client.conn, request, limit=10)
    assert [r["message_id"] for r in reopened[:5]] == sorted([new, *gone], reverse=True)
    assert {r["dead_lettered_at"] for r in reopened[:5]} == {at(300)}


FILTERS = [
    {},
    {"topic": "refunds"},
    {"topic": "orders"},
    {"reasons": ["REJECTED"]},
    {"reasons": ["MAX_DELIVERIES_EXCEEDED", "NEGATIVE_LEVEL"]},
    {"error_contains": "VIOLATION 3"},  # case-insensitive text
    {"error_contains": "%"},  # a character, never a pattern
    {"dead_lettered_from": at(12), "dead_lettered_to": at(14)},  # [12 s, 14 s): chunks 2 and 3
    {"dead_lettered_to": at(10)},
    {"key": "k3"},
    {"key": "k3", "reasons": ["REJECTED"], "dead_lettered_from": at(11)},
    {"message_ids": [1, 2, 3, 65, 70, 10_000]},
    {"key": "'; DROP TABLE messages; --"},
]


@pytest.mark.parametrize("values", FILTERS, ids=[json.dumps(f, default=str)[:60] for f in FILTERS])
def test_the_list_shows_what_a_redrive_of_the_filter_would_move(dead, database_url, values):
    """One filter for both: every page of a filter together is the set that count and select
    give and that a redrive's dry run matches."""
    client, _ = dead
    request = DlqFilter(group="billing", **values)
    listed = [r["message_id"] for page in all_pages(client.conn, request, limit=4) for r in page]
    selected = [r["message_id"] for r in select(client.conn, request, limit=1000)]
    assert listed == selected[::-1]  # the same rows, the other way round
    assert len(listed) == count(client.conn, request)
    run = redrive(RedriveRequest(**request.model_dump()), run_key="dry", url=database_url, **QUIET)
    assert run["matched"] == len(listed)


def test_the_fixture_gives_each_filter_something_to_tell_apart(dead):
    """The filters above are not vacuous: they select different, non-empty sets (but two)."""
    client, _ = dead
    counts = [count(client.conn, DlqFilter(group="billing", **f)) for f in FILTERS]
    assert counts == [70, 10, 60, 60, 10, 10, 0, 20, 0, 12, 10, 5, 0]


def test_unknown_names_are_refused(dead):
    client, _ = dead
    with pytest.raises(UnknownGroupError):
        browse(client.conn, DlqFilter(group="nobody"))
    with pytest.raises(UnknownTopicError):
        browse(client.conn, DlqFilter(group="billing", topic="nope"))


def test_a_cursor_goes_through_a_url_and_nothing_else_is_one():
    cursor = Cursor(at(12) + timedelta(microseconds=5), 42)
    assert Cursor.parse(cursor.token()) == cursor
    for bad in ("", "x", "_", "42", "2026-03-01T12:00:12+00:00", "2026-03-01T12:00:12_42",  # no zone
                "2026-03-01T12:00:12+00:00_0", f"2026-03-01T12:00:12+00:00_{MAX_MESSAGE_ID + 1}",
                "2026-03-01T12:00:12+00:00_4x", "yesterday_42", "2026-03-01T12:00:12 00:00_42"):  # fmt: skip
        with pytest.raises(ValueError, match="not a page cursor"):
            Cursor.parse(bad)


# ---- one message ---------------------------------------------------------------------------------


def dead_letter(client, body, *, content_type=None, key=None, properties=None, error="bad") -> int:
    [mid] = client.publish(
        "orders", [Message(body, key=key, properties=properties or {}, content_type=content_type)], at=at(0)
    )
    got = [m for m in client.receive("billing", "orders", 100, 30, at=at(0)) if m.message_id == mid]
    client.reject("billing", got, error=error, at=at(1))
    return mid


def test_a_json_body_is_pretty_printed_with_its_numbers_as_written(client, topic_group):
    body = '{"amount": 10.10, "big": 1e400, "zero": -0, "n": 12345678901234567890123, "s": "<b>é"}'
    mid = dead_letter(client, body, content_type="application/json")
    shown = message(client.conn, "billing", mid)
    assert shown["body_text"] == (
        '{\n  "amount": 10.10,\n  "big": 1e400,\n  "zero": -0,\n  "n": 12345678901234567890123,\n'
        '  "s": "<b>é"\n}'
    )
    assert shown["body_hex"] is None and shown["body_size"] == shown["body_shown"] == len(body.encode())


def test_text_and_binary_bodies(client, topic_group):
    text = message(client.conn, "billing", dead_letter(client, "plain <text>\n", content_type="text/plain"))
    assert (text["body_text"], text["body_hex"], text["body_size"]) == ("plain <text>\n", None, 13)
    raw = bytes(range(256)) * 8  # 2 KiB
    binary = message(client.conn, "billing", dead_letter(client, raw))
    assert binary["body_text"] is None and binary["body_size"] == 2048
    assert binary["body_hex"] == raw[:HEX_PREVIEW_BYTES].hex(" ")  # a preview, not the body


def test_a_body_of_megabytes_never_leaves_the_database_whole(client, topic_group):
    big = {"items": ["é" * 100] * 20_000}  # about 4 MB of JSON
    mid = dead_letter(client, big)
    shown = message(client.conn, "billing", mid)
    size = len(json.dumps(big, ensure_ascii=False, separators=(",", ":")).encode())
    assert shown["body_size"] >= size - 100 and shown["body_shown"] == BODY_PREVIEW_BYTES
    assert len(shown["body_text"].encode()) <= BODY_PREVIEW_BYTES + 3  # a cut character, replaced
    assert not shown["body_text"].startswith("{\n")  # a part of JSON is shown as it is stored


def test_undecodable_json_is_shown_as_stored(client, topic_group):
    [mid] = client.publish("orders", [{"n": 1}])
    client.conn.execute(
        "UPDATE messages SET body = convert_to(%s::jsonb::text, 'UTF8') WHERE id = %s",
        ("[" * 3000 + "]" * 3000, mid),
    )
    assert client.receive("billing", "orders", 1, 30) == []  # dead-lettered UNDECODABLE
    shown = message(client.conn, "billing", mid)
    assert shown["reason"] == "UNDECODABLE" and shown["body_text"].startswith("[[[[")


def test_properties_attempts_and_redrives(client, topic_group, database_url):
    """The properties as the last delivery carried them (the user's own, and the retry ones once
    it was retried), each failed delivery, each redrive of it."""
    mid = dead_letter(client, {"a": 1}, key="order-7", properties={"tenant": "<acme>"}, error="first")
    shown = message(client.conn, "billing", mid)
    assert shown["properties"] == {"tenant": "<acme>"}  # rejected at once: never retried
    redrive(RedriveRequest(group="billing", dry_run=False), run_key="cli/r1", triggered_by="ops",
            url=database_url, **QUIET)  # fmt: skip
    [m] = client.receive("billing", "orders", 1, 30, at=at(50))
    client.nack("billing", m, error="second", at=at(51))
    client.conn.execute("UPDATE deliveries SET due_at = %s WHERE message_id = %s", (at(52), mid))
    from redelivery.tiers.run import TierRunRequest, run_tier

    run_tier(TierRunRequest(tier="seconds", window_end=at(70), run_key="t1"), url=database_url)
    [m] = client.receive("billing", "orders", 1, 30, at=at(71))
    assert m.properties["RECONSUMETIMES"] == "1"
    client.reject("billing", m, error="third <script>", at=at(72))
    shown = message(client.conn, "billing", mid)
    assert shown["properties"] == m.properties == {
        "tenant": "<acme>", "REAL_TOPIC": "orders", "ORIGIN_MESSAGE_ID": str(mid),
        "RETRY_TOPIC": "%RETRY%billing", "RECONSUMETIMES": "1",
    }  # fmt: skip
    assert (shown["key"], shown["delivery_count"], shown["reconsume_times"], shown["redrive_count"]) == (
        "order-7", 3, 1, 1)  # fmt: skip
    assert [(a["delivery"], a["outcome"], a["error"]) for a in shown["attempts"]] == [
        (1, "rejected", "first"), (2, "nack", "second"), (3, "rejected", "third <script>"),
    ]  # fmt: skip
    assert [(r["run_key"], r["triggered_by"], r["destination_topic"]) for r in shown["redrives"]] == [
        ("cli/r1", "ops", None)
    ]
    assert shown["last_error"] == "third <script>" and shown["dead_lettered_at"] == at(72)


def test_a_message_that_is_no_dead_letter_of_the_group(client, topic_group, database_url):
    mid = dead_letter(client, {"a": 1})
    client.create_group("other")
    assert message(client.conn, "other", mid) is None  # another group's dead letter
    assert message(client.conn, "billing", mid + 1) is None
    redrive(RedriveRequest(group="billing", dry_run=False), run_key="r", url=database_url, **QUIET)
    assert message(client.conn, "billing", mid) is None  # redriven: no longer a dead letter
    with pytest.raises(UnknownGroupError):
        message(client.conn, "nobody", mid)
    for bad in (0, MAX_MESSAGE_ID + 1):
        with pytest.raises(ValueError, match="out of range"):
            message(client.conn, "billing", bad)


def test_pretty_json_leaves_what_it_cannot_keep_as_it_is():
    assert pretty_json('{"a": 1, "a": 2}') == '{"a": 1, "a": 2}'  # a repeated key
    assert pretty_json("[1, 2") == "[1, 2"
    assert pretty_json('["\\u0000 0"]') == '["\\u0000 0"]'
    assert pretty_json('{"a": [1.50, "x"]}') == '{\n  "a": [\n    1.50,\n    "x"\n  ]\n}'


def test_export_streams_the_rows_dlq_list_prints(dead):
    client, _ = dead
    request = DlqFilter(group="billing", reasons=["REJECTED"])
    streamed = list(export(client.conn, request, limit=25))
    assert all("\n" not in line and line.isascii() for line in streamed)  # JSON Lines
    assert [json.loads(line) for line in streamed] == jsonable(
        select(client.conn, request, limit=25, with_body=True)
    )
    assert len(streamed) == 25 and json.loads(streamed[0])["body"] == {"n": 0}
    with pytest.raises(UnknownGroupError):
        next(export(client.conn, DlqFilter(group="nobody"), limit=1))


#: A JSON body with what a parsed and re-written body would change: integers past 64 bits, a number
#: past float's range (Python writes Infinity, no JSON), 10.10 and -0 as written, a line break
#: between values, and strings holding a long digit string, non-ASCII and line separators that
#: str.splitlines breaks at (U+2028, U+0085).
STORED = (
    '{"id": 123456789012345678901234567891, "x": 1e400, "n": -9223372036854775809,\n'
    '  "amount": 10.10, "zero": -0, "s": "12345678901234567890123 é\u2028\x85😀 \\n"}'
)


def exact(line: str):
    """A line as JSON, every number exact (``Decimal``); Infinity or NaN refused."""

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_float=Decimal, parse_constant=refuse)


def test_a_json_body_is_exported_as_it_is_stored(client, topic_group):
    """The download writes a JSON body's stored text: every value as published."""
    dead_letter(client, STORED, content_type="application/json")
    [line] = export(client.conn, DlqFilter(group="billing"), limit=10)
    assert line.isascii() and len(line.splitlines()) == 1
    assert '"id": 123456789012345678901234567891, "x": 1e400, "n": -9223372036854775809,' in line
    assert exact(line)["body"] == exact(STORED) == {
        "id": 123456789012345678901234567891, "x": Decimal("1e400"), "n": -9223372036854775809,
        "amount": Decimal("10.10"), "zero": 0, "s": "12345678901234567890123 é\u2028\x85😀 \n",
    }  # fmt: skip
    assert exact(line) | {"body": None} == jsonable(select(client.conn, DlqFilter(group="billing"),
                                                           with_body=True))[0] | {"body": None}  # fmt: skip


def raw_row(body: bytes, content_type: str) -> dict:
    """A row as ``DLQ_SELECT`` reads it."""
    at_ = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return {"message_id": 7, "topic": "orders", "dead_letter_queue": "%DLQ%billing", "reason": "REJECTED",
            "last_error": "bad\n\u2028", "delivery_count": 1, "reconsume_times": 0, "dead_lettered_at": at_,
            "first_failure_at": at_, "last_failure_at": at_, "redrive_count": 0, "origin_message_id": 7,
            "key": "k", "body": body, "content_type": content_type, "properties": {"p": "v"},
            "attempts": [{"delivery": 1, "outcome": "rejected"}]}  # fmt: skip


@pytest.mark.parametrize(
    "body,content_type,shown",
    [
        (STORED.encode(), "application/json", exact(STORED)),
        (b"[1,\r\n\t2]", "application/json", [1, 2]),
        (b"\x00\xff", "application/octet-stream", "00ff"),
        ("text é\n".encode(), "text/plain", "text é\n"),
        (b"[" * 3000 + b"]" * 3000, "application/json", "[" * 3000 + "]" * 3000),  # undecodable
        (b'\xef\xbb\xbf{"a": 1}', "application/json", {"a": 1}),  # older than the IS JSON check:
        ('{"a": 1}'.encode("utf-16"), "application/json", {"a": 1}),  # the json module reads these
    ],
)
def test_json_line_writes_a_row_with_its_body_as_stored(body, content_type, shown):
    line = json_line(raw_row(body, content_type))
    assert line.isascii() and len(line.splitlines()) == 1
    row = exact(line)
    assert row.pop("body") == shown
    assert row.pop("body_error", "").startswith("not decodable as application/json") is (len(body) == 6000)
    stored = jsonable([raw_row(body, content_type)])[0]
    assert row == {k: v for k, v in stored.items() if k not in ("body", "content_type")}


# ---- plans ---------------------------------------------------------------------------------------


def plan(conn, statement: str, params: dict) -> dict:
    """The executed plan of ``statement`` (EXPLAIN ANALYZE, JSON), its top node."""
    conn.execute("ANALYZE dlq_messages")
    [[result]] = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchall()
    return result[0]["Plan"]


def nodes(node: dict) -> list[dict]:
    return [node, *[n for child in node.get("Plans", []) for n in nodes(child)]]


@pytest.mark.parametrize("key", [None, "k3"])
def test_a_page_reads_its_rows_from_the_index_at_any_depth(client, topic_group, key):
    """4,000 dead letters: the page deep in the list (its cursor at the 3,000th row) is read from
    the browse index (the key's index with a key) in the page's order, no sort, no other row."""
    client.publish("orders", [Message({"n": i}, key=f"k{i % 5}") for i in range(4000)], at=at(0))
    for n in range(4):
        got = client.receive("billing", "orders", 1000, 30, at=at(0))
        client.reject("billing", got, error="bad", at=at(10 + n))
    request = DlqFilter(group="billing", key=key)
    rows, _ = browse(client.conn, request, limit=3000 if key is None else 600)
    after = rows[-1]
    from redelivery.dead_letters import filter_params

    params = {**filter_params(client.conn, request), "before_at": after["dead_lettered_at"],
              "before_id": after["message_id"], "limit": 51, "error_chars": 200}  # fmt: skip
    top = plan(client.conn, S.DLQ_BROWSE, params)
    scans = [
        n for n in nodes(top) if "Scan" in n["Node Type"] and n.get("Relation Name", "").startswith("%DLQ%")
    ]
    assert [n["Node Type"] for n in scans] == ["Index Scan"], scans
    [scan] = scans
    [definition] = client.conn.execute(
        "SELECT pg_get_indexdef(c.oid) FROM pg_class c WHERE c.relname = %s", (scan["Index Name"],)
    ).fetchone()
    columns = (
        "group_id, key, dead_lettered_at, message_id" if key else "group_id, dead_lettered_at, message_id"
    )
    partial = " WHERE (octet_length(key) <= 2000)" if key else ""  # migration 0016: a key of any length
    assert definition.endswith(f"btree ({columns}){partial}") and scan["Scan Direction"] == "Backward", scan
    assert scan["Actual Rows"] == 51 and scan.get("Rows Removed by Filter", 0) == 0
    assert not [n for n in nodes(top) if n["Node Type"] == "Sort"]
