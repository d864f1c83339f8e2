"""Failures a person can read at a glance (issue 40): each failed delivery keeps its error's class,
top frame, stack and signature; dead letters group by signature (the API, the CLI) and a redrive
takes a signature."""

from __future__ import annotations

import json

import bugs
import pytest
from bugs import BUGS, find_customer, parse_amount, raised, three_bugs_dead

from helpers import at, run_cli
from redelivery.airflow.ui.dead_letter_pages import failed_again
from redelivery.dead_letters import DlqFilter, count, groups, message
from redelivery.redrive import RedriveRequest, redrive
from redelivery.rules.failures import LEASE_EXPIRED_CLASS, describe

pytestmark = pytest.mark.timeout(300)


def signature_gauge(conn) -> dict:
    """The samples of ``redelivery_dlq_signature_messages`` in a scrape: {(group, signature): n}."""
    from prometheus_client.parser import text_string_to_metric_families

    from redelivery.metrics import render

    families = text_string_to_metric_families(render(conn).decode())
    return {
        (s.labels["group"], s.labels["signature"]): s.value
        for family in families
        if family.name == "redelivery_dlq_signature_messages"
        for s in family.samples
    }


def signatures(conn, sql: str, *params) -> list:
    return [row[0] for row in conn.execute(sql, params).fetchall()]


def test_varying_ids_quotes_uuids_and_hex_are_one_signature(client):
    rows = client.conn.execute("""
        SELECT redelivery.error_signature(NULL, m, NULL) FROM unnest(%s::text[]) AS m""", ([
        "order 123 failed: customer 'ab-1' (uuid 6f1c2a9e-3b1d-4c8e-9f0a-1b2c3d4e5f60, ref 0xdeadBEEF)",
        "order 98765 failed:  customer 'zz'  (uuid 00000000-0000-0000-0000-000000000000, ref 0x1)",
        'order 7 failed: customer "x y" (uuid 123e4567-e89b-12d3-a456-426614174000, ref 0x7f)',
    ],)).fetchall()  # fmt: skip
    assert len({r[0] for r in rows}) == 1, rows
    other = client.conn.execute(
        "SELECT redelivery.error_signature(NULL, 'order 1 refunded', NULL),"
        " redelivery.error_signature('builtins.ValueError', 'order 1 failed', NULL),"
        " redelivery.error_signature(NULL, 'order 1 failed', 'shop:charge'),"
        " redelivery.error_signature(NULL, 'can''t find order ''A1''', NULL),"
        " redelivery.error_signature(NULL, 'can''t find order ''B22''', NULL),"
        " redelivery.error_signature(NULL, 'ids 1234567 and 12345678 and abcdef0123', NULL),"
        " redelivery.error_signature(NULL, 'ids 7654321 and 87654321 and 0123abcdef', NULL)"
    ).fetchone()
    assert len(set(other[:3]) | {rows[0][0]}) == 4, "class, frame and words make another signature"
    assert other[3] == other[4], "an apostrophe in a word opens no quote"
    assert other[5] == other[6], "ids of 7 and 8 digits and hex runs are alike"
    long_ones = client.conn.execute(
        "SELECT redelivery.error_signature(NULL, %s, NULL), redelivery.error_signature(NULL, %s, NULL),"
        " redelivery.error_signature(NULL, %s, NULL), redelivery.error_signature(NULL, %s, NULL)",
        (
            "ids " + " ".join(str(i) for i in range(600)) + " then the cause: disk full",
            "ids " + " ".join(str(i * 1000) for i in range(600)) + " then the cause: disk full",
            "bad frame b'\\x00\\x01' from E'peer' at r'x'",
            "bad frame b'\\xff' from E'other' at r'y'",
        ),
    ).fetchone()
    assert long_ones[0] == long_ones[1], "ids of other lengths early in a long message move no cut"
    assert long_ones[2] == long_ones[3], "a prefixed literal (b'', E'', r'') is a quoted value"


def test_an_exception_gives_its_class_the_consumers_frame_and_a_bounded_stack():
    failure = describe(raised(parse_amount, 12))
    assert failure.error_class == "ValueError"
    assert failure.error == "ValueError: invalid literal for int() with base 10: '12.5 EUR'"
    assert failure.frame == f"{bugs.__name__}:parse_amount", (
        "the consumer's frame, not int()'s or a library's"
    )
    assert "parse_amount" in failure.stack and len(failure.stack) <= 4000
    own = describe(raised(bugs.charge, 1))
    assert own.error_class == f"{bugs.__name__}.PaymentDeclined" and own.frame == f"{bugs.__name__}:charge"
    assert describe("timeout").error_class is None and describe(None) is None
    with pytest.raises(ValueError, match="NUL"):
        describe("a\x00b")
    with pytest.raises(ValueError, match="exception"):
        describe(42)
    with pytest.raises(ValueError, match="surrogate"):
        describe("bad \udcff byte")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no attribute after unpickling")


def test_an_exception_that_cannot_be_stored_as_it_is_is_still_recorded(client, topic_group):
    """A broken __str__, a NUL and a lone surrogate in an exception's text (a library's, which the
    consumer cannot change) are written as escapes: the failure is recorded, not refused."""
    odd = [raised(lambda n: (_ for _ in ()).throw(Unprintable()), 0), ValueError("a\x00b \udcff"), KeyError()]
    assert describe(odd[0]).error == "Unprintable: <exception str() failed>"
    client.publish("orders", [{"n": i} for i in range(3)], at=at(0))
    client.reject("billing", client.receive("billing", "orders", 3, 30, at=at(0)), error=odd, at=at(1))
    errors = sorted(g["last_error"] for g in groups(client.conn, DlqFilter(group="billing")))
    assert errors == ["KeyError", "Unprintable: <exception str() failed>", "ValueError: a\\x00b \\udcff"]


def test_three_bugs_through_3000_failures_are_three_signatures(client, topic_group, clean_db):
    """Issue 40's done test, its API, CLI and metric half: 3,000 failures of three bugs group as
    three signatures with the right counts, in the API, the CLI and the metric; a redrive by one
    signature moves only its dead letters."""
    sent = three_bugs_dead(client, clean_db)
    found = groups(client.conn, DlqFilter(group="billing"))
    assert sorted(g["count"] for g in found) == [1000, 1000, 1000]
    assert {g["error_class"] for g in found} == {f"{bugs.__name__}.PaymentDeclined", "KeyError", "ValueError"}
    assert {g["error_frame"] for g in found} == {f"{bugs.__name__}:{b.__name__}" for b in BUGS}
    assert all(g["topics"] == ["orders"] for g in found)
    assert signature_gauge(client.conn) == {("billing", g["signature"]): 1000 for g in found}

    # the history keeps each attempt's signature, the stack of the newest only
    letter = client.conn.execute(
        "SELECT attempts, signature FROM redelivery.dlq_messages WHERE message_id = %s", (sent[0].message_id,)
    ).fetchone()
    attempts, signature = letter
    assert [a["signature"] for a in attempts] == [signature, signature]
    assert "stack" not in attempts[0] and "stack" in attempts[1]
    assert attempts[0]["class"] == f"{bugs.__name__}.PaymentDeclined"

    # the CLI says the same, as JSON and as text
    shown = run_cli("dlq", "groups", "--group", "billing", "--json", database_url=clean_db)
    assert shown.returncode == 0, shown.stderr
    assert {g["signature"]: g["count"] for g in json.loads(shown.stdout)} == {
        g["signature"]: 1000 for g in found
    }
    text = run_cli("dlq", "groups", "--group", "billing", database_url=clean_db)
    assert len(text.stdout.strip().splitlines()) == 3 and "PaymentDeclined" in text.stdout

    # a redrive by one signature moves only its dead letters
    chosen = next(g for g in found if g["error_class"] == "KeyError")["signature"]
    result = redrive(
        RedriveRequest(group="billing", signature=chosen, dry_run=False), run_key="by-sig", url=clean_db
    )
    assert result["moved"] == 1000
    assert count(client.conn, DlqFilter(group="billing")) == 2000
    assert count(client.conn, DlqFilter(group="billing", signature=chosen)) == 0

    refused = run_cli("dlq", "count", "--group", "billing", "--signature", "not-hex", database_url=clean_db)
    assert (
        refused.returncode != 0
        and "signature" in refused.stderr
        and len(refused.stderr.strip().splitlines()) == 1
    )


def test_a_redriven_failure_that_fails_again_says_so(client, topic_group, clean_db):
    """Issue 40.3: dead letters redriven by one signature that die again count as failed again in
    their group, and each says whether it is the failure it had before the redrive."""
    three_bugs_dead(client, clean_db)
    everything = DlqFilter(group="billing")
    chosen = next(g for g in groups(client.conn, everything) if g["error_class"] == "KeyError")["signature"]
    redrive(RedriveRequest(group="billing", signature=chosen, dry_run=False), run_key="by-sig", url=clean_db)
    # they fail again: half the same way (the fix did not hold), half another way
    back = client.receive("billing", "orders", 3000, 30)
    assert len(back) == 1000
    client.reject("billing", back[:500], error=[raised(find_customer, i) for i in range(500)])
    client.reject("billing", back[500:], error=[raised(parse_amount, i) for i in range(500)])
    again_by_class = {
        g["error_class"]: (g["count"], g["failed_again"]) for g in groups(client.conn, everything)
    }
    assert again_by_class == {
        "KeyError": (500, 500),
        "ValueError": (1500, 500),
        f"{bugs.__name__}.PaymentDeclined": (1000, 0),
    }
    same, other = (message(client.conn, "billing", m.message_id) for m in (back[0], back[500]))
    assert same["signature_before_redrive"] == same["signature"] == chosen
    assert other["signature_before_redrive"] == chosen != other["signature"]
    assert "the fix did not hold" in failed_again(same) and "another failure" in failed_again(other)


def test_an_ended_lease_has_a_signature_of_its_own(client, topic_group, clean_db):
    from redelivery.tiers.run import TierRunRequest, run_tier

    client.create_group("billing", max_reconsume_times=0)
    client.publish("orders", [{"n": i} for i in range(5)], at=at(0))
    client.receive("billing", "orders", 5, 30, at=at(0))
    run_tier(
        TierRunRequest(tier="seconds", window_end=at(600), run_key="t"), url=clean_db, config=client.config
    )
    [group] = groups(client.conn, DlqFilter(group="billing"))
    assert (group["count"], group["error_class"]) == (5, LEASE_EXPIRED_CLASS)


def test_a_text_error_has_the_signature_of_its_text(client, topic_group, clean_db):
    """A text error has no class nor frame: its signature is its normalised text's (the rows dead
    before migration 0020 get the same: tests/store/test_upgrades.py)."""
    client.publish("orders", [{"n": i} for i in range(4)], at=at(0))
    got = client.receive("billing", "orders", 4, 30, at=at(0))
    client.reject("billing", got[:2], error=["timeout after 30 s on node 7", "timeout after 31 s on node 9"])
    client.reject("billing", got[2:], error="schema v2 missing field")
    found = groups(client.conn, DlqFilter(group="billing"))
    assert sorted(g["count"] for g in found) == [2, 2]
    expected = signatures(
        client.conn,
        "SELECT redelivery.error_signature(NULL, e, NULL) FROM unnest(%s::text[]) AS e",
        ["timeout after 1 s on node 1", "schema v3 missing field"],
    )
    assert sorted(g["signature"] for g in found) == sorted(expected)


def test_the_gauge_shows_ten_signatures_a_group_and_the_rest_as_other(client, topic_group):
    """Bounded cardinality: 12 distinct failures (words differ, not numbers) are 10 series and
    'other' with the 2 least frequent."""
    from redelivery.metrics import SIGNATURES_PER_GROUP

    words = [f"stage {chr(ord('a') + i)} broke" for i in range(12)]
    errors = [w for i, w in enumerate(words) for _ in range(14 - i)]  # a: 14 ... l: 3
    client.publish("orders", [{"n": i} for i in range(len(errors))], at=at(0))
    client.reject("billing", client.receive("billing", "orders", len(errors), 30, at=at(0)), error=errors)
    gauge = signature_gauge(client.conn)
    assert len(gauge) == SIGNATURES_PER_GROUP + 1 == 11
    assert gauge[("billing", "other")] == 4 + 3 and sum(gauge.values()) == len(errors)


def test_failed_again_claims_the_same_failure_only_when_both_signatures_are_known():
    letter = {"redrive_count": 2, "signature": None, "signature_before_redrive": None}
    assert "no signature in its history" in failed_again(letter)
    assert "no signature" in failed_again({**letter, "signature": "0123456789ab"})
    assert failed_again({**letter, "redrive_count": 0}) == ""
