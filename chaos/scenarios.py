"""The crash suite's kill points (``KillPoints``, a part of the controller in chaos/run.py): each
scenario sets a worker going and kills it at a known statement, and keeps work around for the next
one (messages to receive, retries due, dead letters to redrive). Every method uses the controller's
database and worker plumbing (``spawn``, ``holding``, ``gate``, ``freeze_and_kill``, ``kills``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

from batch_kills import BatchKillPoints
from breaker_kills import BreakerKillPoints
from publish_kills import PublishKillPoints
from waiting_kills import WaitingKillPoints

if TYPE_CHECKING:  # the controller's worker handle (chaos/run.py imports this module)
    from run import Worker

TOPIC, GROUPS = "chaos", ("g1", "g2", "capped", "ordered", "halting")
#: The group subscribed ordered (issue 31): per key, one message at a time in publish order; a
#: dead-lettered head releases its key (on_exhausted continue).
ORDERED_GROUP = "ordered"
#: The group subscribed ordered with on_exhausted halt (issue 36): a dead-lettered head holds its key
#: (HALTED) until a redrive brings it back; one retry, so that heads reach the DLQ often.
HALT_GROUP = "halting"
ORDERED_GROUPS = (ORDERED_GROUP, HALT_GROUP)
#: The groups the scenarios consume, answer and redrive.
CONSUMERS = ("g1", "g2", ORDERED_GROUP, HALT_GROUP)
#: The suite's messages carry one of a few keys, so that an ordered group's keys have many
#: messages each, and a failed one holds back the next.
KEYS = 7
#: A topic of its own for retention: published at times long past, consumed, then its partitions
#: dropped; two groups, whose dead letters of one message are redriven at once after it left the log.
LOG_TOPIC, LOG_GROUP, LOG_AUDIT = "chaos-log", "log-reader", "log-audit"
LOG_GROUPS = (LOG_GROUP, LOG_AUDIT)
#: A topic another process deletes and makes again under the controller's long-lived client.
AGAIN_TOPIC, AGAIN_GROUP = "chaos-again", "again-reader"
#: Every (topic, group) the suite subscribes, as the drain reads them.
SUBSCRIBED = (
    *((TOPIC, g) for g in GROUPS),
    *((LOG_TOPIC, g) for g in LOG_GROUPS),
    (AGAIN_TOPIC, AGAIN_GROUP),
)
BACKLOG_LOCK = 7_424_003  # redelivery.store.catalog.BACKLOG_LOCK


class KillPoints(BatchKillPoints, BreakerKillPoints, PublishKillPoints, WaitingKillPoints):
    """The scenarios of the crash suite and the work they need around them."""

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

            messages = [Message({"n": i}, key=f"k{i % KEYS}") for i in range(30)]
            self.client.publish(TOPIC, messages, batch_id=batch)

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
        from redelivery.tiers.run import TierRunRequest, run_tier

        now = self.conn.execute("SELECT now()").fetchone()[0]
        run_tier(
            TierRunRequest(tier="fast", window_end=now, run_key=f"{purpose}-{uuid.uuid4().hex[:8]}"),
            url=self.url(),
            config=self.client.client.config,
        )

    def redrive_now(self, group: str, purpose: str) -> None:
        """A redrive of every dead letter of ``group`` in this process (never killed): a halt group's
        keys move on only when their halted heads are redriven."""
        from redelivery.redrive import RedriveRequest, redrive

        request = RedriveRequest(group=group, dry_run=False, rate_limit=None)
        redrive(request, run_key=f"{purpose}-{uuid.uuid4().hex[:8]}", url=self.url(), log=lambda *_: None,
                config=self.client.client.config)  # fmt: skip

    def churn(self) -> None:
        """A tier run, a redrive of the halt group's dead letters now and then, and a consumer pass in
        this process (not killed), so states keep moving."""
        self.tier_run_now("churn")
        if self.rng.random() < 0.3:
            self.redrive_now(HALT_GROUP, "churn")
        if self.rng.random() < 0.5:
            self.standing_now()
        for group in GROUPS:
            batch = self.client.receive(group, TOPIC, 10, 2)
            if batch:
                self.client.answer("ack", group, batch[: len(batch) // 2])
                self.client.answer("nack", group, batch[len(batch) // 2 :], error="churn")
        self.operate_breaker()

    # ---- kill points ------------------------------------------------------------------------

    def consumer_after_receive(self) -> None:
        self.top_up()
        with self.gate() as (name, _):
            worker = self.spawn(
                "consume",
                "--group",
                self.consumer_group(),
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
        group = self.consumer_group()
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
            at_gate = self.wait_until(
                lambda: self.waiting(worker.tag, "%chaos.gates%") or worker.proc.poll() is not None
            )
            if not at_gate or worker.proc.poll() is not None:  # it found nothing to receive
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
        group = self.rng.choice(CONSUMERS)
        self.make_dead_letters(group, 5)
        # the batch's last step adds to the group's redriven total: its dead letters are out of the
        # DLQ and back in flight or READY by then, uncommitted (the run's start only needs the row
        # FOR KEY SHARE, which this lock lets through)
        with self.holding("SELECT 1 FROM consumer_groups WHERE name = %s FOR NO KEY UPDATE", (group,)):
            worker = self.spawn("redrive", "--group", group, "--run-key", f"chaos-{uuid.uuid4().hex[:8]}")
            self.freeze_and_kill(worker, "redrive: inside a batch", "%REDRIVE_MOVE_BATCH%")

    def redrive_between_batches(self) -> None:
        group = self.rng.choice(CONSUMERS)
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

    def lost_commit(self, what: str) -> None:
        self.top_up()
        # an ack and a receive are each one statement outside a transaction, whose answer is its
        # commit's (an ack refuses a receipt of another topic inside its statement)
        trigger = {
            "publish": [b"COMMIT"],
            "receive": [b"redelivery:RECEIVE"],
            "ack": [b"redelivery:ACK"],
        }[what]
        self.proxy.arm(*trigger)
        if what == "publish":
            publish = ["publish", "--batch", f"lost-{uuid.uuid4().hex[:8]}", "--count", "20"]
            one_trip = ["--one-trip"] if self.rng.random() < 0.5 else []  # its COMMIT, then its wake
            worker = self.spawn(*publish, *one_trip, through_proxy=True)
        else:
            worker = self.spawn(
                "consume",
                "--group",
                self.consumer_group(),
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
        group = self.consumer_group()
        with self.holding(
            """SELECT 1 FROM subscriptions s JOIN consumer_groups g ON g.id = s.group_id
               JOIN topics t ON t.id = s.topic_id WHERE g.name = %s AND t.name = %s FOR UPDATE""",
            (group, TOPIC),
        ):
            worker = self.spawn("consume", "--group", group, "--max", "10", "--lease", "2")
            # an ordered group's receive locks the row first, in a statement of its own
            waiting = "%redelivery:LOCK_ORDERED%" if group in ORDERED_GROUPS else "%redelivery:RECEIVE%"
            self.freeze_and_kill(worker, "receive: waiting to move its consume offset", waiting)

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

    def old_log(self, leave: int = 0, reject: int = 0) -> None:
        """Messages of the retention topic published two days and more ago (a partition of the
        log of their own), received by both of its groups: the first ``reject`` of them rejected by
        both (dead letters of the same messages), the rest acknowledged, but for ``leave`` of them
        by the reader (which then hold the partition: a group that lags)."""
        from redelivery.client import Message

        now = self.conn.execute("SELECT now()").fetchone()[0]
        when = now - timedelta(days=2, hours=self.rng.randint(0, 200))
        batch = f"old-{uuid.uuid4().hex[:8]}"
        ids = self.client.publish(LOG_TOPIC, [Message({"n": i}) for i in range(5)], batch_id=batch, at=when)
        for group in LOG_GROUPS:
            while got := self.client.receive(group, LOG_TOPIC, 50, 600):
                dead = [m for m in got if m.message_id in ids[:reject]]
                if dead:
                    self.client.answer("reject", group, dead, error="chaos")
                got = [m for m in got if m not in dead]
                kept = got[:leave] if group == LOG_GROUP else []
                leave -= len(kept)
                if got[len(kept) :]:
                    self.client.answer("ack", group, got[len(kept) :])
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

    def retention_now(self) -> None:
        """A retention run of ours (never killed), between scenarios: partitions of every topic go
        while publishes, receives and redrives go on."""
        from redelivery.store.log import drop_expired_partitions

        drop_expired_partitions(self.conn, self.client.client.config.retention.seconds("messages"))

    def backdated_publish_racing_retention(self, frozen: str) -> None:
        """Issue 27's loss: a publish at a time past retention (a backfill's ``at``) and a retention
        run that comes to its partition. Either the publish is frozen at its COPY and the retention
        run, waiting for the partition's publishers, is killed there; or the controller holds the
        partition's retirement lock, as a retention run does, and the publish, waiting for it, is
        killed there (and published again, at times): ``frozen`` says which ("retention" or
        "publish"). Then a consumer and a retention run race the publish to its end: RETAINED and
        COMMITTED_HANDED see a message dropped unseen."""
        from redelivery.store import statements as S
        from redelivery.store.log import RETIRE_LOCK, ensure_partition

        self.top_up()
        ago = self.rng.randint(200, 900)
        when = self.conn.execute("SELECT now()").fetchone()[0] - timedelta(seconds=ago)
        ensure_partition(self.conn, when, self.client.client.config.retention.seconds("partition"))
        name = self.conn.execute(S.LOG_PARTITION_AT, {"at": when}).fetchone()[0]
        count, _, statement = self.publish_size()
        publish = (
            "publish",
            "--batch",
            f"back-{uuid.uuid4().hex[:8]}",
            "--count",
            str(count),
            "--ago",
            str(ago),
        )
        if frozen == "retention":
            with self.holding(f"LOCK TABLE redelivery_log.{name} IN SHARE MODE"):
                publisher = self.spawn(*publish)
                if self.wait_until(lambda: self.waiting(publisher.tag, f"%redelivery:{statement}%")):
                    retention = self.spawn("retention")
                    self.freeze_and_kill(
                        retention, "retention: waiting for the publishers of a partition",
                        "%LOCK_LOG_PARTITION_FOR_RETENTION%", wait_event="advisory",
                    )  # fmt: skip
        else:
            with self.holding("SELECT pg_advisory_lock(%s, hashtext(%s))", (RETIRE_LOCK, name)):
                publisher = self.spawn(*publish)
                killed = self.freeze_and_kill(
                    publisher, "backdated publish: waiting for retention to be done with its partition",
                    "%LOCK_LOG_PARTITION_FOR_PUBLISH%", wait_event="advisory",
                )  # fmt: skip
            if killed and self.rng.random() < 0.5:  # the producer tries again with the same batch id
                publisher = self.spawn(*publish)
        racing = [
            self.spawn("consume", "--group", self.rng.choice(CONSUMERS), "--max", "10", "--lease", "2"),
            self.spawn("retention"),
        ]
        for worker in [publisher, *racing]:
            self.run_to_end(worker)

    def recreate_topic(self) -> None:
        """A topic deleted and made again by another process under the controller's long-lived
        client, which keeps the topic's id from its last call (issue 27: its publish then raised
        UnknownTopicError, its receive returned nothing forever). The delete is killed first while
        it waits for a receive holding the topic's subscription, then runs to its end; the
        long-lived client then publishes to the new topic and receives it (the drain and FINAL see
        what it could not)."""
        from redelivery.client import Message

        def publish_and_take(n: int) -> None:
            batch = f"again-{uuid.uuid4().hex[:8]}"
            self.client.publish(AGAIN_TOPIC, [Message({"n": i}) for i in range(n)], batch_id=batch)
            got = self.client.receive(AGAIN_GROUP, AGAIN_TOPIC, 10, 30)
            if got:
                self.client.answer("ack", AGAIN_GROUP, got[: len(got) // 2 + 1])  # the rest in flight

        publish_and_take(3)
        recreate = ("recreate", "--topic", AGAIN_TOPIC, "--group", AGAIN_GROUP)
        with self.holding(
            "SELECT 1 FROM subscriptions s JOIN topics t ON t.id = s.topic_id"
            " WHERE t.name = %s FOR UPDATE OF s",
            (AGAIN_TOPIC,),
        ):
            self.freeze_and_kill(
                self.spawn(*recreate), "topic delete: waiting for the receives of its subscriptions",
                "%LOCK_SUBSCRIPTIONS_FOR_DELETE%",
            )  # fmt: skip
        self.run_to_end(self.spawn(*recreate))
        publish_and_take(2)

    def redrive_after_retention(self) -> None:
        """Dead letters of both groups of the retention topic whose messages retention dropped,
        redriven by two paced redrives at once (each puts the same messages back into the log: the
        second finds them there), with retention runs during their pauses (a partition made for a
        later batch may go: the batch makes it again); one of them killed between two batches at
        times (its dead letters stay, and a later run moves them)."""
        self.old_log(reject=3)
        self.finish_retention()
        redrives = [
            self.spawn(
                "redrive", "--group", group, "--run-key", f"late-{uuid.uuid4().hex[:8]}", "--rate", "1"
            )
            for group in LOG_GROUPS
        ]
        victim = self.rng.choice(redrives)
        for _ in range(2):  # a batch a second: retention runs inside the pacing
            time.sleep(self.rng.uniform(0.2, 0.8))
            self.run_to_end(self.spawn("retention"))
            if victim.proc.poll() is None and self.rng.random() < 0.5:
                victim.kill()
                self.kills["redrive: paced, of dead letters whose messages left the log"] += 1
        for worker in redrives:
            self.run_to_end(worker)

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
            kind, like = "Spark publish: inside the publishing transaction", "%redelivery:COPY_MESSAGES%"
        # a backfill job at times (its COPY goes to an old partition: only the claim can freeze it)
        ago = self.rng.choice([0, self.rng.randint(200, 900)]) if where == "before" else 0
        with self.holding(*hold):
            spark.send({"op": "publish", "batch": batch, "count": 30, "ago": ago})
            self.freeze_and_kill(spark, kind, like, timeout=60)
            self.spark = None
        if self.rng.random() < 0.5:  # the Airflow task's retry publishes the same batch id
            spark = self.spark_worker()
            spark.send({"op": "publish", "batch": batch, "count": 30, "ago": ago})
            self.expect(spark, "PUBLISHED", 120)

    def spark_task(self, job: str) -> None:
        spark = self.spark_worker()
        if job == "publish":
            batch = f"spark-{uuid.uuid4().hex[:8]}"
            hold, params, like = "LOCK TABLE publish_staging IN SHARE MODE", (), "%redelivery:STAGE_CHUNK%"
            ago = self.rng.choice([0, self.rng.randint(200, 900)])  # a backfill job, at times
            command, answer = {"op": "publish", "batch": batch, "count": 30, "ago": ago}, "PUBLISHED"
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
