"""Every named statement parses and plans on the real database (EXPLAIN, nothing executed), so a
statement that no longer fits the schema fails here first."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest
from psycopg.types.json import Jsonb

from redelivery.store import db
from redelivery.store import statements as S

#: A plausible value for every parameter name the statements use (None where NULL is a variant).
SAMPLES = {
    "receipts": '{"1": ["1:1"], "2": ["1:1"]}', "errors": '{"1": {"error": "e", "class": "E"}, "2": null}',
    "count_stale": True, "ordered": False, "on_exhausted": "continue",
    "all": True, "at": None, "batch": "b-1", "bucket_ms": 100, "count": 3, "counts": [1, 2],
    "dead_lettered_at": None, "delay": None, "dest": None, "dest_name": None, "dlq_id": 1, "dry_run": False,
    "error": None, "filter": Jsonb({}), "force_dead_letter": False, "fractions": [0.5],
    "dead_lettered_from": None, "dead_lettered_to": None, "error_contains": None, "message_ids": None,
    "signature": None, "top": 10, "buckets": 24, "signatures": ["0123456789ab"],
    "group": None, "group_ids": [1], "high": 10, "holding_only": False,
    "ids": [1, 2], "key": 1,
    "invisible_duration": 30.0, "max_messages": 10, "scan": 100, "batch_size": 10, "runs": 5,
    "lease_error": "lease expired", "level": None, "levels": [1, 2], "limit": 10, "low": 1,
    "max_reconsume_times": None, "missing": [1], "name": "orders", "names": ["%DLQ%billing"],
    "namespace": 7_424_002, "outcome": "nack", "p_cap": [None], "p_delays": ["{10.0,30.0}"], "p_dlq": [1],
    "p_group": [1], "p_jitter": [0.0], "p_levels": ["{1,2}"], "p_max": [16], "p_topic": [1],
    "reason": "REJECTED", "reasons": None, "reset": True, "room": 5, "run": 1, "run_key": "r-1",
    "sample": None, "matched": None, "held_by_backlog_cap": None,
    "staging": "b-1", "status": "success", "summary": None, "tier": "seconds",
    "topic_id": 1, "topic_ids": [1, 1], "receipt_topics": [1, 1], "group_id": 1, "triggered_by": None,
    "window_end": "2026-03-01T12:00:10+00:00",
    "window_start": None, "fingerprint": "3:00000000000000ff", "seconds": 1.5, "rows": 3, "part": 0,
    "stage_run": "api", "level_count": 16, "keys": [None], "bodies": [b"{}"],
    "content_types": ["application/json"], "properties": ["{}"],
    "settle_run": "r", "acked": 1, "retried": 0, "dead_lettered": 0, "stale": 0,
    "lateness_le": [0.5, 1.0], "bucket_bounds": [0.5, 1.0], "bucket_counts": [1, 0, 0], "observed_sum": 0.25,
    "total_groups": [1], "total_promoted": [2], "total_dead_lettered": [0], "total_stale": [1],
    "topic": "orders", "watermark": None, "id_watermark": None, "previous_id": None,
    "horizon": "2026-03-01T12:00:10+00:00", "settle": 300.0,
    "asset_uri": "redelivery://orders/billing", "previous": None,
    "before_at": None, "before_id": None, "error_chars": 200, "body_bytes": 65536,
    "message_id": 1, "span": 3600.0, "partition_name": "messages_20260301t120000",
    "starts_at": "2026-03-01T12:00:00+00:00", "ends_at": "2026-03-01T13:00:00+00:00", "from_beginning": False,
    "statement_timeout": "0", "lock_timeout": "0", "floor": 0, "seq": 0, "data": b"",
    "p_rule": ['{"exclude": ["ValueError"]}'], "rule": '{"include": ["0123456789ab"]}',
    "succeeded": 3, "window_seconds": 60.0, "min_attempts": 10, "failure_ratio": 0.15,
    "open_seconds": 60.0, "max_open_seconds": 14400.0, "probe_size": 5, "state": "held",
    "changed_by": "cli:test", "note": None,
    "max_generations": 3, "generation_wait": 300.0, "standing_id": None,
    "specs": [Jsonb({"after": "every"})], "spec": Jsonb({"after": "every"}), "id": 1, "lease": 130.0,
    "every": 300.0, "claimed": "2026-03-01T12:00:10+00:00", "more_left": False, "ran": True,
}  # fmt: skip
# EXPLAIN takes neither COPY, nor SHOW, nor CREATE TABLE (which the tests of publish run), nor LOCK
NOT_EXPLAINABLE = {
    "COPY_MESSAGES",
    "COPY_REPEATED_CONTENT",
    "CREATE_REPEATED_CONTENT",
    "DATA_DIRECTORY",
    "LOCK_DLQ_MESSAGES",
}


@pytest.mark.parametrize("name", sorted(set(S.ALL) - NOT_EXPLAINABLE))
def test_statement_plans(name, database_url):
    text = S.ALL[name]
    used = set(re.findall(r"%\((\w+)\)[sb]", text))
    assert used <= set(SAMPLES), f"add samples for {sorted(used - set(SAMPLES))}"
    with db.connect(database_url) as conn:
        if "publish_repeated" in text:  # the session's temporary table it reads
            conn.execute(S.CREATE_REPEATED_CONTENT)
        plan = conn.execute("EXPLAIN " + text, {k: SAMPLES[k] for k in used}).fetchall()
    assert plan


def test_every_statement_is_named_after_its_constant():
    assert all(text.startswith(f"/* redelivery:{name} */") for name, text in S.ALL.items())
    assert len(S.ALL) > 50


@pytest.mark.parametrize("name", ["RECEIVE", "RECEIVE_ORDERED"])
def test_a_receive_returns_the_columns_of_the_leased_row(database_url, name):
    """``leasing._leased`` hands a receive's rows over as tuples of RECEIVE_COLUMNS, the fields of
    ``ReceivedMessage`` read from a row, in their order (both receives: ``rules.leased_row``)."""
    from redelivery.rules.leased_row import CALL_FIELDS, RECEIVE_COLUMNS, ReceivedMessage

    assert [f.name for f in fields(ReceivedMessage) if f.name not in CALL_FIELDS] == list(RECEIVE_COLUMNS)
    statement = S.ALL[name]
    with db.connect(database_url) as conn:
        used = set(re.findall(r"%\((\w+)\)[sb]", statement))
        cursor = conn.execute(statement, {k: SAMPLES[k] for k in used})
        assert tuple(column.name for column in cursor.description) == RECEIVE_COLUMNS
        conn.rollback()
