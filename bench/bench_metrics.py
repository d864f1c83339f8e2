"""Benchmark: the cost of a Prometheus scrape (redelivery.metrics) on a state store of 10 million
deliveries, against a plain count of them measured in the same run.

    .venv/bin/python bench/bench_metrics.py                      # 10,000,000 deliveries
    .venv/bin/python bench/bench_metrics.py --deliveries 1000000 --live 0.10

Fills a database of its own (redelivery_bench_metrics; REDELIVERY_BENCH_METRICS_DATABASE_URL
replaces it) with INSERT ... SELECT over generate_series: topics x groups subscriptions, each
message fanned out to every group, and the deliveries spread over the states by a hash of their
key: ``--live`` of them (default 5 %) in READY 40 : INFLIGHT 10 : WAITING_RETRY 30 (levels 1-16)
: DLQ 20 (a dead-letter row each, four reasons), the rest COMMITTED. Each statement is measured
``--rounds`` times after a warm-up, twice: right after the load (ANALYZE only: no page is
all-visible, so an index-only scan still reads the heap, as for rows changed since the last
vacuum) and after VACUUM (the steady state autovacuum keeps). Printed, in milliseconds (median)
and as a multiple of the baseline of the same phase:

  baseline       SELECT count(*) FROM deliveries (every delivery, the floor of any full count)
  STATE_COUNTS   per topic, group and state, COMMITTED included (what ``redelivery stats`` runs)
  each statement of a scrape, with the scan nodes of its plan
  scrape         render(): every statement of a scrape in one snapshot, and the exposition text

The data is truncated at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

GAUGES = ("METRICS_READY", "METRICS_INFLIGHT", "METRICS_WAITING", "METRICS_DEAD_LETTERS")
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
    from redelivery.store import catalog, db

    messages = deliveries // groups
    permille = round(live * 1000)
    # state by h = a hash of (message, group) in 0..999: COMMITTED below `committed`, then the live states
    committed = 1000 - permille
    ready, inflight, waiting = (committed + round(permille * f) for f in (0.4, 0.5, 0.8))
    steps = {}
    with db.connect(url, autocommit=True) as conn:
        db.migrate(url)
        db.empty_state_store(conn)
        for table in ("messages", "deliveries"):  # the first measurements are of a table not vacuumed
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
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
        start = time.perf_counter()
        conn.execute(
            """INSERT INTO deliveries (message_id, group_id, topic_id, state, delivery_count, reconsume_times,
                                       delay_level, due_at, invisible_until, ready_at, created_at, updated_at)
               SELECT m.id, g.id, m.topic_id, s.state::delivery_state,
                      CASE WHEN s.state = 'READY' THEN 0 ELSE 1 + s.h %% 16 END,
                      CASE WHEN s.state IN ('WAITING_RETRY', 'DLQ') THEN 1 + s.h %% 16 ELSE 0 END,
                      CASE WHEN s.state = 'WAITING_RETRY' THEN 1 + s.h %% 16 END,
                      CASE WHEN s.state = 'WAITING_RETRY' THEN now() + (s.h %% 600) * interval '1 s' END,
                      CASE WHEN s.state = 'INFLIGHT' THEN now() + interval '1 hour' END,
                      m.published_at + (s.h %% 60) * interval '1 s', m.published_at, m.published_at
               FROM messages m CROSS JOIN consumer_groups g,
                    LATERAL (SELECT h, CASE WHEN h < %(c)s THEN 'COMMITTED' WHEN h < %(r)s THEN 'READY'
                                            WHEN h < %(i)s THEN 'INFLIGHT' WHEN h < %(w)s THEN 'WAITING_RETRY'
                                            ELSE 'DLQ' END AS state
                             FROM (SELECT ((m.id * 7919 + g.id * 104729) %% 1000)::int AS h) x) s""",
            {"c": committed, "r": ready, "i": inflight, "w": waiting},
        )
        steps["deliveries"] = time.perf_counter() - start
        start = time.perf_counter()
        conn.execute(
            """INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, body,
                                         content_type, properties, published_at, reason, last_error,
                                         delivery_count, reconsume_times)
               SELECT q.id, d.group_id, d.message_id, d.topic_id, m.id, m.body, m.content_type, m.properties,
                      m.published_at, (%(reasons)s::dlq_reason[])[1 + d.message_id %% 4], 'boom',
                      d.delivery_count, d.reconsume_times
               FROM deliveries d JOIN messages m ON m.id = d.message_id
               JOIN consumer_groups g ON g.id = d.group_id
               JOIN dead_letter_queues q ON q.name = '%%DLQ%%' || g.name
               WHERE d.state = 'DLQ'""",
            {"reasons": REASONS},
        )
        steps["dead letters"] = time.perf_counter() - start
        start = time.perf_counter()
        for table in ("messages", "deliveries", "dlq_messages"):
            conn.execute(f"ANALYZE {table}")
        steps["analyze"] = time.perf_counter() - start
        conn.execute(
            "UPDATE consumer_groups SET promoted = id * 1000, dead_lettered = id * 100, redriven = id * 10"
        )
    return steps


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
    """(label, median ms, plan scans) of the baseline, STATE_COUNTS, each scrape statement, render()."""
    from redelivery.metrics import render
    from redelivery.store import statements as S

    def query(text, params=None):
        return lambda: conn.execute(text, params).fetchall()

    baseline = "SELECT count(*) FROM deliveries"
    rows = [
        ("baseline: SELECT count(*) FROM deliveries", query(baseline), scan_nodes(conn, baseline, None)),
        (
            "STATE_COUNTS (every state, COMMITTED too)",
            query(S.STATE_COUNTS),
            scan_nodes(conn, S.STATE_COUNTS, None),
        ),
    ]
    for name in GAUGES + OTHER:
        params = {"at": None} if "%(at)s" in S.ALL[name] else None
        rows.append((name, query(S.ALL[name], params), scan_nodes(conn, S.ALL[name], params)))
    rows.append(("scrape: render(), every statement but STATE_COUNTS", lambda: render(conn), ""))
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
    from redelivery.store import db

    url = database()
    steps = fill(url, args.deliveries, args.topics, args.groups, args.live)
    with db.connect(url, autocommit=True) as conn:
        total, live = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state <> 'COMMITTED') FROM deliveries"
        ).fetchone()
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('deliveries'))").fetchone()[0]
        print(
            f"{total:,} deliveries ({size} with indexes), {live:,} not COMMITTED, "
            f"{args.topics * args.groups} subscriptions; filled in "
            + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items()),
            flush=True,
        )
        before = measurements(conn, args.rounds)  # no page all-visible yet: index-only scans visit the heap
        start = time.perf_counter()
        for table in ("messages", "deliveries", "dlq_messages"):
            conn.execute(f"VACUUM {table}")
        print(f"VACUUM {time.perf_counter() - start:.1f} s", flush=True)
        for table in ("messages", "deliveries"):
            conn.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
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
            db.empty_state_store(conn)


if __name__ == "__main__":
    main()
