"""The crash suite's worker processes: real publishers, consumers, tier runs and redrives, run
through the public API exactly as a pipeline would, and killed by the controller (chaos/run.py).

    python chaos/worker.py publish --batch B --count N [--first K] [--ago SECONDS] [--one-trip]
    python chaos/worker.py consume --group G --max N --lease S [--gate NAME --gate-at before|after] [--loop]
        [--wait SECONDS]
                                   [--extend]
    python chaos/worker.py tier --run-key K
    python chaos/worker.py tier-batch --run-key K --windows N   (a batched DAG run: N windows of 1 s)
    python chaos/worker.py redrive --group G --run-key K [--rate R]
    python chaos/worker.py standing
    python chaos/worker.py partition --hours-ahead H   (make the log's partition of that time)
    python chaos/worker.py retention                   (drop the log's partitions past retention)
    python chaos/worker.py recreate --topic T --group G (delete a topic, make it again, subscribe G)
    python chaos/worker.py spark          (a Spark Connect client kept warm: JSON commands on stdin)

The database is REDELIVERY_DATABASE_URL; the config REDELIVERY_CONFIG (chaos/config.yaml). A
consumer's handler decides by (message id, delivery): reject some, fail some, ack the rest; with
a gate it first waits on a row of chaos.gates the controller may hold, which freezes it at a known
point. Every call and what the API answered go into the worker's ledger (chaos/ledger.py, the
directory CHAOS_LEDGER, the file named by CHAOS_WORKER); every success is also printed as one line
the controller reads.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import psycopg
from ledger import Ledger, LedgeredClient

from redelivery.client import Client, Message

TOPIC = "chaos"
KEYS = 7  # scenarios.KEYS: the keys of the suite's messages


def outcome(message_id: int, delivery: int) -> str:
    """The handler's answer: the same for a given delivery, different across deliveries."""
    if message_id % 17 == 0:
        return "reject"
    return "nack" if (message_id + delivery) % 3 == 0 else "ack"


def wait_at_gate(url: str, gate: str) -> None:
    """Block while the controller holds the gate's row (it then kills us here)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1 FROM chaos.gates WHERE name = %s FOR SHARE", (gate,))


def ledgered_client() -> LedgeredClient:
    """The public client, its calls recorded in this worker's ledger (chaos/ledger.py)."""
    return LedgeredClient(Client(), own_ledger())


def own_ledger() -> Ledger:
    return Ledger(os.environ["CHAOS_LEDGER"], os.environ.get("CHAOS_WORKER", f"worker-{os.getpid()}"))


def publish(args) -> None:
    """A batch published now, or ``--ago`` seconds before the database's clock (a backfill: its
    partition may be past retention, and retention racing it)."""
    from redelivery.errors import BatchExpiredError

    client = ledgered_client()
    messages = [
        Message({"n": args.first + i, "batch": args.batch}, key=f"k{(args.first + i) % KEYS}")
        for i in range(args.count)
    ]
    at = None
    if args.ago:
        from datetime import timedelta

        at = client.client.conn.execute("SELECT now()").fetchone()[0] - timedelta(seconds=args.ago)
    if args.one_trip:  # as after a publish before: the log's partition of now is known (one round trip)
        from redelivery.store import statements as S

        conn = client.client.conn
        now = conn.execute("SELECT now()").fetchone()[0]
        known = conn.execute(S.LOG_PARTITION_AT, {"at": now}).fetchone()  # none yet: two round trips
        client.client.publisher._partition = known[0] if known else None
    try:
        ids = client.publish(TOPIC, messages, batch_id=args.batch, at=at)
    except BatchExpiredError:  # published before, and already dropped by retention (recorded)
        ids = []
    print(f"PUBLISHED {args.batch} {len(ids)}", flush=True)


def recreate(args) -> None:
    """Delete a topic (its messages, deliveries, dead letters) and make it again with its group
    subscribed, as another process of a pipeline would under the controller's long-lived client."""
    client = ledgered_client()
    client.delete_topic(args.topic)
    client.client.create_topic(args.topic)
    client.client.create_group(args.group)
    client.client.subscribe(args.group, args.topic)
    print(f"RECREATED {args.topic}", flush=True)


def reconnected(client: LedgeredClient, seconds: float = 30) -> None:
    """A new connection after a lost one (a lost commit answer, a restarted server), as a consumer
    that goes on would make: tried again while the server is shutting down or starting (for up to
    ``seconds``; the controller kills the workers of a restart soon after it stopped the server)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            client.client.conn = psycopg.connect(
                client.client.url, autocommit=True, options="-c search_path=redelivery"
            )
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def consume(args) -> None:
    url = os.environ["REDELIVERY_DATABASE_URL"]
    client = ledgered_client()
    while True:
        try:
            batch = client.receive(args.group, TOPIC, args.max, args.lease, wait_seconds=args.wait)
        except psycopg.OperationalError:  # its answer was lost (recorded): the lease runs out, try again
            reconnected(client)
            continue
        if not batch:
            break
        print(f"RECEIVED {len(batch)}", flush=True)
        if args.gate and args.gate_at == "before":
            wait_at_gate(url, args.gate)
        plan: dict[str, list] = {"ack": [], "nack": [], "reject": []}
        for message in batch:
            plan[outcome(message.message_id, message.delivery_count)].append(message)
        if args.gate and args.gate_at == "after":
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO chaos.received (gate, ids) VALUES (%s, %s)",
                    (args.gate, [m.message_id for m in batch]),
                )
            wait_at_gate(url, args.gate)
        if args.extend:  # long work: the lease extended first (killed inside it by the controller)
            client.extend(args.group, batch, 60)
        answered = 0
        for verb, messages in plan.items():
            if messages:
                try:
                    answered += client.answer(verb, args.group, messages, error=verb)
                except psycopg.OperationalError:  # a lost answer: answer again on a new connection
                    reconnected(client)
                    answered += client.answer(verb, args.group, messages, error=verb)
        print(f"ANSWERED {answered}", flush=True)
        if not args.loop:
            break


def tier(args) -> None:
    from redelivery.tiers.run import TierRunRequest, run_tier

    with psycopg.connect(os.environ["REDELIVERY_DATABASE_URL"]) as conn:
        now = conn.execute("SELECT now()").fetchone()[0]
    summary = own_ledger().record(
        "tier",
        {"run_key": args.run_key},
        lambda: run_tier(
            TierRunRequest(tier="fast", window_end=now, run_key=args.run_key), max_partitions=args.partitions
        ),
        tier_answer(args.run_key),
    )
    print(
        f"TIER {json.dumps({'promoted': summary['promoted'], 'dead_lettered': summary['dead_lettered']})}",
        flush=True,
    )


def tier_batch(args) -> None:
    """A tier DAG run's batch (``redelivery.tiers.batch``, as ``TierWindowOperator`` runs it): the
    next ``--windows`` windows of the fast tier's 1 s, each applied at its end; each window is a
    tier call of the ledger under ``<run key>/<window end>``."""
    import threading
    from datetime import timedelta

    from redelivery.tiers.batch import apply_windows, window_ends
    from redelivery.tiers.run import TierRunRequest, run_tier

    with psycopg.connect(os.environ["REDELIVERY_DATABASE_URL"]) as conn:
        now = conn.execute("SELECT now()").fetchone()[0]
    ledger = own_ledger()

    def apply(start, end) -> dict:
        key = f"{args.run_key}/{end.isoformat()}"
        request = TierRunRequest(tier="fast", window_start=start, window_end=end, run_key=key)
        return ledger.record("tier", {"run_key": key}, lambda: run_tier(request), tier_answer(key))

    ends = window_ends(1, now, now + timedelta(seconds=args.windows))
    report = apply_windows(ends, 1, apply, wait=threading.Event().wait, log=lambda line: None)
    if report.failed:  # a window that raised: the worker's error, as a single run's would be
        raise RuntimeError(f"tier batch windows failed: {report.failed}")
    print(f"TIER-BATCH {json.dumps({'windows': report.windows, 'promoted': report.promoted})}", flush=True)


def tier_answer(run_key: str):
    return lambda summary: {"run_key": run_key, "promoted": summary["promoted"]}


def redrive(args) -> None:
    from redelivery.redrive import RedriveRequest
    from redelivery.redrive import redrive as run

    request = RedriveRequest(group=args.group, dry_run=False, rate_limit=args.rate)
    result = own_ledger().record(
        "redrive",
        {"group": args.group, "run_key": args.run_key},
        lambda: run(request, run_key=args.run_key, log=lambda *_: None),
        lambda r: {"run_key": r["run_key"], "status": r["status"], "moved": r["moved"]},
    )
    print(f"REDRIVEN {result['moved']} {result['status']}", flush=True)


def standing(args) -> None:
    """One tick of the standing redrives (chaos/config.yaml's)."""
    from redelivery.standing import tick

    report = tick(sync_config=True, log=lambda *_: None)
    print(f"STANDING {sum(r['moved'] for r in report.runs)} {report.problems}", flush=True)


def partition(args) -> None:
    from datetime import timedelta

    from redelivery.config import cached_config
    from redelivery.store import db
    from redelivery.store.log import ensure_partition

    with db.connect(autocommit=True) as conn:
        when = conn.execute("SELECT now()").fetchone()[0] + timedelta(hours=args.hours_ahead)
        made = ensure_partition(conn, when, cached_config().retention.seconds("partition"))
    print(f"PARTITION {made}", flush=True)


def retention(args) -> None:
    from redelivery.config import cached_config
    from redelivery.store import db
    from redelivery.store.log import drop_expired_partitions

    with db.connect(autocommit=True) as conn:
        result = drop_expired_partitions(conn, cached_config().retention.seconds("messages"))
    print(f"RETENTION {json.dumps({'dropped': result.dropped, 'reattached': result.reattached})}", flush=True)


def spark(args) -> None:
    """A Spark driver kept warm: one JSON command per stdin line, one answer line each."""
    from redelivery.spark.consuming import consume as spark_consume
    from redelivery.spark.publishing import publish_dataframe
    from redelivery.spark.session import get_spark
    from redelivery.tiers.run import TierRunRequest, run_tier

    # the warm Spark Connect server of the suite (local[cores,3]: a failed task is tried again)
    session = get_spark("redelivery-chaos")
    ledger = own_ledger()
    print("READY", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "publish":
            keys = [f"{command['batch']}:{i}" for i in range(command["count"])]
            rows = [(key, json.dumps({"n": i, "batch": command["batch"]})) for i, key in enumerate(keys)]
            df = session.createDataFrame(rows, "key string, body string").repartition(
                command.get("partitions", 3)
            )
            at = None
            if command.get("ago"):  # a backfill job: published at a past time
                from datetime import timedelta

                with psycopg.connect(os.environ["REDELIVERY_DATABASE_URL"]) as conn:
                    at = conn.execute("SELECT now()").fetchone()[0] - timedelta(seconds=command["ago"])
            count = ledger.record(
                "publish",
                {"topic": TOPIC, "batch": command["batch"], "count": len(keys), "keys": keys},
                functools.partial(publish_dataframe, df, TOPIC, command["batch"], at=at),
                lambda n: {"count": n},
            )
            print(f"PUBLISHED {command['batch']} {count}", flush=True)
        elif command["op"] == "tier":
            with psycopg.connect(os.environ["REDELIVERY_DATABASE_URL"]) as conn:
                now = conn.execute("SELECT now()").fetchone()[0]
            summary = ledger.record(
                "tier",
                {"run_key": command["run_key"]},
                functools.partial(
                    run_tier,
                    TierRunRequest(tier="fast", window_end=now, run_key=command["run_key"]),
                    spark=session,
                    max_partitions=3,
                    spark_threshold=0,  # in Spark tasks however small the window: the task kill point
                ),  # fmt: skip
                tier_answer(command["run_key"]),
            )
            print(f"TIER {summary['promoted']}", flush=True)
        elif command["op"] == "consume":
            counts = spark_consume(
                session,
                group=command["group"],
                topic=TOPIC,
                handler=SparkHandler(command["group"], os.environ["CHAOS_LEDGER"], command.get("gate")),
                consumers=2,
                batch_size=command.get("max", 20),
                invisible_duration=2,
            )
            print(f"CONSUMED {json.dumps(counts)}", flush=True)


class SparkHandler:
    """The consumer handler as a Spark task runs it (picklable): what it is handed goes into a
    ledger of the task's process (written here with the standard library only: Spark's Python
    workers cannot import chaos/ modules); an optional gate freezes the task."""

    def __init__(self, group: str, ledger_dir: str, gate: str | None = None):
        self.group, self.ledger_dir, self.gate = group, ledger_dir, gate

    def __call__(self, messages):
        import time
        import uuid

        worker, call_id = f"spark-task-{os.getpid()}", uuid.uuid4().hex
        handed = [[m.message_id, m.delivery_count] for m in messages]
        base = {"w": worker, "id": call_id, "op": "receive", "group": self.group}
        lines = [  # a call and its answer, as chaos/ledger.py writes them
            {**base, "t": time.time(), "phase": "call"},
            {**base, "t": time.time(), "phase": "ok", "handed": handed},
        ]
        path = os.path.join(self.ledger_dir, f"{worker}.jsonl")
        _append(path, lines)
        if self.gate:
            wait_at_gate(os.environ["REDELIVERY_DATABASE_URL"], self.gate)
        answers: dict[str, list] = {}
        for m in messages:
            answers.setdefault(outcome(m.message_id, m.delivery_count), []).append(
                [m.message_id, m.delivery_count]
            )
        # the job settles these later, in another task: answers of unknown outcome (a call line only)
        lines = [
            {"w": worker, "id": f"{call_id}-{verb}", "op": "answer", "t": time.time(), "phase": "call",
             "verb": verb, "group": self.group, "receipts": receipts}
            for verb, receipts in answers.items()
        ]  # fmt: skip
        _append(path, lines)
        verbs = {"ack": "ack", "nack": "retry", "reject": "reject"}  # the consumer job's outcomes
        return [(verbs[outcome(m.message_id, m.delivery_count)], "spark says no") for m in messages]


def _append(path: str, lines: list[dict]) -> None:
    """Ledger lines appended to ``path``, one write each (a kill loses none said before it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for line in lines:
            os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    roles = parser.add_subparsers(dest="role", required=True)
    p = roles.add_parser("publish")
    p.add_argument("--batch", required=True)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--ago", type=float, default=0, help="publish this many seconds in the past")
    p.add_argument("--one-trip", action="store_true", help="the log's partition of now known: one round trip")
    p = roles.add_parser("consume")
    p.add_argument("--group", required=True)
    p.add_argument("--max", type=int, default=20)
    p.add_argument("--lease", type=float, default=2)
    p.add_argument("--gate")
    p.add_argument("--gate-at", choices=["before", "after"], default="before")
    p.add_argument("--loop", action="store_true")
    p.add_argument("--wait", type=float, default=0, help="each receive's wait_seconds (a long poll)")
    p.add_argument("--extend", action="store_true", help="extend the batch's lease before answering")
    p = roles.add_parser("tier")
    p.add_argument("--run-key", required=True)
    p.add_argument("--partitions", type=int, default=2)
    p = roles.add_parser("tier-batch")
    p.add_argument("--run-key", required=True)
    p.add_argument("--windows", type=int, default=4)
    p = roles.add_parser("redrive")
    p.add_argument("--group", required=True)
    p.add_argument("--run-key", required=True)
    p.add_argument("--rate", type=float)
    roles.add_parser("standing")
    p = roles.add_parser("partition")
    p.add_argument("--hours-ahead", type=int, required=True)
    roles.add_parser("retention")
    p = roles.add_parser("recreate")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    roles.add_parser("spark")
    args = parser.parse_args(argv)
    roles_run = {"publish": publish, "consume": consume, "tier": tier, "tier-batch": tier_batch,
                 "redrive": redrive, "partition": partition, "retention": retention, "recreate": recreate,
                 "spark": spark, "standing": standing}  # fmt: skip
    roles_run[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
