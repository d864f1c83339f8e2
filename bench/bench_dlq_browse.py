"""Benchmark: a page of the operator's dead-letter list (``dead_letters.browse``: ``DLQ_BROWSE``,
keyset pages newest first) with a million dead letters in one DLQ, against plain queries measured
in the same run.

    .venv/bin/python bench/bench_dlq_browse.py                    # 1,000,000 dead letters
    .venv/bin/python bench/bench_dlq_browse.py --dead-letters 100000 --rounds 5

Fills a database of its own (redelivery_bench_dlq; REDELIVERY_BENCH_DLQ_DATABASE_URL replaces it)
in SQL (INSERT ... SELECT over generate_series): one topic, one group, one DLQ (``%DLQ%billing``),
every message dead-lettered in it: dead-lettered over 30 days (ten at each instant: ties), four
reasons in turn, keys ``order-<i mod 100,000>`` (ten dead letters a key), last errors ``HTTP 500
from billing-api (attempt <i mod 97>)``, for one in three ``stage <one of 26 letters> failed for
order <i>`` (class ``shop.StageError``) and, for one in a hundred, ``Timeout calling ERP``: 28
failure signatures, as the dead-lettering statement computes them.
Then ANALYZE and VACUUM (the steady state autovacuum keeps), and each query is timed ``--rounds``
times after a warm-up, on one connection (psycopg prepares a statement run five times, and
PostgreSQL may then plan it once for any values: that is measured too). Printed, in milliseconds
(median) and as a multiple of the baseline:

  baseline        SELECT the 51 highest message ids of the DLQ by its primary key (the floor of a page)
  OFFSET          the page the list would show at row 500,000 with ORDER BY ... OFFSET: what keyset replaces
  browse(...)     a page of 50 rows (Python included): the first, at row 500,000 and at the last
                  row (a cursor), and under each kind of filter the redrive shares
  message(...)    one dead letter for its page (a body preview, its redrive history)
  groups(...)     the dead letters grouped by failure signature (issue 40, ``DLQ_SIGNATURES``), whole
                  and filtered, with the page's and the metric's statements; against a plain
                  count(*) of the group's dead letters (every row's index entry read once)

The data is truncated at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

REASONS = ["MAX_DELIVERIES_EXCEEDED", "LEASE_EXPIRED", "REJECTED", "NEGATIVE_LEVEL"]
#: The last row of the fixture is dead-lettered at this offset from now; each earlier ten rows a
#: step earlier (about 30 days for a million).
SPAN_DAYS = 30


def database() -> str:
    from redelivery.store import embedded

    if os.environ.get("REDELIVERY_BENCH_DLQ_DATABASE_URL"):
        return os.environ["REDELIVERY_BENCH_DLQ_DATABASE_URL"]
    embedded.ensure_running(("redelivery", "airflow", "redelivery_bench_dlq"))
    return embedded.url("redelivery_bench_dlq")


def fill(url: str, n: int) -> dict:
    """Build the state store: ``n`` messages, each dead-lettered; returns {step: seconds}."""
    from redelivery.store import catalog, db, log, maintenance

    steps = {}
    with db.connect(url, autocommit=True) as conn:
        db.migrate(url)
        maintenance.empty_state_store(conn)
        first = conn.execute("SELECT now() - interval '31 days'").fetchone()[0]
        for hour in range(int(n / 3_600_000) + 2):  # the log's partitions of the messages' times
            log.ensure_partition(conn, first + timedelta(hours=hour), 3600)
        conn.execute("INSERT INTO topics (name) VALUES ('orders')")
        conn.execute("INSERT INTO consumer_groups (name) VALUES ('billing')")
        conn.execute("INSERT INTO subscriptions (topic_id, group_id) SELECT 1, 1")
        conn.execute(
            "INSERT INTO dead_letter_queues (name) VALUES ('%DLQ%billing')"
        )  # no parameters: '%' as is
        catalog.ensure_dlq_tables(conn, {1})
        start = time.perf_counter()
        conn.execute(
            """INSERT INTO messages (topic_id, key, body, content_type, published_at)
               SELECT 1, 'order-' || i %% 100000,
                      convert_to('{"order": ' || i || ', "amount": 10.10, "customer": "c-'
                                 || i %% 977 || '"}', 'UTF8'),
                      'application/json', now() - interval '31 days' + i * interval '1 ms'
               FROM generate_series(1, %(n)s) i""",
            {"n": n},
        )
        # every message taken by the group (no delivery row: each ends a dead letter)
        conn.execute("UPDATE subscriptions SET consume_offset = %(n)s, messages_taken = %(n)s", {"n": n})
        steps["messages"] = time.perf_counter() - start
        start = time.perf_counter()
        step = f"{SPAN_DAYS * 86400 / max(n / 10, 1):.6f} seconds"
        conn.execute(
            """INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, key, body,
                                         content_type, properties, published_at, reason, last_error,
                                         delivery_count, reconsume_times, first_failure_at, last_failure_at,
                                         dead_lettered_at, attempts, error_class, signature)
               SELECT 1, 1, m.id, 1, m.id, m.key, m.body, m.content_type, m.properties, m.published_at,
                      (%(reasons)s::dlq_reason[])[1 + m.id %% 4], e.error, 17, 16, m.published_at, at, at,
                      jsonb_build_array(jsonb_build_object('at', at, 'delivery', 17, 'outcome', 'nack',
                                                           'error', 'HTTP 500 from billing-api')),
                      e.error_class, error_signature(e.error_class, e.error, NULL)
               FROM messages m,
                    LATERAL (SELECT now() - ((%(n)s - m.id) / 10) * %(step)s::interval AS at) t,
                    LATERAL (SELECT CASE WHEN m.id %% 100 = 0 THEN 'Timeout calling ERP'
                                         WHEN m.id %% 3 = 0
                                         THEN 'stage ' || chr(97 + (m.id %% 26)::int)
                                              || ' failed for order ' || m.id
                                         ELSE 'HTTP 500 from billing-api (attempt ' || m.id %% 97 || ')' END
                                      AS error,
                                    CASE WHEN m.id %% 3 = 0 AND m.id %% 100 <> 0 THEN 'shop.StageError' END
                                      AS error_class) e""",
            {"reasons": REASONS, "n": n, "step": step},
        )
        steps["dead letters"] = time.perf_counter() - start
        start = time.perf_counter()
        for table in ("messages", "dlq_messages"):
            conn.execute(f"VACUUM ANALYZE {table}")
        steps["vacuum analyze"] = time.perf_counter() - start
    return steps


def timed(call, rounds: int) -> float:
    call()  # warm-up: the pages in shared buffers, as for an operator paging through the list
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def cursor_at(conn, row: int):
    """The cursor after the list's ``row``-th row (newest first), as the page before it ends."""
    from redelivery.dead_letters import Cursor

    at, mid = conn.execute(
        "SELECT dead_lettered_at, message_id FROM dlq_messages WHERE group_id = 1"
        " ORDER BY dead_lettered_at DESC, message_id DESC OFFSET %s LIMIT 1",
        (row - 1,),
    ).fetchone()
    return Cursor(at, mid)


def measurements(conn, n: int, rounds: int) -> list[tuple[str, float, int]]:
    """(label, median ms, rows) of the baseline, the OFFSET page, pages of browse and message()."""
    from redelivery.dead_letters import PAGE_ROWS, DlqFilter, browse, groups, message
    from redelivery.store import statements as S

    count_all = "SELECT count(*) FROM dlq_messages WHERE group_id = 1"
    [signature] = conn.execute("SELECT signature FROM dlq_messages WHERE message_id = 3").fetchone()

    middle, last = cursor_at(conn, n // 2), cursor_at(conn, n - 1)
    offset = (
        "SELECT q.message_id, q.key, q.reason, left(q.last_error, 200), q.delivery_count,"
        " q.reconsume_times, q.redrive_count, q.dead_lettered_at FROM dlq_messages q WHERE q.group_id = 1"
        " ORDER BY q.dead_lettered_at DESC, q.message_id DESC OFFSET %(offset)s LIMIT %(limit)s"
    )
    baseline = (
        "SELECT message_id FROM dlq_messages WHERE dlq_id = 1 AND group_id = 1"
        " ORDER BY message_id DESC LIMIT %(limit)s"
    )
    sql = lambda text, params: lambda: conn.execute(text, params).fetchall()  # noqa: E731
    span = conn.execute("SELECT min(dead_lettered_at), max(dead_lettered_at) FROM dlq_messages").fetchone()
    mid = span[0] + (span[1] - span[0]) / 2
    day = (mid, mid + (span[1] - span[0]) / SPAN_DAYS)

    def page(after=None, **values):
        return lambda: browse(conn, DlqFilter(group="billing", **values), after=after)

    ids = list(range(5000, n, n // 100))[:100]
    deep = {"offset": n // 2, "limit": PAGE_ROWS + 1}
    cases = [
        ("baseline: 51 highest ids by the primary key", sql(baseline, {"limit": PAGE_ROWS + 1})),
        (f"OFFSET {n // 2:,} (what keyset replaces)", sql(offset, deep)),
        ("browse: first page", page()),
        (f"browse: page at row {n // 2:,} (cursor)", page(after=middle)),
        ("browse: last page (cursor)", page(after=last)),
        ("browse: reason REJECTED (1 in 4)", page(reasons=["REJECTED"])),
        ("browse: key order-4242", page(key="order-4242")),
        ("browse: topic orders (all)", page(topic="orders")),
        ("browse: one day in the middle", page(dead_lettered_from=day[0], dead_lettered_to=day[1])),
        ("browse: 100 message ids", page(message_ids=ids)),
        ("browse: error contains 'timeout' (1 in 100)", page(error_contains="timeout")),
        ("browse: error contains text no row has (every row read)", page(error_contains="no such text")),
        ("message: one dead letter for its page", lambda: message(conn, "billing", n // 2)),
        ("browse: one signature (1 in 78)", page(signature=signature)),
        ("count(*) of the group (the floor of a grouping)", sql(count_all, None)),
        (f"groups: all {n:,} by signature", lambda: groups(conn, DlqFilter(group="billing"))),
        (
            "groups: reason REJECTED (1 in 4)",
            lambda: groups(conn, DlqFilter(group="billing", reasons=["REJECTED"])),
        ),
        (
            "groups: one day in the middle",
            lambda: groups(
                conn, DlqFilter(group="billing", dead_lettered_from=day[0], dead_lettered_to=day[1])
            ),
        ),
        (
            "page: top failures (PAGE_DLQ_TOP_FAILURES)",
            sql(S.PAGE_DLQ_TOP_FAILURES, {"ids": [1], "limit": 5, "error_chars": 200}),
        ),
        ("metric: METRICS_DEAD_LETTER_SIGNATURES", sql(S.METRICS_DEAD_LETTER_SIGNATURES, {"top": 10})),
    ]
    out = []
    for label, call in cases:
        result = call()
        rows = len(result[0]) if isinstance(result, tuple) else len(result) if isinstance(result, list) else 1
        out.append((label, timed(call, rounds), rows))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dead-letters", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--keep", action="store_true", help="keep the data (default: truncate at the end)")
    args = parser.parse_args()

    from redelivery.store import db, maintenance

    url = database()
    steps = fill(url, args.dead_letters)
    with db.connect(url, autocommit=True) as conn:
        size = conn.execute(  # the DLQ's table: a partition (the parent holds nothing itself)
            "SELECT pg_size_pretty(pg_total_relation_size(%s::regclass))", ('redelivery_dlq."%DLQ%billing"',)
        ).fetchone()[0]
        total = conn.execute("SELECT count(*) FROM dlq_messages").fetchone()[0]
        print(
            f"{total:,} dead letters in one DLQ ({size} with indexes); filled in "
            + ", ".join(f"{k} {v:.1f} s" for k, v in steps.items()),
            flush=True,
        )
        results = measurements(conn, args.dead_letters, args.rounds)
        base = results[0][1]
        width = max(len(label) for label, _, _ in results)
        print(f"{'query':<{width}}  {'ms (median)':>11}  {'x baseline':>10}  rows")
        for label, ms, rows in results:
            print(f"{label:<{width}}  {ms:>11.2f}  {ms / base:>9.1f}x  {rows}")
        if not args.keep:
            maintenance.empty_state_store(conn)


if __name__ == "__main__":
    main()
