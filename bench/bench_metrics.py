"""Benchmark: the cost of a Prometheus scrape (redelivery.metrics) on a state store of 10 million
deliveries (messages x groups), against a plain count of the log measured in the same run.

    .venv/bin/python bench/bench_metrics.py                      # 10,000,000 deliveries
    .venv/bin/python bench/bench_metrics.py --deliveries 1000000 --live 0.10

Fills a database of its own (redelivery_bench_metrics; REDELIVERY_BENCH_METRICS_DATABASE_URL
replaces it) with INSERT ... SELECT over generate_series: topics x groups subscriptions, every
subscription's offset past its topic's last message, and each (message, group) given a state by a
hash of the pair: ``--live`` of them (default 5 %) in READY 40 : INFLIGHT 10 : WAITING_RETRY 30
(levels 1-16), delivery rows, : DLQ 20 (a dead letter each, four reasons), the rest COMMITTED (no
row: the log layout keeps none). Each statement is measured
``--rounds`` times after a warm-up, twice: right after the load (ANALYZE only: no page is
all-visible, so an index-only scan still reads the heap, as for rows changed since the last
vacuum) and after VACUUM (the steady state autovacuum keeps). Printed, in milliseconds (median)
and as a multiple of the baseline of the same phase:

  baseline            SELECT count(*) FROM messages (every message of the log)
  SUBSCRIPTION_STATES per topic, group and state, COMMITTED included (what ``redelivery stats`` runs)
  each statement of a scrape, with the scan nodes of its plan
  scrape         render(): every statement of a scrape in one snapshot, and the exposition text

The data is truncated at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

GAUGES = ("METRICS_READY", "METRICS_INFLIGHT", "METRICS_WAITING", "METRICS_DEAD_LETTERS", "METRICS_COMMITTED")
OTHER = ("SUBSCRIPTION_NAMES", "METRICS_GROUP_TOTALS", "METRICS_HISTOGRAMS")
REASONS = ["MAX_DELIVERIES_EXCEEDED", "LEASE_EXPIRED", "REJECTED", "NEGATIVE_LEVEL"]


def database() -> str:
    from redelivery.store import embedded

    if os.environ.get("REDELIVERY_BENCH_METRICS_DATABASE_URL"):
        return os.environ["REDELIVERY_BENCH_METRICS_DATABASE_URL"]
    embedded.ensure_running(("redelivery", "airflow", "redelivery_bench_metrics"))
    return embedded.url("redelivery_bench_metrics")


def fill(url: str, deliveries: int, topics: int, groups: int, live: float) -> dict:
    """Build the state store; returns {step: seconds}."""
    from redelivery.store import catalog, db, log, maintenance

    messages = deliveries // groups
    permille = round(live * 1000)
    # state by h = a hash of (message, group) in 0..999: COMMITTED below `committed`, then the live states
    committed = 1000 - permille
    ready, inflight, waiting = (committed + round(permille * f) for f in (0.4, 0.5, 0.8))
    steps = {}
    with db.connect(url, autocommit=True) as conn:
        db.migrate(url)
        maintenance.empty_state_store(conn)
        first = conn.execute("SELECT now() - interval '1 day'").fetchone()[0]
        for hour in range(int(messages / 3_600_000) + 2):  # the log's partitions of the messages' times
            log.ensure_partition(conn, first + timedelta(hours=hour), 3600)
        for (table,) in conn.execute(  # the first measurements are of tables not vacuumed
            "SELECT tablename FROM pg_tables WHERE schemaname = 'redelivery_log'"
        ).fetchall():
            conn.execute(f"ALTER TABLE redelivery_log.{table} SET (autovacuum_enabled = off)")
        conn.execute("ALTER TABLE deliveries SET (autovacuum_enabled = off)")
        conn.execute(
            "INSERT INTO topics (name) SELECT 'bench-' || i FROM generate_series(1, %s) i", (topics,)
        )
        conn.execute(
            "INSERT INTO consumer_groups (name) SELECT 'group-' || i FROM generate_series(1, %s) i", (groups,)
        )
        conn.execute(
            "INSERT INTO subscriptions (topic_id, group_id) "
            "SELECT t.id, g.id FROM topics t CROSS JOIN consumer_groups g"
        )
        conn.execute(  # no parameters: the text goes as it is, '%' included
            "INSERT INTO dead_letter_queues (name) SELECT '%DLQ%' || name FROM consumer_groups ORDER BY id"
        )
        catalog.ensure_dlq_tables(conn, {r[0] for r in conn.execute("SELECT id FROM dead_letter_queues")})
        start = time.perf_counter()
        conn.execute(
            """INSERT INTO messages (topic_id, body, content_type, published_at)
               SELECT 1 + i %% %(topics)s,
                      convert_to('{"n": ' || i || ', "payload": "' || repeat('x', 40) || '"}', 'UTF8'),
                      'application/json', now() - interval '1 day' + i * interval '1 ms'
               FROM generate_series(1, %(messages)s) i""",
            {"topics": topics, "messages": messages},
        )
        steps["messages"] = time.perf_counter() - start
        fill_states(conn, cuts={"c": committed, "r": ready, "i": inflight, "w": waiting}, steps=steps)
        start = time.perf_counter()
        for table in ("messages", "deliveries", "dlq_messages"):
            conn.execute(f"ANALYZE {table}")
        steps["analyze"] = time.perf_counter() - start
        conn.execute(
            "UPDATE consumer_groups SET promoted = id * 1000, dead_lettered = id * 100, redriven = id * 10"
        )
    return steps


def fill_states(conn, cuts: dict, steps: dict) -> None:
    """Each (message, group) a state by a hash of the pair (``cuts``: the hash's bounds of COMMITTED,
    READY, INFLIGHT, WAITING_RETRY, the rest DLQ): the live ones a delivery row, the dead ones a
    dead letter, COMMITTED nothing; every offset past its topic's last message."""
    start = time.perf_counter()
    states = """SELECT m.id, m.topic_id, m.published_at, g.id AS group_id, g.name, s.h, s.state
           FROM messages m CROSS JOIN consumer_groups g,
                LATERAL (SELECT h, CASE WHEN h < %(c)s THEN 'COMMITTED' WHEN h < %(r)s THEN 'READY'
                                        WHEN h < %(i)s THEN 'INFLIGHT' WHEN h < %(w)s THEN 'WAITING_RETRY'
                                        ELSE 'DLQ' END AS state
                         FROM (SELECT ((m.id * 7919 + g.id * 104729) %% 1000)::int AS h) x) s"""
    conn.execute(
        f"""INSERT INTO deliveries (message_id, group_id, topic_id, published_at, state, delivery_count,
                                    reconsume_times, delay_level, due_at, invisible_until, ready_at)
           SELECT x.id, x.group_id, x.topic_id, x.published_at, x.state::delivery_state,
                  1 + x.h %% 16,
                  CASE WHEN x.state = 'INFLIGHT' THEN 0 ELSE 1 + x.h %% 16 END,
                  CASE WHEN x.state = 'WAITING_RETRY' THEN 1 + x.h %% 16 END,
                  CASE WHEN x.state = 'WAITING_RETRY' THEN now() + (x.h %% 600) * interval '1 s' END,
                  CASE WHEN x.state = 'INFLIGHT' THEN now() + interval '1 hour' END,
                  x.published_at + (x.h %% 60) * interval '1 s'
           FROM ({states}) x WHERE x.state IN ('READY', 'INFLIGHT', 'WAITING_RETRY')""",
        cuts,
    )
    steps["deliveries"] = time.perf_counter() - start
    start = time.perf_counter()
    conn.execute(
        f"""INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, body,
                                     content_type, properties, published_at, reason, last_error,
                                     delivery_count, reconsume_times)
           SELECT q.id, x.group_id, x.id, x.topic_id, x.id, m.body, m.content_type, m.properties,
                  x.published_at, (%(reasons)s::dlq_reason[])[1 + x.id %% 4], 'boom', 1 + x.h %% 16,
                  1 + x.h %% 16
           FROM ({states}) x JOIN messages m ON m.topic_id = x.topic_id AND m.id = x.id
           JOIN dead_letter_queues q ON q.name = '%%DLQ%%' || x.name
           WHERE x.state = 'DLQ'""",
        {**cuts, "reasons": REASONS},
    )
    conn.execute("""UPDATE subscriptions s SET consume_offset = m.last, messages_taken = m.n
                    FROM (SELECT topic_id, max(id) AS last, count(*) AS n FROM messages GROUP BY 1) m
                    WHERE m.topic_id = s.topic_id""")
    steps["dead letters"] = time.perf_counter() - start


def timed(call, rounds: int) -> float:
    call()  # warm-up: the pages in shared buffers or the OS cache, as on a server scraped every 15 s
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def scan_nodes(conn, text: str, params: dict) -> str:
    plan = [r[0] for r in conn.execute("EXPLAIN " + text, params)]
    nodes = [line.strip().removeprefix("->").strip().split("  (")[0] for line in plan if "Scan" in line]
    return "; ".join(dict.fromkeys(nodes))


def measurements(conn, rounds: int) -> list[tuple[str, float, str]]:
    """(label, median ms, plan scans): the baseline, SUBSCRIPTION_STATES, each scrape statement, render()."""
    from redelivery.metrics import render
    from redelivery.store import statements as S

    def query(text, params=None):
        return lambda: conn.execute(text, params).fetchall()

    baseline = "SELECT count(*) FROM messages"
    rows = [
        ("baseline: SELECT count(*) FROM messages", query(baseline), scan_nodes(conn, baseline, None)),
        (
            "SUBSCRIPTION_STATES (every state, COMMITTED too)",
            query(S.SUBSCRIPTION_STATES),
            scan_nodes(conn, S.SUBSCRIPTION_STATES, None),
        ),
    ]
    for name in GAUGES + OTHER:
        params = {"at": None} if "%(at)s" in S.ALL[name] else None
        rows.append((name, query(S.ALL[name], params), scan_nodes(conn, S.ALL[name], params)))
    rows.append(("scrape: render(), every statement but SUBSCRIPTION_STATES", lambda: render(conn), ""))
    return [(label, timed(call, rounds), plan) for label, call, plan in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=10_000_000)
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--live", type=float, default=0.05, help="fraction of deliveries not COMMITTED")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the data (default: truncate at the end)")
    args = parser.parse_args()

    from redelivery.metrics import render
    from redelivery.store import db, maintenance

    url = database()
    steps = fill(url, args.deliveries, args.topics, args.groups, args.live)
    with db.connect(url, autocommit=True) as conn:
        total = conn.execute("SELECT count(*) FROM messages").fetchone()[0] * args.groups
        live = conn.execute("SELECT (SELECT count(*) FROM deliveries) + (SELECT count(*) FROM dlq_messages)")
        live = live.fetchone()[0]
        size = conn.execute("SELECT pg_size_pretty(pg_database_size(current_database()))").fetchone()[0]
        print(
            f"{total:,} deliveries (database {size}), {live:,} not COMMITTED, "
            f"{args.topics * args.groups} subscriptions; filled in "
            + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items()),
            flush=True,
        )
        before = measurements(conn, args.rounds)  # no page all-visible yet: index-only scans visit the heap
        start = time.perf_counter()
        for table in ("messages", "deliveries", "dlq_messages"):
            conn.execute(f"VACUUM {table}")
        print(f"VACUUM {time.perf_counter() - start:.1f} s", flush=True)
        after = measurements(conn, args.rounds)
        print("median ms of each statement: right after the load (ANALYZE only) and after VACUUM; x baseline")
        print(
            f"{'statement':<52} {'no vacuum':>10} {'x':>6} {'vacuumed':>10} {'x':>6}  plan scans (vacuumed)"
        )
        for (label, ms, _), (_, ms_after, plan) in zip(before, after, strict=True):
            print(
                f"{label:<52} {ms:>10.1f} {ms / before[0][1]:>6.3f} {ms_after:>10.1f} "
                f"{ms_after / after[0][1]:>6.3f}  {plan}"
            )
        text = render(conn).decode()
        samples = sum(1 for line in text.splitlines() if not line.startswith("#"))
        print(f"exposition: {len(text):,} bytes, {samples:,} samples")
        if not args.keep:
            maintenance.empty_state_store(conn)


if __name__ == "__main__":
    main()
