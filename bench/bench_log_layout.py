"""Receive + ack in the brokers' layout, two ways (issue 20): the one the product uses, and state batches.

    .venv/bin/python bench/bench_log_layout.py [--messages 200000] [--rounds 3] [--fail 0.1]

Three variants drain the same N messages (JSON bodies of about 220 B) in batches of 500, with one
and with two consumers (threads, a connection each), in raw SQL (no client), every body decoded
with orjson as a consumer needs it:

  plain queue      the baseline of bench_receive.py: a pgmq-shaped table, UPDATE ... SKIP LOCKED
                   to receive, DELETE by id to ack.
  row per lease    the product's statements (statements.RECEIVE, statements.ACK): a log and a
                   consume offset per (group, topic); a receive locks the offset, INSERTs an
                   INFLIGHT delivery row per message past it (delivery count 1) and moves the
                   offset; an ack DELETEs the row (guarded by its delivery count).
  state batches    a prototype: the same log and offset, but a receive INSERTs one row for the
                   whole leased range (first id, last id, delivery count, lease: Kafka's
                   share-group state batch, KIP-932); an answer deletes the ranges it touches and
                   writes back the runs of messages it did not answer, so a range splits only where
                   messages were answered differently.

Before the layout changed, a fourth variant ran today's statements of then (a READY delivery row
per message and group, updated to INFLIGHT and kept as COMMITTED): docs/ARCHITECTURE.md keeps
those figures.

With ``--fail F`` a fraction F of each batch (chosen by message id, the same in every variant) is
answered with a retry instead of an ack, before the ack of the rest: today and row-per-lease
UPDATE the delivery row to WAITING_RETRY; state batches split the range and give each failed
message a WAITING_RETRY delivery row (a retried message leaves the batch for good). Prints
messages/s, the median of ``--rounds`` (variants alternating), and each variant's ratio to the
plain queue of the same run. Runs on the benchmark database (redelivery_bench).
"""

from __future__ import annotations

import argparse
import statistics

import orjson
from bench_receive import BATCH, build_plain, plain_consumer, rate
from bench_tier import build, database

OFFSETS = """
DROP TABLE IF EXISTS bench_offsets, bench_batches;
CREATE TABLE bench_offsets (group_id int, topic_id int, consume_offset bigint NOT NULL,
                            PRIMARY KEY (group_id, topic_id));
CREATE TABLE bench_batches (batch_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, group_id int NOT NULL,
                            topic_id int NOT NULL, first_id bigint NOT NULL, last_id bigint NOT NULL,
                            delivery_count int NOT NULL, invisible_until timestamptz NOT NULL);
CREATE INDEX bench_batches_range ON bench_batches (group_id, topic_id, last_id);
CREATE INDEX bench_batches_lease ON bench_batches (invisible_until)"""

_PAST_OFFSET = """
WITH sub AS (SELECT consume_offset FROM bench_offsets
             WHERE group_id = %(group_id)s AND topic_id = %(topic_id)s FOR UPDATE),
new AS (SELECT m.id, m.key, m.body, m.content_type, m.properties, m.published_at FROM messages m
        WHERE m.topic_id = %(topic_id)s AND m.id > (SELECT consume_offset FROM sub)
        ORDER BY m.id LIMIT %(max_messages)s),
moved AS (UPDATE bench_offsets SET consume_offset = (SELECT max(id) FROM new)
          WHERE group_id = %(group_id)s AND topic_id = %(topic_id)s AND EXISTS (SELECT 1 FROM new))"""
_LEASED = "now() + make_interval(secs => %(invisible_duration)s)"

RETRY = """
UPDATE deliveries d SET state = 'WAITING_RETRY', reconsume_times = d.reconsume_times + 1, delay_level = 1,
    due_at = now() + interval '10 seconds', invisible_until = NULL, last_error = 'bench', updated_at = now()
FROM unnest(%(ids)s::bigint[], %(counts)s::int[]) AS i(message_id, delivery_count)
WHERE d.topic_id = %(topic_id)s AND d.group_id = %(group_id)s AND d.message_id = i.message_id
  AND d.state::text = 'INFLIGHT' AND d.delivery_count = i.delivery_count"""

#: State batches: one row for the leased range.
BATCH_RECEIVE = f"""{_PAST_OFFSET},
ins AS (INSERT INTO bench_batches (group_id, topic_id, first_id, last_id, delivery_count, invisible_until)
        SELECT %(group_id)s, %(topic_id)s, min(id), max(id), 1, {_LEASED} FROM new HAVING count(*) > 0)
SELECT n.id, n.key, n.body, n.content_type, n.properties::text, n.published_at, 1 AS delivery_count
FROM new n ORDER BY n.id"""
#: Answer receipts of leased ranges: the ranges they touch are deleted and the runs of messages
#: they leave unanswered written back; with %(retry)s the answered messages get a WAITING_RETRY row.
BATCH_ANSWER = """
WITH r AS (SELECT * FROM unnest(%(ids)s::bigint[], %(counts)s::int[]) AS r(id, delivery_count)),
hit AS (SELECT b.* FROM bench_batches b
        WHERE b.group_id = %(group_id)s AND b.topic_id = %(topic_id)s
          AND b.last_id >= (SELECT min(id) FROM r) AND b.first_id <= (SELECT max(id) FROM r)
          AND EXISTS (SELECT 1 FROM r WHERE r.id BETWEEN b.first_id AND b.last_id
                                        AND r.delivery_count = b.delivery_count)
        FOR UPDATE),
members AS (SELECT h.batch_id, m.id, m.published_at, r.id IS NOT NULL AS answered
            FROM hit h JOIN messages m ON m.topic_id = h.topic_id AND m.id BETWEEN h.first_id AND h.last_id
            LEFT JOIN r ON r.id = m.id AND r.delivery_count = h.delivery_count),
runs AS (SELECT batch_id, min(id) AS first_id, max(id) AS last_id
         FROM (SELECT batch_id, id, answered,
                      row_number() OVER (PARTITION BY batch_id ORDER BY id)
                      - row_number() OVER (PARTITION BY batch_id, answered ORDER BY id) AS run
               FROM members) x
         WHERE NOT answered GROUP BY batch_id, run),
gone AS (DELETE FROM bench_batches b USING hit h WHERE b.batch_id = h.batch_id),
kept AS (INSERT INTO bench_batches (group_id, topic_id, first_id, last_id, delivery_count, invisible_until)
         SELECT h.group_id, h.topic_id, runs.first_id, runs.last_id, h.delivery_count, h.invisible_until
         FROM runs JOIN hit h USING (batch_id)),
retried AS (INSERT INTO deliveries (message_id, group_id, topic_id, published_at, state, delivery_count,
                                    reconsume_times, delay_level, due_at, last_error)
            SELECT m.id, h.group_id, h.topic_id, m.published_at, 'WAITING_RETRY', h.delivery_count, 1, 1,
                   now() + interval '10 seconds', 'bench'
            FROM members m JOIN hit h USING (batch_id) WHERE m.answered AND %(retry)s)
SELECT count(*) FROM members WHERE answered"""


def failing(ids: list[int], fraction: float) -> set[int]:
    """The ids answered with a retry: the same ones in every variant."""
    return {i for i in ids if fraction and (i * 2654435761) % 1000 < fraction * 1000}


def layout_consumer(receive: str, ack: str, retry: str, fraction: float):
    """A consumer of one variant: receive, decode, retry the failing ones, ack the rest."""

    def drain(url: str) -> int:
        from redelivery.store import db

        done = 0
        with db.connect(url, autocommit=True) as conn:
            group_id, topic_id = conn.execute("SELECT group_id, topic_id FROM subscriptions").fetchone()
            params = {"group_id": group_id, "topic_id": topic_id, "max_messages": BATCH,
                      "invisible_duration": 60.0, "at": None}  # fmt: skip
            while True:
                with conn.transaction():
                    rows = conn.execute(receive, params).fetchall()
                if not rows:
                    return done
                bodies = [orjson.loads(r[2]) for r in rows]
                assert len(bodies) == len(rows)
                fail = failing([r[0] for r in rows], fraction)
                for answer, chosen in ((retry, fail), (ack, None)):
                    picked = [r for r in rows if (r[0] in fail) == (chosen is not None)]
                    if not picked:
                        continue
                    args = {**params, "ids": [r[0] for r in picked], "counts": [r[6] for r in picked],
                            "topic_ids": [topic_id] * len(picked)}  # fmt: skip
                    args |= {"count_stale": True, "retry": chosen is not None}
                    with conn.transaction():
                        answered = conn.execute(answer, args)
                        answered = answered.fetchone()[0] if answered.description else answered.rowcount
                    assert answered == len(picked), (answered, len(picked))
                    done += len(picked)

    return drain


def fill_log(url: str, n: int) -> None:
    """The topic's messages, no delivery row, an offset before the first message."""
    from redelivery.store import db

    build(url, n, state="READY")
    with db.connect(url, autocommit=True) as conn:
        for statement in OFFSETS.split(";"):
            conn.execute(statement)
        conn.execute("INSERT INTO bench_offsets SELECT group_id, topic_id, 0 FROM subscriptions")
        conn.execute("VACUUM ANALYZE deliveries, messages")
        conn.execute("CHECKPOINT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fail", type=float, default=0.0, help="fraction of messages answered with a retry")
    args = parser.parse_args()
    from redelivery.store import db
    from redelivery.store import statements as S

    url = database()
    db.migrate(url)
    n, fail = args.messages, args.fail
    variants = {
        "plain queue": (lambda: build_plain(url, n), plain_consumer),
        "row per lease": (lambda: fill_log(url, n), layout_consumer(S.RECEIVE, S.ACK, RETRY, fail)),
        "state batches": (
            lambda: fill_log(url, n),
            layout_consumer(BATCH_RECEIVE, BATCH_ANSWER, BATCH_ANSWER, fail),
        ),
    }
    print(f"receive+ack of {n:,} messages, batches of {BATCH}, bodies decoded, {fail:.0%} retried;"
          f" median of {args.rounds} rounds, messages/s (ratio to the plain queue)")  # fmt: skip
    print(f"{'consumers':>9}" + "".join(f"{name:>24}" for name in variants))
    for consumers in (1, 2):
        rates: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (fill, consumer) in variants.items():
                fill()
                rates[name].append(rate(url, consumer, consumers, n))
        medians = {name: statistics.median(r) for name, r in rates.items()}
        plain = medians["plain queue"]
        print(
            f"{consumers:>9}" + "".join(f"{m:>14,.0f} ({m / plain:4.2f}x)" for m in medians.values()),
            flush=True,
        )
    with db.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_plain_queue, bench_offsets, bench_batches")


if __name__ == "__main__":
    main()
