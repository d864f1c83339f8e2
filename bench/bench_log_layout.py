"""What the brokers' layout would save on receive+ack, measured before building it.

    .venv/bin/python bench/bench_log_layout.py [--messages 100000] [--rounds 2]

Today every published message gets a READY delivery row per group, and RECEIVE claims READY rows
with an UPDATE (statements.RECEIVE). In the layout of RocketMQ's and Kafka's logs, a group keeps a
consume offset per topic instead and a receive INSERTs INFLIGHT delivery rows for the messages past
it, advancing the offset in the same statement (``LOG_RECEIVE`` below: a prototype, not used by
the product). Both variants run the same ACK (statements.ACK) in batches of 500, raw SQL, rows
fetched but not decoded, one consumer, on the same freshly built topic (bench_tier.build); the
figures are server time plus one round trip per statement. Prints microseconds per message and the
ratio of the two rates (same run).
"""

from __future__ import annotations

import argparse
import time

from bench_tier import build, database

LOG_RECEIVE = """
WITH sub AS (SELECT consume_offset FROM bench_offsets
             WHERE group_id = %(g)s AND topic_id = %(topic_id)s FOR UPDATE),
new AS (SELECT m.id FROM messages m
        WHERE m.topic_id = %(topic_id)s AND m.id > (SELECT consume_offset FROM sub)
        ORDER BY m.id LIMIT %(n)s),
ins AS (INSERT INTO deliveries (message_id, group_id, topic_id, state, delivery_count, invisible_until)
        SELECT id, %(g)s, %(topic_id)s, 'INFLIGHT', 1, now() + make_interval(secs => %(lease)s) FROM new
        RETURNING message_id, delivery_count, reconsume_times, delay_level, invisible_until, last_error,
                  redrive_count),
adv AS (UPDATE bench_offsets SET consume_offset = (SELECT max(id) FROM new)
        WHERE group_id = %(g)s AND topic_id = %(topic_id)s AND EXISTS (SELECT 1 FROM new))
SELECT l.message_id, m.key, m.body, m.content_type, m.properties::text, m.published_at,
       l.delivery_count, l.reconsume_times, l.delay_level, l.invisible_until,
       coalesce(m.origin_message_id, m.id), l.last_error, l.redrive_count
FROM ins l JOIN messages m ON m.id = l.message_id ORDER BY l.message_id"""


def drain(conn, receive: str, params: dict) -> tuple[int, float, float, float]:
    """(messages acked, seconds, receive seconds, ack seconds) until ``receive`` returns nothing."""
    from redelivery.store import statements as S

    start, receiving, acking, total = time.perf_counter(), 0.0, 0.0, 0
    while True:
        began = time.perf_counter()
        with conn.transaction():
            rows = conn.execute(receive, params).fetchall()
        received = time.perf_counter()
        receiving += received - began
        if not rows:
            return total, time.perf_counter() - start, receiving, acking
        ids, counts = [r[0] for r in rows], [r[6] for r in rows]
        with conn.transaction():
            ack = {"group_id": params["group_id"], "ids": ids, "counts": counts, "count_stale": True}
            total += conn.execute(S.ACK, ack).fetchone()[0]
        acking += time.perf_counter() - received


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from redelivery.store import db
    from redelivery.store import statements as S

    url = database()
    db.migrate(url)
    rates: dict[str, list[float]] = {"READY rows (today)": [], "log + offset": []}
    for _ in range(args.rounds):
        for variant in rates:
            build(url, args.messages, state="READY")
            with db.connect(url, autocommit=True) as conn:
                g, topic = conn.execute("SELECT group_id, topic_id FROM subscriptions").fetchone()
                conn.execute("DROP TABLE IF EXISTS bench_offsets")
                conn.execute(
                    "CREATE TABLE bench_offsets (group_id int, topic_id int, consume_offset bigint, "
                    "PRIMARY KEY (group_id, topic_id))"
                )
                conn.execute("INSERT INTO bench_offsets VALUES (%s, %s, 0)", (g, topic))
                log = variant.startswith("log")
                if log:  # no READY row at all: the messages past the offset are the queue
                    conn.execute("DELETE FROM deliveries")
                    conn.execute("VACUUM ANALYZE deliveries")
                    conn.execute("CHECKPOINT")
                params = {
                    "group_id": g,
                    "topic_id": topic,
                    "max_messages": 500,
                    "invisible_duration": 60.0,
                    "at": None,
                }
                total, seconds, receiving, acking = drain(conn, LOG_RECEIVE if log else S.RECEIVE, params)
                conn.execute("DROP TABLE bench_offsets")
            assert total == args.messages, (variant, total)
            rates[variant].append(total / seconds)
            per = {"receive": receiving / total * 1e6, "ack": acking / total * 1e6}
            print(
                f"{variant:<20} {total / seconds:>9,.0f} messages/s  receive {per['receive']:5.1f} µs,"
                f" ack {per['ack']:5.1f} µs a message",
                flush=True,
            )
    today, log = (max(v) for v in rates.values())
    print(f"log + offset vs READY rows: {log / today:.2f}x the receive+ack rate (best of {args.rounds})")


if __name__ == "__main__":
    main()
