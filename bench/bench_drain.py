"""Drain in production conditions (issue 29): redelivery against PGMQ and the plain queue, one run.

    .venv/bin/python bench/bench_drain.py [--messages 1000000] [--batch 500] [--retry-share 0.1]
                                          [--consumers 1,2] [--quick]

Each variant is filled with ``--messages`` JSON bodies of about 220 B, then drained by 1 and by 2
consumers (threads, a connection each) in batches of ``--batch``, every body decoded with orjson;
a share ``--retry-share`` of the messages (chosen by id, the same in every variant) is answered
with a retry instead of an ack, before the ack of the rest of the batch:

  redelivery   published through ``Client.publish`` in batches of 1,000 (the log then vacuumed
               and analyzed, as autovacuum does after such an insert); ``deliveries`` analyzed
               while empty (as autovacuum leaves it after a drain: reltuples 0); drained with
               ``Client.receive`` + ``Client.ack``, the retried share with ``Client.nack``.
  pgmq         PGMQ's own SQL functions, installed into this plain PostgreSQL (no CREATE
               EXTENSION) from the SQL the PyPI package ``pgmq`` ships (``pgmq/sql/pgmq.sql``, PGMQ
               1.13.0 in pgmq 1.1.4) with its installer ``pgmq.install.install_pgmq_from_sql``;
               ``pgmq.create``, one INSERT ... SELECT into its queue table (vacuumed, analyzed),
               then its Python client's statements: ``pgmq.read`` (visibility 60 s),
               ``pgmq.archive`` of the batch's ids, ``pgmq.set_vt`` for the retried share. Without
               the package this variant is left out and the plain queue stands for it.
  plain queue  bench_receive.py's pgmq-shaped table and statements (UPDATE ... SKIP LOCKED to
               read, DELETE by id to ack), filled the same way; a retry is pgmq's set_vt statement.

Retries wait past the drain in every variant, so each message is received once: redelivery's
retried messages stay WAITING_RETRY (no tier run promotes them during the drain) and the baselines'
get a visibility of an hour. Autovacuum stays on with its defaults (``SHOW autovacuum`` is printed;
the run refuses to start with it off), and each variant's tables are dropped after its drain.

Every RECEIVE, ACK and retry call is timed. Prints throughput (messages/s, retries included),
p50 / p90 per-batch RECEIVE and ACK latency (ms) in the first and the last 10% of the drain
(batches by the number of messages received before them), last / first of the p50s, the retry
call's p50 apart, the seconds spent in each call against the drain's wall time, the ratios to the
baselines with their targets (receive + ack >= 1.2x PGMQ read + archive, >= 1.0x / 1.2x the plain
queue with 1 / 2 consumers; flat: a batch's p50 RECEIVE + ACK in the last 10% within 1.2x of the
first 10%), and one JSON line ``DRAIN_SUMMARY``.
For redelivery it also prints ``EXPLAIN (ANALYZE, BUFFERS)`` of the ACK of the batch at 95% of the
drain (that batch's real ack, its latency left out) with the planner's view of ``deliveries``.
Runs on a database of its own (redelivery_bench_drain).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field

import orjson
from bench_log_layout import failing
from bench_receive import PLAIN_DELETE, PLAIN_FILL, PLAIN_READ, PLAIN_TABLE

DATABASE = "redelivery_bench_drain"
TOPIC = GROUP = QUEUE = "bench"
PUBLISH_BATCH = 1_000
RETRY_WAIT = 3_600  # seconds: a retried message of a baseline waits past the drain
LEASE = 60  # seconds: every variant's lease / visibility timeout
QUICK_MESSAGES = 20_000
EXPLAIN_AT = 0.95  # the batch whose ACK is explained: the one holding this share of the drain
TARGETS = {1: {"pgmq": 1.2, "plain queue": 1.0}, 2: {"pgmq": 1.2, "plain queue": 1.2}}
FLAT = 1.2

# pgmq's set_vt (what a consumer of a pgmq-shaped queue runs to retry later), on the plain queue.
PLAIN_RETRY = """
UPDATE bench_plain_queue SET vt = clock_timestamp() + make_interval(secs => %(seconds)s)
WHERE msg_id = ANY(%(ids)s) RETURNING msg_id"""
# The pgmq Python client's statements (pgmq._sql READ, ARCHIVE_BATCH, SET_VT_BATCH_INT).
PGMQ_READ = """SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
               FROM pgmq.read(queue_name=>%s::text, vt=>%s::integer, qty=>%s::integer)"""
PGMQ_ARCHIVE = "SELECT * FROM pgmq.archive(queue_name=>%s::text, msg_ids=>%s::bigint[])"
PGMQ_SET_VT = """SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
                 FROM pgmq.set_vt(queue_name=>%s::text, msg_ids=>%s::bigint[], vt=>%s::integer)"""
PGMQ_FILL = """
INSERT INTO pgmq.q_bench (vt, message)
SELECT now(), ('{"n": ' || i || ', "payload": "' || repeat('x', 200) || '"}')::jsonb
FROM generate_series(1, %(n)s) i"""
DELIVERIES_SEEN = """
SELECT c.reltuples::bigint, c.relpages, pg_relation_size(c.oid) / 8192, s.n_live_tup, s.n_dead_tup,
       s.autovacuum_count, s.autoanalyze_count
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = 'redelivery.deliveries'::regclass"""
LONG_ARRAY = re.compile(r"'\{(\d+),[\d,]*,(\d+)\}'")
SEEN_FIELDS = ("reltuples", "relpages", "pages", "live", "dead", "autovacuums", "autoanalyzes")


def database() -> str:
    from redelivery.store import embedded

    if os.environ.get("REDELIVERY_BENCH_DRAIN_DATABASE_URL"):
        return os.environ["REDELIVERY_BENCH_DRAIN_DATABASE_URL"]
    embedded.ensure_running((DATABASE,))
    return embedded.url(DATABASE)


def pgmq_sql() -> str | None:
    """Which PGMQ SQL the installed PyPI package ``pgmq`` ships, or None (not installed, or no SQL)."""
    try:
        dist = importlib.metadata.distribution("pgmq")
    except importlib.metadata.PackageNotFoundError:
        return None
    if not dist.locate_file("pgmq/sql/pgmq.sql").is_file():
        return None
    return f"PGMQ {dist.locate_file('pgmq/sql/VERSION').read_text().strip()} SQL of PyPI pgmq {dist.version}"


def sql(url: str, *statements: str, params: dict | None = None) -> list:
    """Run ``statements`` in autocommit on a connection of their own; the last one's rows."""
    from redelivery.store import db

    with db.connect(url, autocommit=True) as conn:
        for statement in statements:
            cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def settle_tables(url: str, tables: str) -> None:
    """What autovacuum does after a bulk insert (vacuum, analyze), then a checkpoint: the fill's
    writes stay out of the drain."""
    sql(url, f"VACUUM ANALYZE {tables}", "CHECKPOINT")


# ---- the three variants: fill(), then one consumer per thread --------------------------------------


class PlainConsumer:
    """bench_receive.py's plain queue, a retry being pgmq's set_vt statement."""

    def __init__(self, url: str, batch: int):
        from redelivery.store import db

        self.conn, self.batch = db.connect(url, autocommit=True), batch

    def receive(self) -> list:
        rows = self.conn.execute(PLAIN_READ, {"n": self.batch}).fetchall()
        assert len([orjson.loads(r[4]) for r in rows]) == len(rows)
        return rows

    @staticmethod
    def receipt(row) -> tuple[int, bool]:
        return row[0], row[1] == 1

    def retry(self, rows) -> int:
        ids = [r[0] for r in rows]
        return len(self.conn.execute(PLAIN_RETRY, {"ids": ids, "seconds": RETRY_WAIT}).fetchall())

    def ack(self, rows) -> int:
        return len(self.conn.execute(PLAIN_DELETE, {"ids": [r[0] for r in rows]}).fetchall())

    def close(self) -> None:
        self.conn.close()


class PlainQueue:
    name = "plain queue"
    consumer = PlainConsumer

    def fill(self, url: str, n: int) -> None:
        sql(url, *PLAIN_TABLE.split(";"), PLAIN_FILL, params={"n": n})
        settle_tables(url, "bench_plain_queue")

    def drop(self, url: str) -> None:
        sql(url, "DROP TABLE IF EXISTS bench_plain_queue")


class PgmqConsumer(PlainConsumer):
    """PGMQ's functions through its Python client's statements; jsonb decoded with orjson."""

    def __init__(self, url: str, batch: int):
        from psycopg.types.json import set_json_loads

        super().__init__(url, batch)
        set_json_loads(orjson.loads, self.conn)

    def receive(self) -> list:
        rows = self.conn.execute(PGMQ_READ, (QUEUE, LEASE, self.batch)).fetchall()
        assert all(r[5] is not None for r in rows)  # bodies decoded as they arrive
        return rows

    def retry(self, rows) -> int:
        return len(self.conn.execute(PGMQ_SET_VT, (QUEUE, [r[0] for r in rows], RETRY_WAIT)).fetchall())

    def ack(self, rows) -> int:
        return len(self.conn.execute(PGMQ_ARCHIVE, (QUEUE, [r[0] for r in rows])).fetchall())


class Pgmq(PlainQueue):
    name = "pgmq"
    consumer = PgmqConsumer

    def fill(self, url: str, n: int) -> None:
        """PGMQ's SQL installed afresh by the package's own installer (a second install on an
        existing schema is not supported: the schema goes first), a queue, ``n`` messages."""
        import psycopg
        from pgmq.install import install_pgmq_from_sql

        with psycopg.connect(url) as conn:
            conn.execute("DROP SCHEMA IF EXISTS pgmq CASCADE")
            conn.commit()
            install_pgmq_from_sql(conn=conn)
            conn.execute("SELECT pgmq.create(%s)", (QUEUE,))
            conn.execute(PGMQ_FILL, {"n": n})
            conn.commit()
        settle_tables(url, f"pgmq.q_{QUEUE}, pgmq.a_{QUEUE}")

    def drop(self, url: str) -> None:
        sql(url, "DROP SCHEMA IF EXISTS pgmq CASCADE")


class RedeliveryConsumer:
    """``Client.receive`` / ``ack`` / ``nack``; ``explain_ack`` acks a batch under EXPLAIN."""

    def __init__(self, url: str, batch: int):
        from redelivery.client import Client

        self.client, self.batch = Client(url), batch

    def receive(self) -> list:
        return self.client.receive(GROUP, TOPIC, self.batch, LEASE)

    @staticmethod
    def receipt(message) -> tuple[int, bool]:
        return message.message_id, message.delivery_count == 1

    def retry(self, messages) -> int:
        return self.client.nack(GROUP, messages, "bench")

    def ack(self, messages) -> int:
        return self.client.ack(GROUP, messages)

    def explain_ack(self, messages) -> dict:
        """The ACK statement of ``Client.ack`` for ``messages``, run under EXPLAIN (ANALYZE,
        BUFFERS) with the same parameters (it acks them), and what the planner knew of
        ``deliveries`` then."""
        from redelivery.store import statements as S

        conn = self.client.conn
        seen = dict(zip(SEEN_FIELDS, conn.execute(DELIVERIES_SEEN).fetchone(), strict=True))
        group_id = conn.execute("SELECT group_id FROM subscriptions").fetchone()[0]
        ids = [m.message_id for m in messages]
        # the parameters Client.ack builds
        params = {"group_id": group_id, **self.client.consumer._receipt_params(messages), "count_stale": True}
        with conn.transaction():
            plan = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + S.ACK, params, prepare=False)]
        left = conn.execute("SELECT count(*) FROM deliveries WHERE message_id = ANY(%s)", (ids,)).fetchone()
        assert left == (0,), f"the explained ACK left {left} of {len(ids)} deliveries"
        return {"plan": plan, "deliveries": seen, "receipts": len(ids)}

    def close(self) -> None:
        self.client.close()


class Redelivery:
    name = "redelivery"
    consumer = RedeliveryConsumer

    def fill(self, url: str, n: int) -> None:
        from redelivery.client import Client
        from redelivery.store import db, maintenance

        with db.connect(url, autocommit=True) as conn:
            maintenance.empty_state_store(conn)
        with Client(url) as client:
            client.create_topic(TOPIC)
            client.create_group(GROUP)
            client.subscribe(GROUP, TOPIC)
            for start in range(0, n, PUBLISH_BATCH):
                bodies = [{"n": i, "payload": "x" * 200} for i in range(start, min(n, start + PUBLISH_BATCH))]
                client.publish(TOPIC, bodies)
        settle_tables(url, "redelivery.messages")
        seen = "SELECT reltuples, relpages FROM pg_class WHERE oid = 'redelivery.deliveries'::regclass"
        seen = sql(url, "ANALYZE redelivery.deliveries", seen)  # empty: reltuples 0, as after a drain
        assert seen == [(0, 0)], f"deliveries is not analyzed empty: {seen}"

    def drop(self, url: str) -> None:
        from redelivery.store import db, maintenance

        with db.connect(url, autocommit=True) as conn:
            maintenance.empty_state_store(conn)


# ---- the drain --------------------------------------------------------------------------------------


@dataclass
class Batch:
    """One batch of a drain: messages received before it, its size, its calls' seconds (``ack``
    None for the batch acked under EXPLAIN, ``retry`` None for a batch with nothing to retry)."""

    before: int
    size: int
    receive: float
    ack: float | None = None
    retry: float | None = None


@dataclass
class Drain:
    n: int
    batches: list[Batch] = field(default_factory=list)
    received: int = 0
    seconds: float = 0.0
    explained: dict | None = None
    autovacuum: dict = field(default_factory=dict)

    def rate(self) -> float:
        return self.n / self.seconds

    def latencies(self, last: bool) -> dict[str, list[float]]:
        """Milliseconds per batch in the first (or the last) 10% of the drain."""
        part = [b for b in self.batches if (b.before >= 0.9 * self.n if last else b.before < 0.1 * self.n)]
        timed = [b for b in part if b.ack is not None]
        return {
            "receive": [b.receive * 1000 for b in timed],
            "ack": [b.ack * 1000 for b in timed],
            "batch": [(b.receive + b.ack) * 1000 for b in timed],
            "retry": [b.retry * 1000 for b in part if b.retry is not None],
        }

    def spent(self) -> dict[str, float]:
        """Seconds spent in each call over the drain, all consumers added up."""
        return {
            "receive": sum(b.receive for b in self.batches),
            "ack": sum(b.ack or 0 for b in self.batches),
            "retry": sum(b.retry or 0 for b in self.batches),
        }


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def timed(call, *args) -> tuple[object, float]:
    start = time.perf_counter()
    out = call(*args)
    return out, time.perf_counter() - start


def consume(variant, url: str, batch: int, share: float, drain: Drain, lock: threading.Lock) -> None:
    """One consumer thread: receive, retry the share chosen by id, ack the rest, until empty."""
    consumer = variant.consumer(url, batch)
    explain_at = int(EXPLAIN_AT * drain.n)
    try:
        while True:
            got, seconds = timed(consumer.receive)
            if not got:
                return
            with lock:
                this = Batch(drain.received, len(got), seconds)
                drain.received += len(got)
                drain.batches.append(this)
            receipts = [consumer.receipt(m) for m in got]
            fail = failing([i for i, first in receipts if first], share)
            retried = [m for m, (i, _) in zip(got, receipts, strict=True) if i in fail]
            acked = [m for m, (i, _) in zip(got, receipts, strict=True) if i not in fail]
            if retried:
                done, this.retry = timed(consumer.retry, retried)
                assert done == len(retried), (done, len(retried))
            if this.before <= explain_at < this.before + len(got) and hasattr(consumer, "explain_ack"):
                drain.explained = consumer.explain_ack(acked)
                continue
            done, this.ack = timed(consumer.ack, acked)
            assert done == len(acked), (done, len(acked))
    finally:
        consumer.close()


def autovacuum_counts(url: str) -> dict[str, int]:
    """{table: autovacuum and autoanalyze runs so far}."""
    counts = (
        "SELECT schemaname || '.' || relname, autovacuum_count + autoanalyze_count FROM pg_stat_user_tables"
    )
    return dict(sql(url, counts))


def drain(variant, url: str, n: int, consumers: int, batch: int, share: float) -> Drain:
    """Fill ``variant`` with ``n`` messages and drain it with ``consumers`` threads."""
    variant.fill(url, n)
    result, lock = Drain(n), threading.Lock()
    autovacuum_before = autovacuum_counts(url)
    threads = [
        threading.Thread(target=consume, args=(variant, url, batch, share, result, lock))
        for _ in range(consumers)
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - start
    after = autovacuum_counts(url)
    result.autovacuum = {
        t: k - autovacuum_before.get(t, 0) for t, k in after.items() if k > autovacuum_before.get(t, 0)
    }
    assert result.received == n, (variant.name, result.received, n)
    variant.drop(url)
    return result


# ---- the report -------------------------------------------------------------------------------------


def figures(result: Drain) -> dict:
    """Throughput, p50 / p90 of RECEIVE and ACK (ms) in the first and the last 10%, last / first."""
    first, last = result.latencies(last=False), result.latencies(last=True)
    out = {"msgs_per_s": round(result.rate())}
    for what in ("receive", "ack", "retry"):
        out[f"{what}_ms"] = {
            part: {"p50": round(quantile(values[what], 0.5), 2), "p90": round(quantile(values[what], 0.9), 2)}
            for part, values in (("first", first), ("last", last))
        }
    out["last_over_first"] = {
        what: round(quantile(last[what], 0.5) / quantile(first[what], 0.5), 2)
        for what in ("receive", "ack", "batch")
    }
    out["seconds"] = {"wall": round(result.seconds, 2), **{k: round(v, 2) for k, v in result.spent().items()}}
    out["autovacuum_runs"] = result.autovacuum
    return out


def plan_summary(explained: dict) -> dict:
    """The scan of ``deliveries`` in an explained ACK, the rows its join filter removed, its time."""
    plan = explained["plan"]
    scans = [line.strip().split("  (")[0].lstrip("-> ") for line in plan if " on deliveries" in line]
    removed = sum(int(line.split(":")[1]) for line in plan if "Rows Removed by Join Filter" in line)
    execution = next((line.split(":")[1].strip() for line in plan if line.startswith("Execution Time")), "?")
    return {"scans": scans, "rows_removed_by_join_filter": removed, "execution": execution,
            "receipts": explained["receipts"], "deliveries_then": explained["deliveries"]}  # fmt: skip


def print_rows(consumers: int, rows: dict[str, dict]) -> None:
    for name, f in rows.items():
        r, a, q, t = f["receive_ms"], f["ack_ms"], f["last_over_first"], f["retry_ms"]
        cells = [f"{x['p50']:>6.2f}/{x['p90']:<6.2f}" for x in (r["first"], r["last"], a["first"], a["last"])]
        print(
            f"{consumers:>9} {name:<12} {f['msgs_per_s']:>9,} " + " ".join(cells)
            + f" {q['receive']:>7.2f} {q['ack']:>5.2f} {q['batch']:>6.2f}"
            + f"  {t['first']['p50']:>6.2f}/{t['last']['p50']:<6.2f}",
            flush=True,
        )  # fmt: skip


def print_seconds(runs: dict[int, dict[str, dict]]) -> None:
    print("seconds in each call over the drain (consumers added up), and the drain's wall time:")
    for consumers, rows in runs.items():
        for name, f in rows.items():
            spent = "  ".join(f"{k} {v:6.2f}" for k, v in f["seconds"].items())
            print(f"{consumers:>9} {name:<12} {spent}")


def verdicts(consumers: int, rows: dict[str, dict]) -> dict:
    """redelivery against each baseline (and the plain queue standing for PGMQ when it is left out)
    and its flatness, each with its target and whether it is met."""
    ours = rows["redelivery"]
    out = {}
    for baseline in ("pgmq", "plain queue"):
        against = baseline if baseline in rows else "plain queue"
        ratio = ours["msgs_per_s"] / rows[against]["msgs_per_s"]
        target = TARGETS[min(consumers, 2)][baseline]
        out[f"vs {baseline}"] = {"against": against, "ratio": round(ratio, 2), "target": target,
                                 "met": ratio >= target}  # fmt: skip
    flat = ours["last_over_first"]["batch"]
    out["flat"] = {"ratio": flat, "target": FLAT, "met": flat <= FLAT}
    return out


def print_verdicts(consumers: int, checks: dict) -> None:
    parts = []
    for key, check in checks.items():
        verdict = "met" if check["met"] else "MISSED"
        if key == "flat":
            parts.append(
                f"flat: last/first 10% per batch {check['ratio']:.2f}x <= {check['target']:.1f}x: {verdict}"
            )
            continue
        stand_in = "" if key.endswith(check["against"]) else f" (the {check['against']} stands for it)"
        parts.append(f"{key}{stand_in} {check['ratio']:.2f}x >= {check['target']:.1f}x: {verdict}")
    print(f"  {consumers} consumer{'s' if consumers > 1 else ''}: " + "; ".join(parts), flush=True)


def print_plan(consumers: int, explained: dict) -> None:
    seen = explained["deliveries"]
    print(
        f"\nEXPLAIN (ANALYZE, BUFFERS) of the ACK of {explained['receipts']} receipts at {EXPLAIN_AT:.0%} of "
        f"the drain, {consumers} consumer(s); deliveries then: pg_class reltuples {seen['reltuples']:,} "
        f"relpages {seen['relpages']:,} (file: {seen['pages']:,} pages), {seen['live']:,} live / "
        f"{seen['dead']:,} dead tuples, {seen['autovacuums']} autovacuum(s) and {seen['autoanalyzes']} "
        "autoanalyze(s) so far"
    )
    for line in explained["plan"]:  # the receipts' arrays shortened to their ends
        print("  " + LONG_ARRAY.sub(lambda m: f"'{{{m[1]},...,{m[2]}}}'", line))


def settings(url: str) -> dict[str, str]:
    """The autovacuum settings in force: on, and on for every table (the run refuses otherwise)."""
    names = ["autovacuum", "autovacuum_naptime", "autovacuum_vacuum_scale_factor",
             "autovacuum_vacuum_insert_threshold", "autovacuum_analyze_scale_factor",
             "server_version"]  # fmt: skip
    shown = dict(
        sql(url, "SELECT n, current_setting(n) FROM unnest(%(names)s::text[]) n", params={"names": names})
    )
    off = sql(url, "SELECT relname FROM pg_class WHERE 'autovacuum_enabled=false' = ANY(reloptions)")
    if shown["autovacuum"] != "on" or off:
        raise SystemExit(f"autovacuum is off ({off or 'everywhere'}): this benchmark drains with it on")
    return shown


def print_header(n: int, args, shown: dict, pgmq: str | None) -> None:
    print(
        f"drain of {n:,} messages, batches of {args.batch}, {args.retry_share:.0%} retried (the retries "
        f"wait past the drain), bodies decoded; PostgreSQL {shown['server_version']}, autovacuum "
        f"{shown['autovacuum']} (naptime {shown['autovacuum_naptime']}, vacuum scale "
        f"{shown['autovacuum_vacuum_scale_factor']}, insert threshold "
        f"{shown['autovacuum_vacuum_insert_threshold']}, analyze scale "
        f"{shown['autovacuum_analyze_scale_factor']})"
    )
    if pgmq:
        print(f"pgmq: pgmq.read + pgmq.archive, {pgmq}")
    else:
        print(
            "pgmq: the PyPI package pgmq (it ships PGMQ's SQL) is not installed: "
            "the plain queue stands for it"
        )
    print(f"{'':>32}{'RECEIVE ms p50/p90':^27} {'ACK ms p50/p90':^27} {'last/first p50':^20}"
          "  retry ms p50")  # fmt: skip
    print(f"{'consumers':>9} {'variant':<12} {'msgs/s':>9} {'first 10%':^13} {'last 10%':^13} "
          f"{'first 10%':^13} {'last 10%':^13} receive   ack  batch   first/last")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument(
        "--retry-share", type=float, default=0.1, help="share of messages answered with a retry"
    )
    parser.add_argument("--consumers", default="1,2", help="consumer counts, comma-separated")
    parser.add_argument("--quick", action="store_true", help=f"a small run: {QUICK_MESSAGES:,} messages")
    args = parser.parse_args()
    from redelivery.store import db

    n = QUICK_MESSAGES if args.quick else args.messages
    url = database()
    db.migrate(url)
    shown = settings(url)
    pgmq = pgmq_sql()
    variants = [PlainQueue(), *([Pgmq()] if pgmq else []), Redelivery()]
    print_header(n, args, shown, pgmq)
    summary = {"messages": n, "batch": args.batch, "retry_share": args.retry_share,
               "retries": "wait past the drain", "pgmq": pgmq, "autovacuum": shown["autovacuum"],
               "runs": {}, "targets": {}, "ack_plans": {}}  # fmt: skip
    plans = {}
    for consumers in (int(c) for c in args.consumers.split(",")):
        rows = {}
        for variant in variants:
            result = drain(variant, url, n, consumers, args.batch, args.retry_share)
            rows[variant.name] = figures(result)
            if result.explained:
                plans[consumers] = result.explained
        print_rows(consumers, rows)
        summary["runs"][consumers] = rows
        summary["targets"][consumers] = verdicts(consumers, rows)
    print_seconds(summary["runs"])
    print("targets, same run:")
    for consumers, checks in summary["targets"].items():
        print_verdicts(consumers, checks)
    for consumers, explained in plans.items():
        print_plan(consumers, explained)
        summary["ack_plans"][consumers] = plan_summary(explained)
    print("DRAIN_SUMMARY " + json.dumps(summary, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
