"""Receive+ack throughput against a plain PostgreSQL queue measured in the same run.

    make bench-receive
    .venv/bin/python bench/bench_receive.py [--messages 200000] [--rounds 3]

Both variants drain the same N messages (JSON bodies of about 220 B) in batches of 500 with one and
with two consumers (threads, a connection each), and decode every body with orjson as a consumer
needs it:

  plain queue   the baseline: a pgmq-shaped table (id, read count, visibility time, enqueued at,
                body; primary key plus an index on the visibility time) read with pgmq's statements:
                an UPDATE of the visibility time over ``FOR UPDATE SKIP LOCKED`` rows to receive,
                a DELETE by id to ack. One consumer group, no history, no per-receipt check.
  redelivery    ``Client.receive`` + ``Client.ack`` on the log: a receive takes the messages past
                the group's consume offset, inserts an INFLIGHT delivery row for each (delivery
                count 1, committed before it returns) and moves the offset, bodies decoded into
                ``ReceivedMessage``; the ack deletes the rows whose receipt matches (the message is
                then COMMITTED: below the offset, no row), after checking every receipt's topic.

  breaker       the same with a circuit breaker on the subscription (issue 41): each ack also
                counts its answers for the breaker (``COUNT_OUTCOMES``, in its transaction); a
                closed breaker never opens on acks. Its ratio to redelivery without one is the
                breaker's cost on the hot path.

Targets (issue 20): >= 1.0x the plain queue with 1 consumer and >= 1.2x with 2. Prints
messages/s for each variant and the ratio redelivery / plain queue (median of ``--rounds``,
variants alternating). Runs on a database of its own (redelivery_bench).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import orjson
from bench_tier import build, database

BATCH = 500
PLAIN_TABLE = """
DROP TABLE IF EXISTS bench_plain_queue;
CREATE TABLE bench_plain_queue (
    msg_id bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    read_ct int NOT NULL DEFAULT 0,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    vt timestamptz NOT NULL DEFAULT now(),
    message bytea NOT NULL);
CREATE INDEX bench_plain_queue_vt ON bench_plain_queue (vt)"""
PLAIN_FILL = """
INSERT INTO bench_plain_queue (message)
SELECT convert_to('{"n": ' || i || ', "payload": "' || repeat('x', 200) || '"}', 'UTF8')
FROM generate_series(1, %(n)s) i"""
# pgmq's read and delete, as a consumer with a 60 s visibility timeout runs them.
PLAIN_READ = """
WITH cte AS (SELECT msg_id FROM bench_plain_queue WHERE vt <= clock_timestamp()
             ORDER BY msg_id LIMIT %(n)s FOR UPDATE SKIP LOCKED)
UPDATE bench_plain_queue m SET vt = clock_timestamp() + interval '60 seconds', read_ct = read_ct + 1
FROM cte WHERE m.msg_id = cte.msg_id
RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.vt, m.message"""
PLAIN_DELETE = "DELETE FROM bench_plain_queue WHERE msg_id = ANY(%(ids)s) RETURNING msg_id"


def build_plain(url: str, n: int) -> None:
    """A fresh plain queue holding ``n`` messages, vacuumed, as ``bench_tier.build`` leaves its tables."""
    from redelivery.store import db

    with db.connect(url, autocommit=True) as conn:
        for statement in PLAIN_TABLE.split(";"):
            conn.execute(statement)
        conn.execute(PLAIN_FILL, {"n": n})
        conn.execute("VACUUM ANALYZE bench_plain_queue")
        conn.execute("CHECKPOINT")


def plain_consumer(url: str) -> int:
    """Drain the plain queue: read a batch, decode the bodies, delete the batch; messages deleted."""
    from redelivery.store import db

    done = 0
    with db.connect(url, autocommit=True) as conn:
        while True:
            rows = conn.execute(PLAIN_READ, {"n": BATCH}).fetchall()
            if not rows:
                return done
            bodies = [orjson.loads(r[4]) for r in rows]
            assert len(bodies) == len(rows)
            done += len(conn.execute(PLAIN_DELETE, {"ids": [r[0] for r in rows]}).fetchall())


def redelivery_consumer(url: str, config=None) -> int:
    """Drain the bench topic with the client: receive (bodies decoded), ack; messages acked."""
    from redelivery.client import Client

    done = 0
    with Client(url, config) as client:
        while True:
            got = client.receive("bench", "bench", BATCH, 60)
            if not got:
                return done
            done += client.ack("bench", got)


def breaker_consumer(url: str) -> int:
    """``redelivery_consumer`` with a breaker on the bench subscription."""
    from redelivery.config import RedeliveryConfig, cached_config

    config = cached_config().model_dump(exclude_unset=True)
    config["policies"] = [*config.get("policies", []), {"topic": "bench", "group": "bench", "breaker": {}}]
    return redelivery_consumer(url, RedeliveryConfig.model_validate(config))


def rate(url: str, consumer, consumers: int, n: int) -> float:
    """Messages per second for ``consumers`` threads running ``consumer`` until ``n`` are acked."""
    counts = [0] * consumers

    def work(i: int) -> None:
        counts[i] = consumer(url)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(consumers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    assert sum(counts) == n, (consumer.__name__, sum(counts), n)
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3, help="runs per variant; the median is reported")
    args = parser.parse_args()
    from redelivery.store import db

    url = database()
    db.migrate(url)
    variants = {
        "plain queue": (lambda: build_plain(url, args.messages), plain_consumer),
        "redelivery": (lambda: build(url, args.messages, state="READY"), redelivery_consumer),
        "breaker": (lambda: build(url, args.messages, state="READY"), breaker_consumer),
    }
    print(
        f"receive+ack of {args.messages:,} messages, batches of {BATCH}, bodies decoded; "
        f"median of {args.rounds} rounds"
    )
    print(f"{'consumers':>9} {'plain queue':>14} {'redelivery':>14} {'ratio':>7}  target  {'breaker':>14}")
    for consumers, target in ((1, 1.0), (2, 1.2)):
        rates: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (fill, consumer) in variants.items():
                fill()
                rates[name].append(rate(url, consumer, consumers, args.messages))
        plain, ours, breaker = (statistics.median(rates[name]) for name in variants)
        verdict = "met" if ours / plain >= target else "MISSED"
        print(
            f"{consumers:>9} {plain:>10,.0f} m/s {ours:>10,.0f} m/s {ours / plain:>6.2f}x"
            f"  >= {target:.1f}x: {verdict}  {breaker:>10,.0f} m/s ({breaker / ours:.2f}x without)",
            flush=True,
        )
    with db.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_plain_queue")


if __name__ == "__main__":
    main()
