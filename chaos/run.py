"""The crash suite: real processes killed at known points, and the promise checked after each round.

    make chaos                                   # 1000 kill points
    .venv/bin/python chaos/run.py --kill-points 60 --seed 7

It runs on an embedded PostgreSQL of its own (REDELIVERY_HOME/chaos, port 54339), so that it can
restart the server with an immediate shutdown without disturbing anything else. Workers
(chaos/worker.py) are real publishers, consumers, tier runs, redrives and a Spark driver, using
the public API. A kill point freezes a worker at a known statement (the controller holds a row,
table or advisory lock the statement needs, and waits until pg_stat_activity shows the worker
waiting on it), then kills it with SIGKILL; lost commit answers come from a proxy that drops the
answer to a COMMIT (chaos/proxy.py); an immediate shutdown restarts PostgreSQL in the middle of
runs. After every round the invariants of chaos/invariants.py are checked; at the end the system
is drained and every message must have ended exactly once per group.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "chaos" / "worker.py"
CONFIG = ROOT / "chaos" / "config.yaml"
TOPIC, GROUPS = "chaos", ("g1", "g2", "capped")
#: A topic of its own for retention: published at times long past, consumed, then its partitions
#: dropped (the chaos topic's messages are all recent: retention never drops them).
LOG_TOPIC, LOG_GROUP = "chaos-log", "log-reader"
#: Every kind of kill point (the short run in `make test` requires each of them).
KINDS = (
    "consumer: after its receive committed, before the handler",
    "consumer: after the handler, inside its ack/nack/reject",
    "tier job: inside a range's transaction",
    "tier job: ranges committed, before the run record is finished",
    "redrive: inside a batch",
    "redrive: between two batches",
    "API publish: inside its transaction",
    "lost commit answer: publish",
    "lost commit answer: receive",
    "lost commit answer: ack",
    "PostgreSQL: immediate shutdown in the middle of runs",
    "Spark publish: staged, before the publishing transaction",
    "Spark publish: inside the publishing transaction",
    "Spark publish: a task killed while it stages",
    "Spark tier job: a task killed inside its range",
    "Spark consumer: a task killed after its receive committed",
    "receive: waiting to move its consume offset",
    "consumer: inside a lease extension",
    "log: a partition made and attached, before its record commits",
    "retention: inside a partition's concurrent detach",
    "retention: a partition detached, inside its drop",
)
BACKLOG_LOCK = 7_424_003  # redelivery.store.catalog.BACKLOG_LOCK


def setup_environment(home: Path, port: int) -> None:
    """Point this process (and the workers it starts) at the suite's own PostgreSQL and Spark
    Connect server (ports ``port`` and ``port - 39327``, 54339 and 15012 by default)."""
    os.environ.update(
        REDELIVERY_HOME=str(home),
        REDELIVERY_PG_PORT=str(port),
        REDELIVERY_CONFIG=str(CONFIG),
        REDELIVERY_SPARK="connect",
        REDELIVERY_SPARK_CONNECT_PORT=str(port - 39327),
    )
    os.environ.pop("REDELIVERY_DATABASE_URL", None)


class Worker:
    """A worker process; its stdout lines arrive on ``lines``. ``killed``: the controller killed it
    (a kill point, a server restart): its exit says nothing about the code it ran."""

    def __init__(self, proc: subprocess.Popen, tag: str, log: Path):
        self.proc, self.tag, self.log, self.lines = proc, tag, log, queue.Queue()
        self.killed = False
        self.scenario = None  # the scenario that started it (for a violation's report)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def line(self, timeout: float) -> str | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.killed = True
        elif os.environ.get("CHAOS_DEBUG"):
            import traceback

            print(f"DEBUG kill of {self.tag}: already ended {self.proc.poll()}", flush=True)
            traceback.print_stack()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def status(self) -> tuple:
        """(tag and scenario, exit code, killed by the controller, the end of the traceback it
        printed or None)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        traceback = text[text.index("Traceback") :][-600:] if "Traceback" in text else None
        return f"{self.tag} ({self.scenario})", self.proc.poll(), self.killed, traceback

    def send(self, command: dict) -> None:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()


class Forked:
    """A worker forked from the controller, with the ``subprocess.Popen`` calls the suite uses:
    its own session (a process group to kill), stdout to a pipe, stderr to its log."""

    def __init__(self, argv: list[str], url: str, log: Path, tag: str):
        read, write = os.pipe()
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                os.setsid()
                os.dup2(write, 1)
                os.dup2(log_fd, 2)
                sys.stdout = os.fdopen(1, "w", buffering=1)
                sys.stderr = os.fdopen(2, "w", buffering=1)
                os.environ["REDELIVERY_DATABASE_URL"] = url
                os.environ["CHAOS_WORKER"] = tag
                from redelivery.settings import get_settings

                get_settings.cache_clear()
                import worker

                worker.main(argv)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)  # no finalizers: the controller's connections are not ours to close
        os.close(write)
        os.close(log_fd)
        self.pid, self.returncode = pid, None
        self.stdout = os.fdopen(read, "r")

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; ``subprocess.TimeoutExpired`` if it is still running after ``timeout`` s."""
        if timeout is None:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return self.returncode


class Controller:
    def __init__(self, args):
        from redelivery.store import embedded

        self.args, self.rng = args, random.Random(args.seed)
        self.embedded = embedded
        self.base_url = embedded.ensure_running(("chaos",)).rsplit("/", 1)[0] + "/chaos"
        self.kills: Counter = Counter()
        self.violations: Counter = Counter()
        self.workers: list[Worker] = []  # started since the last check
        self.scenario: str | None = None
        self.calls_compared = 0
        self.seconds: Counter = Counter()  # time spent per scenario
        self.spark: Worker | None = None
        self.standby: Worker | None = None
        self.held_back: list = []  # messages of the retention topic received and not answered yet
        self.logs = Path(args.home) / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.ledger_dir = Path(args.home) / "ledger"
        os.environ["CHAOS_LEDGER"] = str(self.ledger_dir)
        self.reset_database()
        from proxy import LostAnswerProxy

        self.proxy = LostAnswerProxy(args.port).start()

    # ---- database ---------------------------------------------------------------------------

    def connect(self, autocommit: bool = True):
        import psycopg

        return psycopg.connect(self.url(), autocommit=autocommit, options="-c search_path=redelivery,public")

    def url(self, tag: str = "controller", through_proxy: bool = False) -> str:
        url = self.base_url
        if through_proxy:
            url = url.replace(f":{self.args.port}/", f":{self.proxy.port}/")
        return f"{url}?application_name=chaos-{tag}&sslmode=disable&gssencmode=disable"

    def reset_database(self) -> None:
        import psycopg

        from redelivery.client import Client
        from redelivery.store.db import migrate

        admin = self.base_url.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS chaos WITH (FORCE)")
            conn.execute("CREATE DATABASE chaos")
        migrate(self.url())
        with self.connect() as conn:
            conn.execute("CREATE SCHEMA chaos")
            conn.execute("CREATE TABLE chaos.gates (name text PRIMARY KEY)")
            conn.execute("CREATE TABLE chaos.received (gate text, ids bigint[])")
        with Client(self.url()) as client:
            client.create_topic(TOPIC)
            for group in GROUPS:
                client.create_group(group, max_reconsume_times=1 if group == "g2" else None)
                client.subscribe(group, TOPIC)
            client.create_topic(LOG_TOPIC)
            client.create_group(LOG_GROUP)
            client.subscribe(LOG_GROUP, LOG_TOPIC)
        shutil.rmtree(self.ledger_dir, ignore_errors=True)
        self.client = self.ledgered_client()
        self.conn = self.connect()
        self.topic_id = self.conn.execute("SELECT id FROM topics WHERE name = %s", (TOPIC,)).fetchone()[0]

    def reconnect(self) -> None:
        for closing in (self.conn, self.client):
            try:
                closing.close()
            except Exception:
                pass
        self.client, self.conn = self.ledgered_client(), self.connect()

    def ledgered_client(self):
        """The controller's own client: its publishes, receives and answers go into the ledger too."""
        from ledger import Ledger, LedgeredClient

        from redelivery.client import Client

        return LedgeredClient(
            Client(self.url()), Ledger(self.ledger_dir, f"controller-{uuid.uuid4().hex[:6]}")
        )

    # ---- workers ----------------------------------------------------------------------------

    def spawn(self, role: str, *args: str, through_proxy: bool = False, stdin: bool = False) -> Worker:
        """A worker process. The Spark driver is a new interpreter (it starts a JVM); the others are
        forked from this one, their imports done: a kill point then costs milliseconds, not the
        second an interpreter takes to import the client."""
        tag = f"{role}-{uuid.uuid4().hex[:8]}"
        url, log = self.url(tag, through_proxy), self.logs / f"{tag}.log"
        if role != "spark":
            worker = Worker(Forked([role, *args], url, log, tag), tag, log)
            worker.scenario = self.scenario
            self.workers.append(worker)
            return worker
        env = {**os.environ, "REDELIVERY_DATABASE_URL": url, "PYTHONUNBUFFERED": "1", "CHAOS_WORKER": tag}
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), role, *args],
            env=env,
            text=True,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stderr=open(log, "w"),
        )
        worker = Worker(proc, tag, log)
        worker.scenario = self.scenario
        self.workers.append(worker)
        return worker

    def waiting(self, tag_prefix: str, query_like: str = "%", wait_event: str | None = None) -> list:
        """Backends of workers whose tag starts with ``tag_prefix`` waiting on a lock."""
        return self.conn.execute(
            """SELECT pid, client_port, query FROM pg_stat_activity
               WHERE application_name LIKE %s AND wait_event_type = 'Lock' AND query LIKE %s
                 AND (%s::text IS NULL OR wait_event = %s::text)""",
            (f"chaos-{tag_prefix}%", query_like, wait_event, wait_event),
        ).fetchall()

    def wait_until(self, predicate, timeout: float = 30.0, every: float = 0.02):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = predicate()
            if found:
                return found
            time.sleep(every)
        return None

    @contextmanager
    def holding(self, statement: str, params=()):
        """Hold the locks ``statement`` takes, in a transaction of a connection of its own."""
        conn = self.connect(autocommit=False)
        try:
            conn.execute(statement, params)
            yield conn
        finally:
            try:
                conn.rollback()
            finally:
                conn.close()

    @contextmanager
    def gate(self):
        name = uuid.uuid4().hex[:12]
        self.conn.execute("INSERT INTO chaos.gates VALUES (%s)", (name,))
        with self.holding("SELECT 1 FROM chaos.gates WHERE name = %s FOR UPDATE", (name,)) as held:
            yield name, held

    def freeze_and_kill(
        self, worker: Worker, kind: str, query_like: str, timeout: float = 30, **where
    ) -> bool:
        """Kill ``worker`` once it waits on a lock in a statement like ``query_like``."""
        if (
            self.wait_until(
                lambda: self.waiting(worker.tag, query_like, **where) or worker.proc.poll() is not None,
                timeout,
            )
            and worker.proc.poll() is None
        ):
            worker.kill()
            self.kills[kind] += 1
            return True
        worker.kill()
        return False

    # ---- keeping work around ------------------------------------------------------------------

    def top_up(self) -> None:
        """Enough READY messages for the consumers, and retries and dead letters around."""
        from redelivery.store import statements as S

        ready = {
            group: n for topic, group, n, *_ in self.conn.execute(S.SUBSCRIPTION_STATES) if topic == TOPIC
        }
        if min(ready.get(g, 0) for g in ("g1", "g2")) < 15:
            batch = f"top-{uuid.uuid4().hex[:8]}"
            from redelivery.client import Message

            self.client.publish(TOPIC, [Message({"n": i}) for i in range(30)], batch_id=batch)

    def make_due_retries(self, group: str = "g1") -> None:
        due = "SELECT count(*) FROM deliveries WHERE state = 'WAITING_RETRY' AND due_at <= now()"
        if self.conn.execute(due).fetchone()[0] >= 2:
            return
        self.top_up()
        got = self.client.receive(group, TOPIC, 10, 30)
        if got:
            self.client.answer("nack", group, got, error="chaos")
        time.sleep(1.05)  # the fixed 1 s backoff: due now

    def make_dead_letters(self, group: str, at_least: int) -> None:
        dead = self.conn.execute(
            """SELECT count(*) FROM dlq_messages q JOIN consumer_groups g ON g.id = q.group_id
               WHERE g.name = %s""",
            (group,),
        ).fetchone()[0]
        if dead < at_least:
            self.top_up()
            got = self.client.receive(group, TOPIC, at_least - dead + 2, 30)
            self.client.answer("reject", group, got, error="chaos")

    def tier_run_now(self, purpose: str) -> None:
        """A tier run in this process (never killed) for a window ending at the database's now."""
        from redelivery.tiers.run import run_tier_window

        now = self.conn.execute("SELECT now()").fetchone()[0]
        run_tier_window(
            tier="fast",
            window_end=now,
            run_key=f"{purpose}-{uuid.uuid4().hex[:8]}",
            url=self.url(),
            config=self.client.client.config,
        )

    def churn(self) -> None:
        """A tier run and a consumer pass in this process (not killed), so states keep moving."""
        self.tier_run_now("churn")
        for group in GROUPS:
            batch = self.client.receive(group, TOPIC, 10, 2)
            if batch:
                self.client.answer("ack", group, batch[: len(batch) // 2])
                self.client.answer("nack", group, batch[len(batch) // 2 :], error="churn")

    # ---- kill points ------------------------------------------------------------------------

    def consumer_after_receive(self) -> None:
        self.top_up()
        with self.gate() as (name, _):
            worker = self.spawn(
                "consume",
                "--group",
                self.rng.choice(["g1", "g2"]),
                "--max",
                "10",
                "--lease",
                "2",
                "--gate",
                name,
                "--gate-at",
                "before",
            )
            self.freeze_and_kill(
                worker, "consumer: after its receive committed, before the handler", "%chaos.gates%"
            )

    def consumer_inside_answer(self, extend: bool = False) -> None:
        """A consumer frozen inside its answer (the rows it answers held here), or, with
        ``extend``, inside the lease extension it makes first."""
        self.top_up()
        group = self.rng.choice(["g1", "g2"])
        with self.gate() as (name, gate_conn):
            worker = self.spawn(
                "consume",
                "--group",
                group,
                "--max",
                "10",
                "--lease",
                "2",
                "--gate",
                name,
                "--gate-at",
                "after",
                *(["--extend"] if extend else []),
            )
            if not self.wait_until(lambda: self.waiting(worker.tag, "%chaos.gates%")):
                worker.kill()
                return
            ids = self.conn.execute("SELECT ids FROM chaos.received WHERE gate = %s", (name,)).fetchone()[0]
            with self.holding(
                """SELECT 1 FROM deliveries d JOIN consumer_groups g ON g.id = d.group_id
                   WHERE g.name = %s AND d.message_id = ANY(%s) ORDER BY d.message_id FOR UPDATE""",
                (group, ids),
            ):
                gate_conn.rollback()  # open the gate: the answer now waits on our row locks
                if extend:
                    self.freeze_and_kill(
                        worker, "consumer: inside a lease extension", "%redelivery:EXTEND_LEASE%"
                    )
                else:
                    self.freeze_and_kill(
                        worker, "consumer: after the handler, inside its ack/nack/reject", "%redelivery:%"
                    )

    def tier_inside_range(self) -> None:
        self.make_due_retries()
        with self.holding("""SELECT message_id FROM deliveries
                             WHERE state = 'WAITING_RETRY' AND due_at <= now()
                             ORDER BY message_id DESC LIMIT 1 FOR UPDATE"""):
            worker = self.spawn("tier", "--run-key", f"chaos-{uuid.uuid4().hex[:8]}", "--partitions", "2")
            self.freeze_and_kill(worker, "tier job: inside a range's transaction", "%redelivery:%")

    def tier_before_its_record(self) -> None:
        self.make_due_retries()
        with self.holding("SELECT pg_advisory_lock(%s, %s)", (BACKLOG_LOCK, self.topic_id)) as held:
            worker = self.spawn("tier", "--run-key", f"chaos-{uuid.uuid4().hex[:8]}")
            self.freeze_and_kill(
                worker,
                "tier job: ranges committed, before the run record is finished",
                "%",
                wait_event="advisory",
            )
            held.execute("SELECT pg_advisory_unlock_all()")

    def redrive_inside_batch(self) -> None:
        group = self.rng.choice(["g1", "g2"])
        self.make_dead_letters(group, 5)
        # the batch's last step adds to the group's redriven total: its dead letters are out of the
        # DLQ and back in flight or READY by then, uncommitted (the run's start only needs the row
        # FOR KEY SHARE, which this lock lets through)
        with self.holding("SELECT 1 FROM consumer_groups WHERE name = %s FOR NO KEY UPDATE", (group,)):
            worker = self.spawn("redrive", "--group", group, "--run-key", f"chaos-{uuid.uuid4().hex[:8]}")
            self.freeze_and_kill(worker, "redrive: inside a batch", "%REDRIVE_MOVE_BATCH%")

    def redrive_between_batches(self) -> None:
        group = self.rng.choice(["g1", "g2"])
        self.make_dead_letters(group, 7)
        key = f"chaos-{uuid.uuid4().hex[:8]}"
        worker = self.spawn("redrive", "--group", group, "--run-key", key, "--rate", "3")

        def between():
            moved = self.conn.execute("SELECT moved FROM redrive_runs WHERE run_key = %s", (key,)).fetchone()
            idle = self.conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state = 'idle'",
                (f"chaos-{worker.tag}",),
            ).fetchone()[0]
            return (moved and moved[0] >= 3 and idle) or worker.proc.poll() is not None

        if self.wait_until(between, 20) and worker.proc.poll() is None:
            worker.kill()
            self.kills["redrive: between two batches"] += 1
        worker.kill()

    def current_partition(self) -> str:
        """The log's partition of now (made if missing), whose lock a COPY into the log waits for."""
        from redelivery.store import statements as S
        from redelivery.store.log import ensure_partition

        now = self.conn.execute("SELECT now()").fetchone()[0]
        ensure_partition(self.conn, now, self.client.client.config.retention.seconds("partition"))
        return self.conn.execute(S.LOG_PARTITION_AT, {"at": now}).fetchone()[0]

    def publish_inside_transaction(self) -> None:
        batch = f"api-{uuid.uuid4().hex[:8]}"
        # the COPY into the log waits for this lock: the publish stops there, its batch claimed and
        # its ids taken under the topic's publish lock
        with self.holding(f"LOCK TABLE redelivery_log.{self.current_partition()} IN SHARE MODE"):
            worker = self.spawn("publish", "--batch", batch, "--count", "20")
            self.freeze_and_kill(worker, "API publish: inside its transaction", "%redelivery:COPY_MESSAGES%")
        if self.rng.random() < 0.5:  # the producer tries again with the same batch id
            self.run_to_end(self.spawn("publish", "--batch", batch, "--count", "20"))

    def lost_commit(self, what: str) -> None:
        self.top_up()
        trigger = {"publish": b"COMMIT", "receive": b"COMMIT", "ack": b"redelivery:ACK"}[what]
        self.proxy.arm(trigger)
        if what == "publish":
            worker = self.spawn(
                "publish", "--batch", f"lost-{uuid.uuid4().hex[:8]}", "--count", "20", through_proxy=True
            )
        else:
            worker = self.spawn(
                "consume",
                "--group",
                self.rng.choice(["g1", "g2"]),
                "--max",
                "10",
                "--lease",
                "2",
                through_proxy=True,
            )
        self.run_to_end(worker)
        if self.proxy.fired.is_set():
            self.kills[f"lost commit answer: {what}"] += 1
        self.proxy.arm(b"\x00never")

    def restart_postgres(self) -> None:
        self.top_up()
        workers = [
            self.spawn("consume", "--group", "g1", "--max", "5", "--lease", "2", "--loop"),
            self.spawn("tier", "--run-key", f"chaos-{uuid.uuid4().hex[:8]}"),
        ]
        time.sleep(self.rng.uniform(0.8, 1.6))
        self.embedded.stop("immediate")
        for worker in workers:
            worker.kill()
        self.embedded.ensure_running(("chaos",))
        self.kills["PostgreSQL: immediate shutdown in the middle of runs"] += 1
        for spark in (self.spark, self.standby):  # their connections are gone with the server
            if spark is not None:
                spark.kill()
        self.spark = self.standby = None
        self.reconnect()

    def receive_moving_its_offset(self) -> None:
        """A receive stopped where it moves its group's consume offset (the subscription row, held
        here): its READY rows are in flight already, uncommitted; killed there, nothing moved."""
        self.top_up()
        group = self.rng.choice(["g1", "g2"])
        with self.holding(
            """SELECT 1 FROM subscriptions s JOIN consumer_groups g ON g.id = s.group_id
               JOIN topics t ON t.id = s.topic_id WHERE g.name = %s AND t.name = %s FOR UPDATE""",
            (group, TOPIC),
        ):
            worker = self.spawn("consume", "--group", group, "--max", "10", "--lease", "2")
            self.freeze_and_kill(
                worker, "receive: waiting to move its consume offset", "%redelivery:RECEIVE%"
            )

    def partition_before_its_record(self) -> None:
        """A partition's table made and attached in one transaction, stopped before its record in
        log_partitions (held here): killed, the table and the attach roll back with it."""
        ahead = self.rng.randint(2, 50)  # hours ahead: a partition nobody made yet, most times
        with self.holding("LOCK TABLE log_partitions IN SHARE MODE"):
            worker = self.spawn("partition", "--hours-ahead", str(ahead))
            self.freeze_and_kill(
                worker, "log: a partition made and attached, before its record commits",
                "%redelivery:REGISTER_LOG_PARTITION%",
            )  # fmt: skip

    def old_log(self, leave: int = 0) -> None:
        """Messages of the retention topic published two days and more ago (a partition of the
        log of their own), received and acknowledged but for ``leave`` of them (which then hold the
        partition: a group that lags)."""
        from redelivery.client import Message

        now = self.conn.execute("SELECT now()").fetchone()[0]
        when = now - timedelta(days=2, hours=self.rng.randint(0, 200))
        batch = f"old-{uuid.uuid4().hex[:8]}"
        self.client.publish(LOG_TOPIC, [Message({"n": i}) for i in range(5)], batch_id=batch, at=when)
        while got := self.client.receive(LOG_GROUP, LOG_TOPIC, 50, 600):
            kept, leave = got[:leave], max(leave - len(got), 0)
            if got[len(kept) :]:
                self.client.answer("ack", LOG_GROUP, got[len(kept) :])
            if kept:
                self.held_back.extend(kept)

    def retention_inside_detach(self) -> None:
        """Retention detaching a partition CONCURRENTLY, stopped while it waits for the readers of
        the log (a transaction of ours reading it): killed, the partition is left 'detach pending',
        and the next retention run finishes the detach, checks it again and drops it."""
        self.old_log(leave=self.rng.choice([0, 0, 1]))
        with self.holding("SELECT 1 FROM messages LIMIT 1"):
            worker = self.spawn("retention")
            self.freeze_and_kill(
                worker, "retention: inside a partition's concurrent detach", "%DETACH_LOG_PARTITION%"
            )
        self.finish_retention()

    def retention_inside_drop(self) -> None:
        """Retention dropping a detached partition, stopped at its record (held here): killed, the
        partition stays detached and recorded, and the next retention run checks it and drops it."""
        self.old_log()
        with self.holding("SELECT 1 FROM log_partitions FOR UPDATE"):
            worker = self.spawn("retention")
            self.freeze_and_kill(
                worker, "retention: a partition detached, inside its drop", "%FORGET_LOG_PARTITION%"
            )
        self.finish_retention()

    def finish_retention(self) -> None:
        """A retention run of ours (never killed), after acknowledging what an earlier scenario held
        back with some probability: the lagging group catches up, and its partitions can go."""
        from redelivery.store.log import drop_expired_partitions

        if self.held_back and self.rng.random() < 0.5:
            self.client.answer("ack", LOG_GROUP, self.held_back)
            self.held_back = []
        drop_expired_partitions(self.conn, self.client.client.config.retention.seconds("messages"))

    # ---- Spark ------------------------------------------------------------------------------

    def spark_worker(self) -> Worker:
        """The Spark driver: a client of the suite's Spark Connect server, as an Airflow task is.
        A standby starts with it, so that a killed driver's successor is ready at once."""
        if self.spark is None or self.spark.proc.poll() is not None:
            self.spark, self.standby = self.standby or self.spawn("spark", stdin=True), None
            if self.spark.line(180) != "READY":
                raise RuntimeError(f"the Spark worker did not start: see {self.logs}/{self.spark.tag}.log")
        if self.standby is None or self.standby.proc.poll() is not None:
            self.standby = self.spawn("spark", stdin=True)
        return self.spark

    def kill_task_of(self, backend_port: int) -> bool:
        """Kill the Python worker (a Spark task) that owns the connection from ``backend_port``;
        never one of the suite's own workers (a Spark driver doing the work itself would make the
        kill point a driver kill under a task kill's name: nothing is killed then)."""
        import psutil

        ours = {w.proc.pid for w in [*self.workers, self.spark, self.standby] if w is not None}
        for conn in psutil.net_connections(kind="tcp"):
            # Linux reuses a local port for connections to other remotes (the driver's to the
            # Spark Connect server, say): the connection is the one to this PostgreSQL
            if (
                conn.laddr
                and conn.laddr.port == backend_port
                and conn.raddr
                and conn.raddr.port == self.args.port
                and conn.pid
            ):
                if conn.pid in ours:
                    print(
                        f"  not a Spark task: the connection from port {backend_port} is a driver's",
                        flush=True,
                    )
                    return False
                os.kill(conn.pid, signal.SIGKILL)
                return True
        return False

    def spark_publish_driver(self, where: str) -> None:
        spark = self.spark_worker()
        batch = f"spark-{uuid.uuid4().hex[:8]}"
        if where == "before":
            hold = (
                "INSERT INTO publish_batches (batch_id, topic_id, message_count) VALUES (%s, %s, 0)",
                (batch, self.topic_id),
            )
            kind, like = "Spark publish: staged, before the publishing transaction", "%CLAIM_PUBLISH_BATCH%"
        else:
            hold = (f"LOCK TABLE redelivery_log.{self.current_partition()} IN SHARE MODE", ())
            kind, like = "Spark publish: inside the publishing transaction", "%redelivery:STAGED_TO_MESSAGES%"
        with self.holding(*hold):
            spark.send({"op": "publish", "batch": batch, "count": 30})
            self.freeze_and_kill(spark, kind, like, timeout=60)
            self.spark = None
        if self.rng.random() < 0.5:  # the Airflow task's retry publishes the same batch id
            spark = self.spark_worker()
            spark.send({"op": "publish", "batch": batch, "count": 30})
            self.expect(spark, "PUBLISHED", 120)

    def spark_task(self, job: str) -> None:
        spark = self.spark_worker()
        if job == "publish":
            batch = f"spark-{uuid.uuid4().hex[:8]}"
            hold, params, like = "LOCK TABLE publish_staging IN SHARE MODE", (), "%COPY_STAGING%"
            command, answer = {"op": "publish", "batch": batch, "count": 30}, "PUBLISHED"
            kind = "Spark publish: a task killed while it stages"
        elif job == "tier":
            self.make_due_retries()
            hold = """SELECT message_id FROM deliveries WHERE state = 'WAITING_RETRY' AND due_at <= now()
                      ORDER BY message_id DESC LIMIT 1 FOR UPDATE"""
            params, like = (), "%redelivery:%"
            command, answer = {"op": "tier", "run_key": f"chaos-{uuid.uuid4().hex[:8]}"}, "TIER"
            kind = "Spark tier job: a task killed inside its range"
        else:
            self.top_up()
            with self.gate() as (name, gate_conn):
                spark.send({"op": "consume", "group": "g1", "gate": name, "max": 5})
                found = self.wait_until(lambda: self.waiting("spark", "%chaos.gates%"), 60)
                if found and self.kill_task_of(found[0][1]):
                    self.kills["Spark consumer: a task killed after its receive committed"] += 1
            self.expect(spark, "CONSUMED", 180)
            return
        with self.holding(hold, params):
            spark.send(command)
            found = self.wait_until(lambda: self.waiting("spark", like), 60)
            if found and self.kill_task_of(found[0][1]):
                self.kills[kind] += 1
        self.expect(spark, answer, 180)

    def expect(self, worker: Worker, prefix: str, timeout: float) -> str | None:
        line = worker.line(timeout)
        while line is not None and not line.startswith(prefix):
            line = worker.line(timeout)
        if line is None:
            worker.kill()
            if worker is self.spark:
                self.spark = None
        return line

    def run_to_end(self, worker: Worker, timeout: float = 60) -> None:
        """Until the worker exits by itself; one still running after ``timeout`` seconds is killed
        and counted as a worker that hung (its exit code says so: not killed by a kill point)."""
        deadline = time.monotonic() + timeout
        while worker.line(max(0.1, deadline - time.monotonic())) is not None:
            pass
        try:
            worker.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.killed = False  # not a kill point: the worker hung

    # ---- the run ----------------------------------------------------------------------------

    SCENARIOS = {  # name: weight
        "consumer_after_receive": 14,
        "consumer_inside_answer": 14,
        "consumer_inside_answer:extend": 4,
        "tier_inside_range": 12,
        "tier_before_its_record": 8,
        "redrive_inside_batch": 8,
        "redrive_between_batches": 5,
        "publish_inside_transaction": 10,
        "lost_commit:publish": 6,
        "lost_commit:receive": 6,
        "lost_commit:ack": 6,
        "restart_postgres": 2,
        "receive_moving_its_offset": 6,
        "partition_before_its_record": 3,
        "retention_inside_detach": 3,
        "retention_inside_drop": 3,
    }
    SPARK_SCENARIOS = {
        "spark_publish_driver:before": 1,
        "spark_publish_driver:inside": 1,
        "spark_task:publish": 1,
        "spark_task:tier": 1,
        "spark_task:consume": 1,
    }

    def run_scenario(self, name: str) -> None:
        self.scenario = name
        method, _, arg = name.partition(":")
        getattr(self, method)(*([arg] if arg else []))

    def check(self, previous) -> dict:
        from invariants import check
        from ledger import read

        calls = read(self.ledger_dir)
        self.calls_compared = len(calls)
        ended = [w for w in self.workers if w.proc.poll() is not None and w not in (self.spark, self.standby)]
        self.workers = [w for w in self.workers if w not in ended]
        found = check(self.conn, previous, calls, [w.status() for w in ended])
        for name, rows in found.items():
            self.violations[name] += len(rows)
            if rows:
                print(f"  VIOLATION {name}: {rows[:5]}", flush=True)
        return found

    def drain(self, timeout: float = 120) -> list:
        """Finish everything: tier runs and consumers that ack, until every delivery has ended."""
        from invariants import final

        deadline = time.monotonic() + timeout
        if self.held_back:
            self.client.answer("ack", LOG_GROUP, self.held_back)
            self.held_back = []
        while time.monotonic() < deadline:
            self.tier_run_now("drain")
            for topic, group in [*((TOPIC, g) for g in GROUPS), (LOG_TOPIC, LOG_GROUP)]:
                while batch := self.client.receive(group, topic, 500, 30):
                    self.client.answer("ack", group, batch)
            left = final(self.conn)
            if not left:
                return []
            time.sleep(0.5)
        return final(self.conn)

    def run(self) -> int:
        from invariants import counts

        scenarios = dict(self.SCENARIOS)
        if self.args.spark:
            scenarios.update({k: v * self.args.spark_weight for k, v in self.SPARK_SCENARIOS.items()})
        if self.args.only:
            scenarios = {k: v for k, v in scenarios.items() if k in self.args.only.split(",")}
        names, weights = list(scenarios), list(scenarios.values())
        started, previous, rounds = time.monotonic(), counts(self.conn), 0
        forced = list(scenarios) if self.args.every_kind else []  # every kind at least once, first
        tries: Counter = Counter()
        while sum(self.kills.values()) < self.args.kill_points:
            for _ in range(self.args.round):
                name = forced.pop(0) if forced else self.rng.choices(names, weights)[0]
                began, before = time.monotonic(), sum(self.kills.values())
                self.run_scenario(name)
                self.seconds[name] += time.monotonic() - began
                tries[name] += 1
                if self.args.every_kind and sum(self.kills.values()) == before and tries[name] < 4:
                    forced.insert(0, name)  # no kill happened (nothing to freeze): once more
                if self.rng.random() < 0.3:
                    self.churn()
            rounds += 1
            found = self.check(previous)
            previous = counts(self.conn)
            print(
                f"round {rounds}: {sum(self.kills.values())} kill points, "
                f"{sum(len(v) for v in found.values())} violations, {time.monotonic() - started:.0f} s",
                flush=True,
            )
        for spark in (self.spark, self.standby):
            if spark is not None:
                spark.kill()
        left = self.drain()
        from invariants import FINAL

        self.violations[FINAL] += len(left)
        self.check(previous)
        return self.report(time.monotonic() - started)

    def report(self, seconds: float) -> int:
        from redelivery.store import statements as S

        messages = self.conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        states: Counter = Counter()
        for _, _, *numbers in self.conn.execute(S.SUBSCRIPTION_STATES):
            states.update(
                dict(zip(("READY", "INFLIGHT", "WAITING_RETRY", "COMMITTED", "DLQ"), numbers, strict=True))
            )
        states = dict(states)
        stale = int(
            self.conn.execute("SELECT coalesce(sum(stale_receipts), 0) FROM consumer_groups").fetchone()[0]
        )
        summary = {
            "kill_points": sum(self.kills.values()),
            "seconds": round(seconds),
            "by_kind": dict(self.kills),
            "violations": dict(self.violations),
            "messages": messages,
            "final_states": states,
            "stale_receipts": stale,
            "ledger_calls_compared": self.calls_compared,
            "invariants_checked": sorted(self.violations),
        }
        print("\nkill points by kind:")
        for kind, n in sorted(self.kills.items(), key=lambda kv: -kv[1]):
            print(f"  {n:>5}  {kind}")
        print("seconds by scenario:", {k: round(v) for k, v in self.seconds.most_common()})
        print("violations by invariant:")
        for name, n in sorted(self.violations.items()):
            print(f"  {n:>5}  {name}")
        print(
            f"{summary['kill_points']} kill points in {summary['seconds']} s; {messages} messages, "
            "final states "
            f"{states}; {stale} stale receipts counted; {self.calls_compared} ledger calls compared "
            "with the state store"
        )
        from invariants import INVARIANTS

        unchecked = [name for name in INVARIANTS if name not in self.violations]
        if unchecked:
            print(f"NOT CHECKED: {unchecked}")
        unknown = set(self.kills) - set(KINDS)
        assert not unknown, f"kill kinds missing from KINDS: {unknown}"
        missed = [kind for kind in KINDS if not self.kills[kind]]
        if missed:
            print(f"kill kinds that did not happen: {missed}")
        print("CHAOS_SUMMARY " + json.dumps(summary), flush=True)
        return 1 if sum(self.violations.values()) or unchecked else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-points", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--round", type=int, default=20, help="kill points between two invariant checks")
    parser.add_argument(
        "--no-spark", dest="spark", action="store_false", help="leave out the Spark kill points"
    )
    parser.add_argument("--spark-weight", type=int, default=1, help="weight of each Spark kill point kind")
    parser.add_argument("--keep-server", action="store_true", help="leave the suite's PostgreSQL running")
    parser.add_argument("--every-kind", action="store_true", help="run every kind of kill point first, once")
    parser.add_argument("--only", help="only these scenarios, comma-separated (to chase one kind)")
    parser.add_argument("--home", default=str(ROOT / ".redelivery" / "chaos"))
    parser.add_argument("--port", type=int, default=54339)
    args = parser.parse_args()
    setup_environment(Path(args.home), args.port)
    sys.path.insert(0, str(ROOT / "chaos"))
    controller = Controller(args)
    try:
        return controller.run()
    finally:
        for spark in (controller.spark, controller.standby):
            if spark is not None:
                spark.kill()
        controller.proxy.close()
        if not args.keep_server:
            from redelivery.spark import connect_server

            connect_server.stop()
            controller.embedded.stop()


if __name__ == "__main__":
    sys.exit(main())
