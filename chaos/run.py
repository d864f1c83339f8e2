"""The crash suite: real processes killed at known points, and the promise checked after each round.

    make chaos      # 1000 kill points; .venv/bin/python chaos/run.py --kill-points 60 --seed 7

It runs on an embedded PostgreSQL of its own (REDELIVERY_HOME/chaos, port 54339), so that it can
restart the server with an immediate shutdown without disturbing anything else. Workers
(chaos/worker.py) are real publishers, consumers, tier runs, redrives and a Spark driver, using the
public API. A kill point freezes a worker at a known statement (the controller holds a row, table or
advisory lock the statement needs, and waits until pg_stat_activity shows the worker waiting on it),
then kills it with SIGKILL; lost commit answers come from a proxy that drops the answer to a COMMIT
(chaos/proxy.py); an immediate shutdown restarts PostgreSQL in the middle of runs. After every
round the invariants of chaos/invariants.py are checked; at the end the system is drained and
every message must have ended exactly once per group."""

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
from pathlib import Path

from kinds import KINDS  # every kind of kill point (tests import it from here)
from scenarios import (
    AGAIN_GROUP,
    AGAIN_TOPIC,
    GROUPS,
    HALT_GROUP,
    LOG_GROUP,
    LOG_GROUPS,
    LOG_TOPIC,
    ORDERED_GROUP,
    SUBSCRIBED,
    TOPIC,
    KillPoints,
)

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "chaos" / "worker.py"
CONFIG = ROOT / "chaos" / "config.yaml"


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


class Controller(KillPoints):
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
        self.halted_most = 0  # the most HALTED heads (keys a dead letter holds) a round's check saw
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
            from invariants import install

            install(conn)  # the schema chaos, with the record of dropped partitions
            conn.execute("CREATE TABLE chaos.gates (name text PRIMARY KEY)")
            conn.execute("CREATE TABLE chaos.received (gate text, ids bigint[])")
        with Client(self.url()) as client:
            client.create_topic(TOPIC)
            for group in GROUPS:
                client.create_group(group, max_reconsume_times=1 if group in ("g2", HALT_GROUP) else None)
                if group == HALT_GROUP:
                    client.subscribe(group, TOPIC, ordered=True, on_exhausted="halt")
                else:
                    client.subscribe(group, TOPIC, ordered=group == ORDERED_GROUP)
            client.create_topic(LOG_TOPIC)
            for group in LOG_GROUPS:
                client.create_group(group)
                client.subscribe(group, LOG_TOPIC)
            client.create_topic(AGAIN_TOPIC)
            client.create_group(AGAIN_GROUP)
            client.subscribe(AGAIN_GROUP, AGAIN_TOPIC)
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

    SCENARIOS = {  # the run's scenarios, name: weight
        "consumer_after_receive": 14,
        "consumer_waiting": 6,
        "consumer_inside_answer": 14,
        "consumer_inside_answer:extend": 4,
        "tier_inside_range": 12,
        "tier_before_its_record": 8,
        "tier_batch_inside_window": 4,
        "tier_batch_between_windows": 3,
        "redrive_inside_batch": 8,
        "redrive_between_batches": 5,
        "publish_inside_transaction:small": 5,
        "publish_inside_transaction:copy": 5,
        "publish_inside_transaction:one_trip": 5,
        "lost_commit:publish": 6,
        "lost_commit:receive": 6,
        "lost_commit:ack": 6,
        "restart_postgres": 2,
        "receive_moving_its_offset": 6,
        "partition_before_its_record": 3,
        "retention_inside_detach": 3,
        "retention_inside_drop": 3,
        "backdated_publish_racing_retention:retention": 2,
        "backdated_publish_racing_retention:publish": 2,
        "recreate_topic": 2,
        "redrive_after_retention": 2,
        "breaker_row_held:answer": 3,
        "breaker_row_held:tier": 2,
        "breaker_row_held:transition": 3,
        "standing_inside_batch": 3,
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
        halted = self.conn.execute("SELECT count(*) FROM deliveries WHERE state = 'HALTED'").fetchone()[0]
        self.halted_most = max(self.halted_most, halted)
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
            self.operate_breaker(close_all=True)  # as an operator ends an outage: parked retries go on
            self.tier_run_now("drain")
            self.redrive_now(HALT_GROUP, "drain")  # its halted keys go on only once redriven
            for topic, group in SUBSCRIBED:
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
        # --every-kind: rounds go on until every scenario was tried, whatever the kill points (a
        # scenario added made 30 kill points end before the last two, the Spark tier and consumer)
        while sum(self.kills.values()) < self.args.kill_points or forced:
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
                if self.rng.random() < 0.1:
                    self.retention_now()
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

    def ordered_figures(self) -> dict:
        """The ordered groups (name: on_exhausted), the most HALTED heads a round saw, how many
        dead letters of the halt group redrives brought back (each a halted key released), and what
        each standing redrive brought back ([moves, highest generation])."""
        ordered = self.conn.execute(
            "SELECT g.name, s.on_exhausted FROM subscriptions s JOIN consumer_groups g ON g.id = s.group_id"
            " WHERE s.ordered ORDER BY 1"
        ).fetchall()
        redriven = self.conn.execute(
            "SELECT count(*) FROM redrive_moves m JOIN consumer_groups g ON g.id = m.group_id"
            " WHERE g.name = %s",
            (HALT_GROUP,),
        ).fetchone()[0]
        standing = self.conn.execute(
            "SELECT p.name, count(m.*), coalesce(max(m.generation), 0) FROM standing_redrives p"
            " LEFT JOIN redrive_runs r ON r.standing_id = p.id LEFT JOIN redrive_moves m ON m.run_id = r.id"
            " GROUP BY p.name ORDER BY 1"
        ).fetchall()
        return {
            "ordered_groups": dict(ordered), "halted_most": self.halted_most, "halted_redriven": redriven,
            # what each standing redrive brought back, and the highest generation it moved
            "standing_moved": {name: [moved, top] for name, moved, top in standing},
        }  # fmt: skip

    def report(self, seconds: float) -> int:
        from redelivery.messaging.codec import STATES
        from redelivery.store import statements as S

        messages = self.conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        states: Counter = Counter()
        for _, _, *numbers in self.conn.execute(S.SUBSCRIPTION_STATES):
            states.update(dict(zip(STATES, numbers, strict=True)))
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
            **self.ordered_figures(),
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
