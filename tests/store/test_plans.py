"""The hot statements keep their plans whatever the statistics of a churning table say (issue 29).

A queue's delivery rows churn: the table is empty after a drain (and autovacuum analyzes it so),
full during a backlog, and full of dead rows between two vacuums. Each hot statement is captured
with its real parameters (and the session settings it ran with) while the client, a tier run and a
redrive do their work on 500-message batches, then planned (``EXPLAIN``, nothing executed) under
four statistics states of ``deliveries``, the log's partition and the DLQ table: analyzed while
empty (dead rows left), analyzed with a million rows, never analyzed with dead rows, and analyzed
empty with a million rows come since. No plan may read those tables with a sequential scan (its
cost is the table's size, dead rows included, not the batch's), nor join the receipts in a nested
loop whose inner side is their ``unnest`` (quadratic in the batch: the plan the issue found,
249,500 rows removed by the join filter for 500 receipts). And each statement is run (EXPLAIN
ANALYZE, rolled back): no scan of those tables may read more than a few times the rows the
statement needs (issue 39: an index condition on the topic alone, its partition hashed, passed
a check of node types and conditions).
"""

from __future__ import annotations

import json
import re

import psycopg
import pytest

from helpers import at, configured
from redelivery.client import Message, Outcome
from redelivery.redrive import RedriveRequest, redrive
from redelivery.store import log
from redelivery.tiers.run import TierRunRequest, run_tier

pytestmark = pytest.mark.timeout(300)

#: The statements a pipeline runs for every batch (a small publish, receive and every answer), for
#: every window of a tier (lease expiry, promotion, dead-lettering), and for every batch of a redrive.
HOT = {
    "RECEIVE", "ACK", "FAIL_RETRY", "FAIL_DEAD_LETTER", "EXTEND_LEASE",
    "EXPIRE_LEASES_RETRY", "EXPIRE_LEASES_DEAD_LETTER", "PROMOTE", "PROMOTE_CAPPED", "DEAD_LETTER_OVER_MAX",
    "REDRIVE_MOVE_BATCH", "RECEIVE_ORDERED", "PAST_OFFSET", "PUBLISH_SMALL_BATCH",
}  # fmt: skip
#: The planner settings a statement runs with (what the product sets, read as it runs).
SETTINGS = ("enable_seqscan", "enable_nestloop", "enable_hashjoin", "enable_mergejoin", "enable_bitmapscan")
BATCH = 500
MILLION = 1_000_000


class Captured:
    """Every hot statement the product ran, with its parameters and planner settings; ``prepared``,
    those it let psycopg prepare (sent without ``prepare=False``): after five runs on a connection,
    PostgreSQL may keep a plan made for any parameters (a generic plan), which must be as good."""

    def __init__(self):
        self.runs: dict[str, tuple] = {}
        self.prepared: set[str] = set()

    def install(self, monkeypatch) -> None:
        original = psycopg.Cursor.execute
        captured = self

        def execute(cursor, query, params=None, **kwargs):
            text = query if isinstance(query, str) else query.as_string(cursor.connection)
            name = text.removeprefix("/* redelivery:").split(" */", 1)[0] if text.startswith("/*") else None
            if name in HOT and params is not None:
                with psycopg.ClientCursor(cursor.connection) as reader:
                    shown = original(
                        reader, "SELECT " + ", ".join(f"current_setting('{s}')" for s in SETTINGS)
                    )
                    settings = dict(zip(SETTINGS, shown.fetchone(), strict=True))
                captured.runs.setdefault(name, (text, dict(params), settings))
                if kwargs.get("prepare") is not False:
                    captured.prepared.add(name)
            return original(cursor, query, params, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, "execute", execute)


def work(client, url: str, captured: Captured, monkeypatch) -> None:
    """A pipeline's work in batches of 500 (and one small publish): receive, ack, nack, reject,
    extend, settle; a tier run that expires leases, promotes retries (of a capped subscription
    too) and dead-letters those past a lowered max; a receive of the promoted retries; a receive
    of an ordered subscription (its keys' first messages handed out, the rest BLOCKED); a
    redrive."""
    configured(client, {"topic": "orders", "group": "capped", "max_ready_backlog": 100_000})
    client.create_topic("orders")
    for group in ("billing", "capped"):
        client.create_group(group)
        client.subscribe(group, "orders")
    client.create_group("sequence")
    client.subscribe("sequence", "orders", ordered=True)
    log.ensure_partition(client.conn, at(0), 3600)
    client.publish("orders", [Message({"n": i}, key=f"k{i % 50}") for i in range(3 * BATCH)], at=at(0))
    captured.install(monkeypatch)
    client.publish("orders", [Message({"n": -1}, key="k0")], at=at(0))  # a small batch: one statement
    got = client.receive("billing", "orders", BATCH, 30, at=at(0))
    client.ack("billing", got[:100])
    client.nack("billing", got[100:200], error="later", at=at(1))
    client.reject("billing", got[200:250], error="bad", at=at(1))
    client.extend_lease("billing", got[250:350], 60, at=at(2))
    outcomes = [Outcome(m, "ack") for m in got[350:400]] + [Outcome(m, "retry") for m in got[400:450]]
    client.settle("billing", outcomes, at=at(3))
    capped = client.receive("capped", "orders", BATCH, 30, at=at(0))
    client.nack("capped", capped, error="later", at=at(1))
    client.create_group("billing", max_reconsume_times=0)  # the retries of billing are now past it
    run_tier(
        TierRunRequest(tier="seconds", window_end=at(600), run_key="plans"), url=url, config=client.config
    )
    client.create_group("billing", max_reconsume_times=None)
    client.receive("capped", "orders", BATCH, 30, at=at(600))
    client.ack("sequence", client.receive("sequence", "orders", BATCH, 30, at=at(600)))
    redrive(RedriveRequest(group="billing", dry_run=False), run_key="plans", url=url, log=lambda *_: None)
    monkeypatch.undo()


# ---- statistics states -----------------------------------------------------------------------------

_DEAD_DELIVERIES = """
    INSERT INTO deliveries (topic_id, group_id, message_id, published_at, state, delivery_count,
                            invisible_until)
    SELECT t.id, g.id, 1000000000 + i, %(at)s, 'INFLIGHT', 1, %(at)s
    FROM generate_series(1, %(n)s) i, topics t, consumer_groups g
    WHERE t.name = 'orders' AND g.name = 'audit'"""
_DEAD_MESSAGES = """
    INSERT INTO messages (topic_id, id, body, content_type, published_at)
    SELECT t.id, 1000000000 + i, '{}', 'application/json', %(at)s
    FROM generate_series(1, %(n)s) i, topics t WHERE t.name = 'orders'"""
_DEAD_LETTERS = """
    INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, body, content_type,
                              properties, published_at, reason, delivery_count, reconsume_times, attempts,
                              redrive_count)
    SELECT q.id, g.id, 1000000000 + i, t.id, 1000000000 + i, '{}', 'application/json', '{}',
           %(at)s, 'REJECTED', 1, 0, '[]', 0
    FROM generate_series(1, %(n)s) i, consumer_groups g, topics t,
         (SELECT id FROM dead_letter_queues WHERE table_created_at IS NOT NULL LIMIT 1) q
    WHERE g.name = 'audit' AND t.name = 'orders'"""
#: Rows of each table that the state adds (and removes, for dead rows), where they are made.
_FILLS = (
    ("deliveries", _DEAD_DELIVERIES, "DELETE FROM deliveries WHERE message_id > 1000000000"),
    ("messages", _DEAD_MESSAGES, "DELETE FROM messages WHERE id > 1000000000"),
    ("dlq_messages", _DEAD_LETTERS, "DELETE FROM dlq_messages WHERE message_id > 1000000000"),
)


def tables(conn) -> list[str]:
    """The tables whose statistics the states set: deliveries, the log's partitions, DLQ tables."""
    rows = conn.execute("""
        SELECT 'redelivery.deliveries' UNION ALL
        SELECT format('%I.%I', n.nspname, c.relname)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname IN ('redelivery_log', 'redelivery_dlq') AND c.relkind = 'r'""")
    return [r[0] for r in rows]


def set_state(conn, state: str) -> None:
    """``empty``: many rows made and deleted, then analyzed (autovacuum's view after a drain);
    ``million``: a million more rows, analyzed; ``never``: emptied (TRUNCATE leaves the statistics
    of a table never analyzed), then rows made and deleted; ``burst``: ``empty``, then a million
    rows more that no ANALYZE saw (a backlog that came after a drain: the plan expects few rows, a
    scan that reads the topic's whole partition finds a million). Autovacuum is kept off meanwhile."""
    n = MILLION if state == "million" else 200_000
    for table in tables(conn):
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    if state == "never":
        conn.execute("TRUNCATE deliveries, messages, dlq_messages")
    for _, fill, empty in _FILLS:
        conn.execute(fill, {"n": n, "at": at(0)})
        if state != "million":
            conn.execute(empty)
    if state != "never":
        for table in tables(conn):
            conn.execute(f"ANALYZE {table}")
    if state == "burst":
        for _, fill, _ in _FILLS:
            conn.execute(fill, {"n": MILLION, "at": at(0)})


# ---- what a plan may not do -----------------------------------------------------------------------


#: Scans that read a whole table or index: their cost is its size, dead rows included.
_WHOLE = {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan"}


def scans_of_churning_tables(plan: dict) -> list[str]:
    """Whole scans of deliveries, the log's partitions or DLQ tables in ``plan`` (EXPLAIN's JSON,
    VERBOSE): a sequential scan, or an index scan without an index condition; and nested loops
    whose inner side is the receipts' unnest (alias ``i``)."""
    found = []
    stack = [plan]
    while stack:
        node = stack.pop()
        children = node.get("Plans", [])
        churning = node.get("Relation Name") == "deliveries" or node.get("Schema") in (
            "redelivery_log", "redelivery_dlq",
        )  # fmt: skip
        if churning and node["Node Type"] in _WHOLE and not _index_condition(node):
            index = f" by {node['Index Name']}" if "Index Name" in node else ""
            found.append(f"{node['Node Type']}{index} of all {node.get('Schema')}.{node['Relation Name']}"
                         f" ({node.get('Filter', 'no filter')})")  # fmt: skip
        if node["Node Type"] == "Nested Loop" and len(children) == 2:
            inner = children[1]
            while inner["Node Type"] == "Materialize":
                inner = inner["Plans"][0]
            if inner["Node Type"] == "Function Scan" and inner.get("Alias") == "i":
                found.append("Nested Loop over the receipts' unnest")
        stack.extend(children)
    return found


def _index_condition(node: dict) -> bool:
    """Whether a scan reaches its rows through an index condition (a bitmap heap scan through the
    bitmap index scans under it)."""
    if node["Node Type"] == "Bitmap Heap Scan":
        return all(_index_condition(child) for child in node.get("Plans", []))
    return "Index Cond" in node


#: A scan of a churning table may read at most this many times the rows its statement needs.
READ_FACTOR = 4
#: Statements known to read far more than they need in a statistics state (found by the read check,
#: not fixed yet), by state: the lease expiry of a tier run's range, when ``deliveries`` was
#: analyzed empty and a million expired leases of another group came after, reads all of them by
#: the index on ``invisible_until`` (its index condition the window end alone) to find those of its
#: range. The test requires them to be still found, so that a fix removes them here.
KNOWN_OVERREADS = {"burst": ("EXPIRE_LEASES_DEAD_LETTER", "EXPIRE_LEASES_RETRY")}


def _churning(node: dict) -> bool:
    return node.get("Relation Name") == "deliveries" or node.get("Schema") in (
        "redelivery_log",
        "redelivery_dlq",
    )


def _nodes(plan: dict):
    stack = [plan]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", []))


def rows_read(node: dict) -> int:
    """The rows a scan node read (EXPLAIN ANALYZE's JSON): those it returned, those its filter and
    its index recheck removed, over all its loops (EXPLAIN gives each per loop)."""
    per_loop = sum(
        node.get(k, 0) for k in ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Index Recheck")
    )
    return round(per_loop * node.get("Actual Loops", 1))


def rows_needed(plan: dict, params: dict) -> int:
    """The rows a statement needs (EXPLAIN ANALYZE's JSON): the most of the rows it returns, the
    rows each of its writes takes, the rows its parameters ask for (a batch, a receipt per id, an
    ordered receive's ``scan``, a tier run's range of ids), and a batch."""
    writes = [
        round(child["Actual Rows"] * child.get("Actual Loops", 1))
        for node in _nodes(plan)
        if node["Node Type"] == "ModifyTable"
        for child in node.get("Plans", [])[:1]
    ]
    asked = [params[k] for k in ("max_messages", "scan") if isinstance(params.get(k), int)]
    asked += [len(v) for v in params.values() if isinstance(v, list)]
    if isinstance(params.get("low"), int) and isinstance(params.get("high"), int):
        asked.append(params["high"] - params["low"])  # a tier run's range of message ids
    return max([BATCH, round(plan["Actual Rows"]), *writes, *asked])


def scans_reading_too_much(plan: dict, params: dict) -> list[str]:
    """Scans of deliveries, the log's partitions or DLQ tables in ``plan`` (EXPLAIN ANALYZE's JSON,
    VERBOSE) that read more than READ_FACTOR times the rows the statement needs: a hash of a whole
    partition reached by its topic, a filter that throws most of what an index gave away."""
    needed = rows_needed(plan, params)
    return [
        f"{node['Node Type']} of {node.get('Schema')}.{node['Relation Name']} read {rows_read(node):,} rows"
        f" for {needed:,} ({node.get('Index Cond') or node.get('Filter') or 'no condition'})"
        for node in _nodes(plan)
        if _churning(node) and "Scan" in node["Node Type"] and rows_read(node) > READ_FACTOR * needed
    ]


def plan_problems(conn, captured: Captured, analyze: bool = False) -> dict[str, list[str]]:
    """What each captured statement's plan does wrong: whole scans and loops over the receipts;
    with ``analyze``, also scans that read far more rows than the statement needs (the statement
    is run, with EXPLAIN ANALYZE, and rolled back). The generic plans of the statements the product
    lets psycopg prepare too (``NAME (generic plan)``)."""
    problems = {}
    explain = "EXPLAIN (ANALYZE, FORMAT JSON, VERBOSE) " if analyze else "EXPLAIN (FORMAT JSON, VERBOSE) "
    for name, (text, params, settings) in sorted(captured.runs.items()):
        plans = {name: (explain + text, params)}
        if name in captured.prepared:
            plans[f"{name} (generic plan)"] = (explain + generic_execute(conn, text, params), None)
        for label, (statement, values) in plans.items():
            with conn.transaction() as planning:
                for setting, value in settings.items():
                    conn.execute("SELECT set_config(%s, %s, true)", (setting, value))
                if values is None:  # the plan a prepared statement keeps
                    conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                [[plan]] = conn.execute(statement, values).fetchall()
                raise psycopg.Rollback(planning)  # the settings and the statement's changes go with it
            if values is None:  # planned for any parameters
                generic = conn.execute(
                    "SELECT generic_plans FROM pg_prepared_statements WHERE name = 'generic_check'"
                ).fetchone()
                assert generic and generic[0] >= 1, f"{label}: not a generic plan"
            found = scans_of_churning_tables(plan[0]["Plan"])
            if analyze:
                found += scans_reading_too_much(plan[0]["Plan"], params)
            if found:
                problems[label] = sorted(set(found))
        if name in captured.prepared:
            conn.execute("DEALLOCATE generic_check")
    return problems


def generic_execute(conn, text: str, params: dict) -> str:
    """``text`` prepared as ``generic_check`` (its ``%(name)s`` and ``%(name)b`` parameters numbered), and the
    ``EXECUTE`` of it with ``params`` as literals: under ``plan_cache_mode = force_generic_plan``,
    the plan PostgreSQL keeps for any parameters. A parameter without a cast takes the type its
    context gives it (an ``int`` compared with an integer column), where psycopg may send a smaller
    integer type: the same index conditions."""
    names: list[str] = []

    def number(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    conn.execute("PREPARE generic_check AS " + re.sub(r"%\((\w+)\)[sb]", number, text).replace("%%", "%"))
    with psycopg.ClientCursor(conn) as literal:
        values = ", ".join(literal.mogrify("%s", [params[n]]) for n in names)
    return f"EXECUTE generic_check({values})"


@pytest.mark.parametrize("state", ["empty", "million", "never", "burst"])
def test_hot_statements_plan_lookups_whatever_the_statistics(client, clean_db, monkeypatch, state):
    captured = Captured()
    work(client, clean_db, captured, monkeypatch)
    assert set(captured.runs) == HOT, f"not run: {sorted(HOT - set(captured.runs))}"
    client.create_group("audit")
    client.subscribe("audit", "orders")
    with psycopg.connect(  # never prepared by psycopg: its rollbacks would DEALLOCATE generic_check
        clean_db, autocommit=True, prepare_threshold=None, options="-c search_path=redelivery"
    ) as conn:
        try:
            set_state(conn, state)
            problems = plan_problems(conn, captured, analyze=True)
        finally:
            for table in tables(conn):
                conn.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
    known = {name: problems.pop(name, None) for name in KNOWN_OVERREADS.get(state, ())}
    assert problems == {}, json.dumps(problems, indent=1)
    # strict: when a statement is fixed, its entry goes
    assert all(found and all(" read " in f for f in found) for found in known.values()), known


def test_the_read_check_sees_a_hash_of_a_whole_partition_by_its_topic():
    """The plan the issue found: the topic's whole partition read through an index condition on the
    topic alone and hashed, for a few hundred rows. Not a whole scan by its node types (it has an
    index condition); a million rows read for 500."""
    partition = {"Relation Name": "messages_20260301t120000", "Schema": "redelivery_log"}
    scan = {"Node Type": "Index Scan", **partition, "Index Cond": "(m.topic_id = 1)",
            "Actual Rows": 1_000_000, "Actual Loops": 1}  # fmt: skip
    ready = {"Node Type": "Index Scan", "Relation Name": "deliveries", "Schema": "redelivery",
             "Index Cond": "(d.message_id = ANY ($1))", "Actual Rows": 300, "Actual Loops": 1}  # fmt: skip
    hashed = {"Node Type": "Hash", "Actual Rows": 1_000_000, "Actual Loops": 1, "Plans": [scan]}
    plan = {"Node Type": "Hash Join", "Actual Rows": 300, "Actual Loops": 1, "Plans": [ready, hashed]}
    assert scans_of_churning_tables(plan) == []
    assert scans_reading_too_much(plan, {"max_messages": 500}) == [
        "Index Scan of redelivery_log.messages_20260301t120000 read 1,000,000 rows for 500 ((m.topic_id = 1))"
    ]
    filtered = {**ready, "Actual Rows": 2, "Rows Removed by Filter": 1_500, "Actual Loops": 2}
    assert rows_read(filtered) == 3_004
    small = {**hashed, "Plans": [{**scan, "Actual Rows": 1_900}]}  # within 4 x the batch
    assert scans_reading_too_much({**plan, "Plans": [ready, small]}, {"max_messages": 500}) == []


def test_the_plan_check_sees_whole_scans_and_loops_over_the_receipts():
    """The check itself: it reports what it looks for, and only that."""
    seq = {"Node Type": "Seq Scan", "Relation Name": "messages_20260301t120000", "Schema": "redelivery_log"}
    full = {"Node Type": "Index Scan", "Relation Name": "deliveries", "Schema": "redelivery"}
    looked_up = {**full, "Index Cond": "(message_id = ANY ($1))"}
    by_index = {"Node Type": "Bitmap Index Scan", "Index Cond": "(message_id = ANY ($1))"}
    bitmap = {"Node Type": "Bitmap Heap Scan", "Relation Name": "deliveries", "Schema": "redelivery",
              "Plans": [by_index]}  # fmt: skip
    unnest = {"Node Type": "Function Scan", "Alias": "i"}
    loop = {"Node Type": "Nested Loop", "Plans": [looked_up, {"Node Type": "Materialize", "Plans": [unnest]}]}
    assert sorted(scans_of_churning_tables({"Node Type": "Hash Join", "Plans": [seq, full]})) == [
        "Index Scan of all redelivery.deliveries (no filter)",
        "Seq Scan of all redelivery_log.messages_20260301t120000 (no filter)",
    ]
    assert scans_of_churning_tables(loop) == ["Nested Loop over the receipts' unnest"]
    assert scans_of_churning_tables({"Node Type": "Nested Loop", "Plans": [unnest, looked_up]}) == []
    assert scans_of_churning_tables(bitmap) == []


def test_the_trigger_promotes_a_keys_next_message_by_its_primary_key(client):
    """finish_ordered_heads (issue 36): an ack of 200 heads, each with messages BLOCKED behind it,
    promotes each key's next one through the primary key, checked against a lookup of the chosen
    rows: its plan read the BLOCKED rows' index of the whole subscription and compared each row
    with the list of all the chosen ones (quadratic: 40 ms an ack of 500 with 1,000 keys). The
    trigger's own statements' plans, from auto_explain."""
    client.create_topic("orders")
    client.create_group("sequence")
    client.subscribe("sequence", "orders", ordered=True)
    client.publish("orders", [Message({"n": i}, key=f"k{i % 200}") for i in range(600)], at=at(0))
    heads = client.receive("sequence", "orders", 500, 30, at=at(0))
    assert len(heads) == 200
    conn = client.conn
    conn.execute("LOAD 'auto_explain'")
    for setting, value in (
        ("log_min_duration", "0"),
        ("log_nested_statements", "on"),
        ("log_level", "notice"),
    ):
        conn.execute(f"SET auto_explain.{setting} = {value}")
    plans: list[str] = []
    conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    try:
        assert client.ack("sequence", heads) == 200
    finally:
        conn.execute("SET auto_explain.log_min_duration = -1")
    [promotion] = [p for p in plans if "UPDATE deliveries d SET state = 'READY'" in p]
    scan = promotion[promotion.index("Update on deliveries") :]
    assert "deliveries_pkey" in scan and "deliveries_blocked on deliveries d " not in scan, scan
    assert "= ANY ((InitPlan" in scan and "ROW(" not in scan, scan  # a lookup, not a list of rows
    states = client.stats()["orders"]["sequence"]
    assert (states["READY"], states["BLOCKED"]) == (200, 200)
