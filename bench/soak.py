"""Does the store stay the same size under a steady load? A soak of publish, consume and retry.

    .venv/bin/python bench/soak.py [--minutes 20] [--rate 200] [--retention 2m] [--partition 1m]

One publisher sends ``--rate`` messages a second (batches of 100) to one topic with two subscribed
groups; one consumer per group receives batches of 200 (lease 30 s), asks for a retry of about 10%
of them at the 10 s level (``reconsume_later(delay=10)``) and acks the rest; the ``seconds`` tier
window runs every 2 s in this process and the maintenance job (``redelivery_maintenance``'s
cleanup) every 20 s, both ending at the database's clock. Every 30 s the database size is sampled.
After ``--minutes`` the publisher stops and the consumers drain what is left.

What it prints: the size over time; the verdict on "after the first 5 minutes the database size
stays within 25% of its value at minute 5" (issue 20: the ratio of the largest later sample to the
minute-5 sample is the figure, 1.25 the bound); the largest relations at the end; and whether every
published message was acknowledged exactly once per group (the consumers' own ledger: each
message's final ack, as the API answered it, against the ids ``publish`` returned).

Runs on a database of its own (``redelivery_soak``, dropped and made again at the start) of the
embedded server, or ``REDELIVERY_SOAK_DATABASE_URL``. ``--retention`` and ``--partition`` set
``retention.messages`` and the log's partition span when the config knows them; on a layout that
has neither (before issue 20) the script says so and runs without them: that run is the baseline
that shows the growth.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from collections import Counter
from datetime import datetime

import psycopg

TOPIC, GROUPS = "soak", ("soak-a", "soak-b")
BODY_PAD = "x" * 200


def fresh_database() -> str:
    """The URL of an empty, migrated database for the soak."""
    from redelivery.store import db, embedded, maintenance

    if os.environ.get("REDELIVERY_SOAK_DATABASE_URL"):
        url = os.environ["REDELIVERY_SOAK_DATABASE_URL"]
    else:
        embedded.ensure_running(("redelivery", "airflow"))
        with psycopg.connect(embedded.url("postgres"), autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS redelivery_soak WITH (FORCE)")
            admin.execute("CREATE DATABASE redelivery_soak")
        url = embedded.url("redelivery_soak")
    db.migrate(url)
    with db.connect(url, autocommit=True) as conn:
        maintenance.empty_state_store(conn)
    return url


def soak_config(retention: str, partition: str):
    """The config file's settings with the soak's retention where the config has such keys."""
    from redelivery.config import cached_config

    base = cached_config().model_dump()
    known = base["retention"]
    applied = []
    if "messages" in known:
        known["messages"] = retention
        applied.append(f"retention.messages={retention}")
    if "partition" in known:
        known["partition"] = partition
        applied.append(f"retention.partition={partition}")
    from redelivery.config import RedeliveryConfig

    return RedeliveryConfig.model_validate(base), applied


class Soak:
    """The load's threads and what they saw."""

    def __init__(self, url: str, config, rate: int):
        self.url, self.config, self.rate = url, config, rate
        self.publishing, self.stopping = threading.Event(), threading.Event()
        self.published: list[int] = []
        self.acked = {group: Counter() for group in GROUPS}
        self.retried = Counter()
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def client(self):
        from redelivery.client import Client

        return Client(self.url, self.config)

    def guarded(self, name: str, body) -> threading.Thread:
        def run():
            try:
                body()
            except Exception as error:  # noqa: BLE001 (a soak reports, and stops)
                self.errors.append(f"{name}: {type(error).__name__}: {error}")
                self.stopping.set()
                self.publishing.clear()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        return thread

    def publisher(self) -> None:
        client, sent, began = self.client(), 0, time.monotonic()
        while self.publishing.is_set():
            bodies = [{"n": sent + i, "payload": BODY_PAD} for i in range(100)]
            ids = client.publish(TOPIC, bodies)
            with self.lock:
                self.published.extend(ids)
            sent += len(ids)
            time.sleep(max(0.0, began + sent / self.rate - time.monotonic()))

    def consumer(self, group: str) -> None:
        client, chance = self.client(), random.Random(group)
        while not self.stopping.is_set():
            batch = client.receive(group, TOPIC, max_messages=200, invisible_duration=30)
            if not batch:
                time.sleep(0.2)
                continue
            failing = [m for m in batch if chance.random() < 0.10]
            failed = {m.message_id for m in failing}
            passing = [m for m in batch if m.message_id not in failed]
            if failing:
                self.retried[group] += client.reconsume_later(group, failing, delay=10, error="soak")
            if passing and client.ack(group, passing) != len(passing):
                for message in passing:  # find which: a stale one was not acknowledged
                    self.acked[group][message.message_id] += client.ack(group, message)
                continue
            for message in passing:
                self.acked[group][message.message_id] += 1

    def clock(self, every: float, job) -> None:
        from redelivery.store import db

        with db.connect(self.url, autocommit=True) as conn:
            while not self.stopping.wait(every):
                job(conn, conn.execute("SELECT now()").fetchone()[0])

    def tier(self, conn, now: datetime) -> None:
        from redelivery.tiers.run import TierRunRequest, run_tier

        run_tier(
            TierRunRequest(tier="seconds", window_end=now, run_key=f"soak {now}"),
            url=self.url,
            config=self.config,
        )

    def maintenance(self, conn, now: datetime) -> None:
        from redelivery.store.maintenance import cleanup

        cleanup(conn, self.config)

    def finished(self) -> bool:
        with self.lock:
            published = set(self.published)
        return all(set(self.acked[group]) >= published for group in GROUPS)


def size(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]


def largest_relations(url: str, count: int = 6) -> list[tuple[str, int]]:
    """The schema's tables (with their indexes and TOAST; a partitioned table with its partitions)."""
    with psycopg.connect(url) as conn:
        return conn.execute(
            """SELECT coalesce(p.relname, c.relname), sum(pg_total_relation_size(c.oid))::bigint
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               LEFT JOIN pg_inherits i ON i.inhrelid = c.oid LEFT JOIN pg_class p ON p.oid = i.inhparent
               WHERE n.nspname LIKE 'redelivery%%' AND c.relkind = 'r'
               GROUP BY 1 ORDER BY 2 DESC LIMIT %s""",
            (count,),
        ).fetchall()


def mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--rate", type=int, default=200, help="messages published a second")
    parser.add_argument("--retention", default="2m", help="retention.messages, where the config has it")
    parser.add_argument("--partition", default="1m", help="the log's partition span, where the config has it")
    parser.add_argument("--drain-minutes", type=float, default=3)
    args = parser.parse_args()

    url = fresh_database()
    config, applied = soak_config(args.retention, args.partition)
    print("retention:", ", ".join(applied) or "this layout has no message retention (baseline)", flush=True)
    from redelivery.client import Client

    with Client(url, config) as admin:
        admin.create_topic(TOPIC)
        for group in GROUPS:
            admin.create_group(group)
            admin.subscribe(group, TOPIC)

    soak = Soak(url, config, args.rate)
    soak.publishing.set()
    threads = [soak.guarded("publisher", soak.publisher)]
    threads += [soak.guarded(f"consumer {g}", lambda g=g: soak.consumer(g)) for g in GROUPS]
    threads += [soak.guarded("tier", lambda: soak.clock(2, soak.tier))]
    threads += [soak.guarded("maintenance", lambda: soak.clock(20, soak.maintenance))]

    began, samples = time.monotonic(), []
    end = began + args.minutes * 60
    while time.monotonic() < end and not soak.stopping.is_set():
        time.sleep(min(30, max(0.0, end - time.monotonic())))
        minute = (time.monotonic() - began) / 60
        samples.append((minute, size(url)))
        print(
            f"minute {minute:5.1f}: {mb(samples[-1][1]):>10}, {len(soak.published):,} published", flush=True
        )
    soak.publishing.clear()
    drain_end = time.monotonic() + args.drain_minutes * 60
    while not soak.finished() and time.monotonic() < drain_end and not soak.stopping.is_set():
        time.sleep(1)
    soak.stopping.set()
    for thread in threads:
        thread.join(timeout=60)

    print("\n".join(["errors:", *soak.errors]) if soak.errors else "errors: none")
    report(url, soak, samples)


def report(url: str, soak: Soak, samples: list[tuple[float, int]]) -> None:
    published = set(soak.published)
    print(
        f"published {len(soak.published):,} messages ({len(published):,} ids), "
        f"retries asked {dict(soak.retried)}"
    )
    for group in GROUPS:
        acked = soak.acked[group]
        twice = sum(1 for n in acked.values() if n > 1)
        missing = len(published - set(acked))
        foreign = len(set(acked) - published)
        verdict = "exactly once" if not (twice or missing or foreign) else "VIOLATED"
        verdict = verdict if not soak.errors else f"{verdict} (the soak stopped on an error)"
        print(
            f"  {group}: {len(acked):,} acknowledged; twice {twice}, never {missing}, "
            f"unknown {foreign}: {verdict}"
        )
    later = [s for m, s in samples if m > 5]
    at_five = next((s for m, s in samples if m >= 5), None)
    if at_five and later:
        ratio = max(later) / at_five
        verdict = "flat (within 25%)" if ratio <= 1.25 else "GROWS"
        print(f"size at minute 5 {mb(at_five)}, largest later {mb(max(later))}, end {mb(samples[-1][1])}:")
        print(f"  {ratio:.2f}x the minute-5 size: {verdict}")
    print("largest tables: " + ", ".join(f"{name} {mb(n)}" for name, n in largest_relations(url)))


if __name__ == "__main__":
    main()
