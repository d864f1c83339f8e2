"""How long the offline migration to the log (0012) and the next one (0013: batches as id ranges,
fingerprinted by PostgreSQL) take on the demo's data, against copying the same messages once (the
floor of any migration that keeps them), measured in one run.

    .venv/bin/python bench/bench_upgrade.py [--messages 336776] [--dead 8255]

Builds, at revision 0011 (the layout before the log: a delivery row per message and group, kept
as COMMITTED or DLQ), the state ``make demo`` ends in: ``--messages`` flight-like JSON bodies of
about 300 B on topic flights, group flights-http with ``--dead`` of them dead-lettered (a dead
letter each in %DLQ%flights-http) and the rest COMMITTED, group flights-stats with all of them
COMMITTED, every message in one publish batch. Then times ``db.migrate`` to 0012, then to the
head, and, as the baseline, ``CREATE TABLE AS`` of the same messages. Prints seconds, the ratios,
and the database size before and after. Runs on a database of its own (redelivery_bench_upgrade),
made anew.
"""

from __future__ import annotations

import argparse
import time

import psycopg
from psycopg import sql

OLD_STORE = """
    INSERT INTO topics (name) VALUES ('flights');
    INSERT INTO consumer_groups (name) VALUES ('flights-http'), ('flights-stats');
    INSERT INTO subscriptions (topic_id, group_id) SELECT 1, id FROM consumer_groups;
    INSERT INTO messages (topic_id, key, body, content_type, publish_batch, published_at)
    SELECT 1, '2013-' || i, convert_to(json_build_object(
               'year', 2013, 'month', 1 + i %% 12, 'day', 1 + i %% 28, 'dep_time', 500 + i %% 1900,
               'sched_dep_time', 515, 'dep_delay', i %% 40 - 5, 'arr_time', 830, 'carrier', 'UA',
               'flight', i %% 9000, 'tailnum', 'N14228', 'origin', 'EWR', 'dest', 'IAH',
               'air_time', 227, 'distance', 1400, 'hour', 5, 'minute', 15)::text, 'UTF8'),
           'application/json', 'demo', now() - interval '5 hours'
    FROM generate_series(1, %(messages)s) i;
    INSERT INTO deliveries (message_id, group_id, topic_id, state, delivery_count, reconsume_times,
                            ready_at, attempts)
    SELECT m.id, g.id, 1,
           CASE WHEN g.name = 'flights-http' AND m.id <= %(dead)s THEN 'DLQ' ELSE 'COMMITTED' END
               ::delivery_state,
           CASE WHEN g.name = 'flights-http' AND m.id <= %(dead)s THEN 17 ELSE 1 END,
           CASE WHEN g.name = 'flights-http' AND m.id <= %(dead)s THEN 16 ELSE 0 END,
           m.published_at, '[]'
    FROM messages m CROSS JOIN consumer_groups g;
    INSERT INTO dead_letter_queues (name, table_created_at) VALUES ('%%DLQ%%flights-http', now());
    INSERT INTO publish_batches (batch_id, topic_id, message_count, fingerprint)
    VALUES ('demo', 1, %(messages)s, 'from the client');
"""
DEAD_LETTERS = """
    INSERT INTO dlq_messages (dlq_id, group_id, message_id, topic_id, origin_message_id, key, body,
                              content_type, properties, published_at, reason, last_error, delivery_count,
                              reconsume_times, attempts)
    SELECT 1, d.group_id, m.id, 1, m.id, m.key, m.body, m.content_type, m.properties, m.published_at,
           'MAX_DELIVERIES_EXCEEDED', 'HTTP 422', 17, 16, '[]'
    FROM deliveries d JOIN messages m ON m.id = d.message_id WHERE d.state = 'DLQ'"""


def fresh(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return admin_url.rsplit("/", 1)[0] + "/" + name


def size(conn) -> str:
    return conn.execute("SELECT pg_size_pretty(pg_database_size(current_database()))").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=336_776)
    parser.add_argument("--dead", type=int, default=8_255)
    args = parser.parse_args()
    from redelivery.store import db, embedded

    embedded.ensure_running(("redelivery", "airflow"))
    url = fresh(embedded.url("postgres"), "redelivery_bench_upgrade")
    db.migrate(url, "0011")
    with db.connect(url, autocommit=True) as conn:
        for statement in OLD_STORE.split(";")[:-1]:  # with parameters: one statement at a time
            conn.execute(statement, {"messages": args.messages, "dead": args.dead})
        conn.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF dlq_messages FOR VALUES IN (1)").format(
                sql.Identifier("redelivery_dlq", "%DLQ%flights-http")
            )
        )
        conn.execute(DEAD_LETTERS)
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
        before = size(conn)
        start = time.perf_counter()
        conn.execute("CREATE TABLE bench_copy AS SELECT * FROM messages")
        copy = time.perf_counter() - start
        conn.execute("DROP TABLE bench_copy")
        conn.execute("CHECKPOINT")
    start = time.perf_counter()
    db.migrate(url, "0012")
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    db.migrate(url)
    ranges = time.perf_counter() - start
    with db.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        after = size(conn)
        stats = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    print(
        f"{args.messages:,} messages, two groups, {args.dead:,} dead letters (database {before}):\n"
        f"  migration 0012 (offline) {seconds:.1f} s; copying the messages once (baseline) {copy:.1f} s: "
        f"{seconds / copy:.1f}x\n"
        f"  migration 0013 (batch ranges) {ranges:.1f} s: {ranges / copy:.1f}x\n"
        f"  after: {stats:,} messages in the log, database {after}"
    )


if __name__ == "__main__":
    main()
