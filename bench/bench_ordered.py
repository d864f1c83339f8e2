"""Ordered subscriptions (issues 31, 36): receive + ack against an unordered subscription, and a hot key.

    .venv/bin/python bench/bench_ordered.py [--messages 200000] [--keys 1000,100000] [--batch 500]
                                            [--fail-share 0.1] [--hot-keys 100000] [--hot-share 0.1]
                                            [--tier-every 1.0] [--rounds 2] [--quick]

Messages: ``--messages`` JSON bodies of about 220 B (``{"n": i, "payload": ...}``) published through
``Client.publish`` in batches of 1,000, keyed over K keys (``k0`` .. ``k<K-1>``, each key the same
number of times, in a shuffled order: the same with every run). A share ``--fail-share`` of them
(chosen by ``n``, the same in every drain) fails on its first delivery: ``Client.nack`` dated an hour
back, so its retry (the policy's first level) is due at once; every later delivery is acked. A tier
window (``run_tier``, in this process) of the tier that holds that level, ending at the
database's clock, runs every ``--tier-every`` seconds and after a receive that got nothing: it
promotes the nacked messages back to READY. Each group is drained by one consumer (``Client.receive``
of ``--batch`` with a lease of 300 s, ``Client.ack`` of the rest of the batch after the nack of its
failures) until it has committed every message; its wall time includes its receives, answers and
tier windows. ``deliveries`` is vacuumed and analyzed (empty) and a checkpoint taken before each
drain.

  ordered / unordered   per key count of ``--keys``: one topic, two groups subscribed before the
                        publish, one ``ordered=True``, one unordered, drained one after the other
                        over the same messages; ``--rounds`` times, each from a fresh publish, the
                        order of the two drains alternating (unordered first in the first round),
                        so that what else the machine runs weighs on both alike; each group's best
                        round counts (the one least disturbed), every round is printed. An ordered
                        receive hands out one message per key, each key's next one only after the
                        one before is acked (later ones wait as BLOCKED rows; a failed head holds
                        its key until its retry is promoted, received and acked): with 1,000 keys a
                        receive can hand out at most the heads of free keys, which is what it
                        measures.
  hot key               ``--hot-keys`` keys, ordered group only, drained twice from a fresh store:
                        without and with one more key, ``hot``, of ``--hot-share`` times
                        ``--messages`` messages spread evenly through the others (the first message
                        is its head), whose head is answered with ``reconsume_later(delay=864000)``
                        (never due in the run): every later message of it waits BLOCKED behind it.
                        The other keys' messages, failures and order are the same in both.

Prints for each drain messages committed per second, receives and messages per receive, the seconds
spent in receive, ack, retry (nack / reconsume_later) and tier windows, how a receive's cost moves
through the drain (of the receives that filled their batch, the fastest of the last tenth over the
fastest of the first, the least disturbed by what else runs: ``late/early``), and where the
time goes: the CPU seconds this process (the client, decoding, the tier windows)
and the consumer's PostgreSQL backend used (the rest of the wall time is waiting: commits' WAL
flushes, the machine's other work), and the statements the drain's client sent, by name, with
their calls and milliseconds a call (client-side: the round trip and the commit included); then
the ratio ordered / unordered per key count and the other keys' messages/s with / without the hot
key, each with its target (issue 36: ordered >= 0.7x unordered with 100,000 keys, and its receive's
cost flat as the backlog drains, late/early <= 1.2; other key counts reported; the hot key costs
the other keys nothing measurable, taken as with / without >= 0.95x; the spread between the rounds
of a group, which do the same work, is printed as the run's noise), and one JSON line
``ORDERED_SUMMARY``. A
drain in which a call raises a database error (or that can receive nothing more while messages are
left) stops there and is printed FAILED with the error and what it had committed; a target it was
to measure is then MISSED, and the run goes on. Runs on a database of
its own (redelivery_bench_ordered), or on ``REDELIVERY_BENCH_ORDERED_DATABASE_URL``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from bench_log_layout import failing

DATABASE = "redelivery_bench_ordered"
ORDERED, UNORDERED = "ordered", "unordered"
HOT = "hot"
PUBLISH_BATCH = 1_000
PAYLOAD = "x" * 200
LEASE = 300  # seconds: longer than any drain's batch takes to answer
PAST = timedelta(hours=1)  # a failure's nack is dated this far back: its retry is due at once
FAR = 864_000  # seconds: the hot key's head is retried this far out (the longest delay)
SEED = 31
QUICK_MESSAGES = 20_000
STALLS = 3  # empty receives in a row after tier windows that promoted nothing: the drain is stuck
TARGET_KEYS, TARGET = 100_000, 0.7  # ordered / unordered with 100,000 keys
HOT_TARGET = 0.95  # other keys' msgs/s with the hot key / without: "none measurable"
FLAT_TARGET = 1.2  # the ordered receive's median cost in the drain's last tenth / its first tenth
STATEMENTS_SHOWN = 6  # the statements a drain spent the most time in, printed
PARTS = ("receive", "ack", "retry", "tier")


class Stuck(Exception):
    """A drain that can receive nothing more while messages it must commit are left."""


def database() -> str:
    from redelivery.store import embedded

    if os.environ.get("REDELIVERY_BENCH_ORDERED_DATABASE_URL"):
        return os.environ["REDELIVERY_BENCH_ORDERED_DATABASE_URL"]
    embedded.ensure_running((DATABASE,))
    return embedded.url(DATABASE)


def sql(url: str, *statements: str) -> list:
    """Run ``statements`` in autocommit on a connection of their own; the last one's rows."""
    from redelivery.store import db

    with db.connect(url, autocommit=True) as conn:
        for statement in statements:
            cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


# ---- the messages -----------------------------------------------------------------------------------


def entries(n: int, keys: int, hot: int = 0) -> list[tuple[int, str]]:
    """(n, key) in publish order: ``n`` messages over ``keys`` keys, each key ``n / keys`` times in a
    shuffled order (the same for the same ``n`` and ``keys``), and ``hot`` messages of key ``hot``
    (``n`` -1, -2, ...) spread evenly among them, the first one first."""
    order = [i % keys for i in range(n)]
    random.Random(SEED).shuffle(order)
    out, placed = [], 0
    for i, key in enumerate(order):
        while placed < hot and placed * n // hot <= i:
            placed += 1
            out.append((-placed, HOT))
        out.append((i, f"k{key}"))
    return out


def prepare(url: str, topic: str, groups: dict[str, bool], messages: list[tuple[int, str]]) -> float:
    """A fresh store with ``topic``, ``groups`` ({name: ordered}) subscribed to it, ``messages``
    published (then the log vacuumed and analyzed, a checkpoint): the publish's seconds."""
    from redelivery.client import Client
    from redelivery.messaging.codec import Message
    from redelivery.store import db, maintenance

    with db.connect(url, autocommit=True) as conn:
        maintenance.empty_state_store(conn)
    with Client(url) as client:
        client.create_topic(topic)
        for group, ordered in groups.items():
            client.create_group(group)
            client.subscribe(group, topic, ordered=ordered)
        start = time.perf_counter()
        for s in range(0, len(messages), PUBLISH_BATCH):
            batch = messages[s : s + PUBLISH_BATCH]
            client.publish(topic, [Message({"n": i, "payload": PAYLOAD}, key=key) for i, key in batch])
        seconds = time.perf_counter() - start
    sql(url, "VACUUM ANALYZE redelivery.messages", "CHECKPOINT")
    return seconds


def retry_tiers(client, topic: str, groups) -> list[str]:
    """The tiers holding the level of each group's first retry on ``topic`` (its policy's)."""
    levels = {client.policy(topic, group).schedule(client.levels)[1][0] for group in groups}
    return sorted({t.name for t in client.config.tiers if levels & set(t.levels)})


# ---- the drain --------------------------------------------------------------------------------------


@dataclass
class Drain:
    """One group's drain: ``expected`` messages to commit, what it took."""

    group: str
    expected: int
    committed: int = 0
    seconds: float = 0.0
    receives: int = 0
    received: int = 0
    empty: int = 0
    tier_runs: int = 0
    promoted: int = 0
    blocked_left: int = 0
    error: str | None = None
    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    receive_times: list[float] = field(default_factory=list)
    client_cpu: float = 0.0
    server_cpu: float | None = None
    full_receive_times: list[float] = field(default_factory=list)
    statements: Statements | None = None

    def rate(self) -> float:
        return self.committed / self.seconds if self.seconds else 0.0

    def late_early(self) -> float | None:
        """How a receive's cost moves through the drain: of the receives that filled their batch,
        the fastest of the last tenth over the fastest of the first (the least disturbed by what
        else the machine runs: a disturbance only adds time; None: too few)."""
        full = self.full_receive_times
        tenth = len(full) // 10
        if tenth < 3:
            return None
        return round(min(full[-tenth:]) / min(full[:tenth]), 2)

    def figures(self) -> dict:
        return {
            "msgs_per_s": round(self.rate()),
            "committed": self.committed,
            "expected": self.expected,
            "seconds": round(self.seconds, 2),
            "receives": self.receives,
            "per_receive": round(self.received / max(1, self.receives), 1),
            "empty_receives": self.empty,
            "spent": {k: round(v, 2) for k, v in self.spent.items()},
            "tier_runs": self.tier_runs,
            "promoted": self.promoted,
            "blocked_left": self.blocked_left,
            "error": self.error,
            "receive_ms": round(1000 * statistics.median(self.receive_times), 2)
            if self.receive_times
            else None,
            "late_early": self.late_early(),
            "statements": self.statements.top(STATEMENTS_SHOWN) if self.statements else [],
            "cpu": {
                "client": round(self.client_cpu, 2),
                "server": None if self.server_cpu is None else round(self.server_cpu, 2),
            },  # fmt: skip
        }


def server_cpu(pid: int) -> float | None:
    """CPU seconds the PostgreSQL backend ``pid`` has used (user and system: ``/proc``), or None
    when it is not a process of this machine (a remote server)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _statement_name(query) -> str:
    """A statement's name (``/* redelivery:NAME */``), else its first word."""
    text = query if isinstance(query, str) else str(query)
    if text.startswith("/* redelivery:"):
        return text.removeprefix("/* redelivery:").split(" */", 1)[0]
    return (text.split() or ["?"])[0].upper()


class Statements:
    """Where a drain's time goes, client-side: while installed, the seconds and calls of every
    statement the process sends (``psycopg.Cursor.execute``, by name) and of every transaction's
    end (``COMMIT``: an explicit transaction's commit, its WAL flush), each call's round trip
    included."""

    def __init__(self):
        self.seconds: Counter = Counter()
        self.calls: Counter = Counter()

    def __enter__(self) -> Statements:
        import psycopg

        self._saved = (psycopg.Cursor.execute, psycopg.Transaction.__exit__)
        execute, end = self._saved
        stats = self

        def timed_execute(cursor, query, params=None, **kwargs):
            start = time.perf_counter()
            try:
                return execute(cursor, query, params, **kwargs)
            finally:
                stats.add(_statement_name(query), start)

        def timed_end(transaction, *exc):
            start = time.perf_counter()
            try:
                return end(transaction, *exc)
            finally:
                stats.add("COMMIT", start)

        psycopg.Cursor.execute, psycopg.Transaction.__exit__ = timed_execute, timed_end
        return self

    def __exit__(self, *exc) -> None:
        import psycopg

        psycopg.Cursor.execute, psycopg.Transaction.__exit__ = self._saved

    def add(self, name: str, start: float) -> None:
        self.seconds[name] += time.perf_counter() - start
        self.calls[name] += 1

    def top(self, n: int) -> list[dict]:
        """The ``n`` statements that took the most time: name, seconds, calls, ms a call."""
        return [
            {"name": name, "s": round(seconds, 2), "calls": self.calls[name],
             "ms": round(1000 * seconds / self.calls[name], 2)}
            for name, seconds in self.seconds.most_common(n)
        ]  # fmt: skip


class Consumer:
    """One consumer of ``group`` on ``topic`` (a client of its own), filling ``result``."""

    def __init__(self, url: str, topic: str, group: str, result: Drain):
        from redelivery.client import Client

        self.url, self.topic, self.group, self.result = url, topic, group, result
        self.client = Client(url)
        self.tiers = retry_tiers(self.client, topic, [group])

    def timed(self, part: str, call, *args, **kwargs):
        start = time.perf_counter()
        out = call(*args, **kwargs)
        self.result.spent[part] += time.perf_counter() - start
        return out

    def tier_window(self) -> int:
        """The retry tiers' windows ending at the database's clock: how many messages they promoted."""
        from redelivery.tiers.run import TierRunRequest, run_tier

        window_end = self.client.conn.execute("SELECT clock_timestamp()").fetchone()[0]
        promoted = 0
        for tier in self.tiers:
            run_key = f"bench-ordered-{self.topic}-{self.group}-{self.result.tier_runs}"
            promoted += run_tier(
                TierRunRequest(tier=tier, window_end=window_end, run_key=run_key), url=self.url
            )["promoted"]
        self.result.tier_runs += 1
        return promoted

    def run(self, fail: set[int], batch: int, tier_every: float) -> None:
        """Receive, nack the failures, retry the hot key's head far out, ack the rest; a tier window
        every ``tier_every`` seconds and after an empty receive; until ``expected`` are committed."""
        client, group, result = self.client, self.group, self.result
        last_tier, stalls = time.perf_counter(), 0
        while result.committed < result.expected:
            start = time.perf_counter()
            got = self.timed("receive", client.receive, group, self.topic, batch, LEASE)
            result.receive_times.append(time.perf_counter() - start)
            if len(got) == batch:
                result.full_receive_times.append(result.receive_times[-1])
            result.receives += 1
            result.received += len(got)
            result.empty += not got
            hot = [m for m in got if m.key == HOT]
            failed = [m for m in got if m.key != HOT and m.delivery_count == 1 and m.body["n"] in fail]
            acks = [m for m in got if m.key != HOT and not (m.delivery_count == 1 and m.body["n"] in fail)]
            if failed:
                done = self.timed("retry", client.nack, group, failed, "bench", datetime.now(UTC) - PAST)
                assert done == len(failed), (done, len(failed))
            if hot:
                done = self.timed("retry", client.reconsume_later, group, hot, delay=FAR, error="hot key")
                assert done == len(hot), (done, len(hot))
            if acks:
                done = self.timed("ack", client.ack, group, acks)
                assert done == len(acks), (done, len(acks))
                result.committed += done
            due = not got or time.perf_counter() - last_tier >= tier_every
            if result.committed < result.expected and due:
                promoted = self.timed("tier", self.tier_window)
                result.promoted += promoted
                last_tier = time.perf_counter()
                stalls = stalls + 1 if not got and not promoted else 0
                if stalls >= STALLS:
                    states = client.stats()[self.topic][group]
                    raise Stuck(f"{group} on {self.topic} is stuck: {states}")


def drain(url: str, topic: str, group: str, expected: int, fail: set[int], args) -> Drain:
    """Drain ``group`` with one consumer until it committed ``expected`` messages: a message whose
    ``n`` is in ``fail`` is nacked on its first delivery (dated ``PAST`` back: due at once), the hot
    key's head retried ``FAR`` out, everything else acked. A call that raises a database error, or a
    drain that is stuck, ends it: the error is recorded (``Drain.error``) with what was committed
    until then."""
    import psycopg

    sql(url, "VACUUM ANALYZE redelivery.deliveries", "CHECKPOINT")
    result = Drain(group, expected)
    consumer = Consumer(url, topic, group, result)
    backend = consumer.client.conn.info.backend_pid
    start, cpu, server = time.perf_counter(), time.process_time(), server_cpu(backend)
    try:
        with Statements() as result.statements:
            consumer.run(fail, args.batch, args.tier_every)
    except (psycopg.Error, Stuck) as exc:
        result.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    finally:
        result.seconds = time.perf_counter() - start
        result.client_cpu = time.process_time() - cpu
        after = server_cpu(backend)
        result.server_cpu = after - server if after is not None and server is not None else None
    try:
        result.blocked_left = consumer.client.stats()[topic][group].get("BLOCKED", 0)
    finally:
        consumer.client.close()
    assert result.error or result.committed == expected, (group, result.committed, expected)
    return result


# ---- the report -------------------------------------------------------------------------------------


def print_header(n: int, args) -> None:
    print(
        f"receive + ack of {n:,} messages of about 220 B, {args.fail_share:.0%} failing once (nack dated "
        f"{PAST.total_seconds():.0f} s back: due at once), 1 consumer per group, batches of {args.batch}, "
        f"lease {LEASE} s, tier window every {args.tier_every} s and after an empty receive; "
        f"{args.rounds} round(s) per key count, the two drains' order alternating"
    )
    print(
        f"{'keys':>8} {'group':<16} {'msgs/s':>8} {'wall s':>7} {'receives':>8} {'msgs/recv':>9} "
        f"{'empty':>5} {'receive s':>9} {'ack s':>6} {'retry s':>7} {'tier s':>6} {'(runs)':>6} "
        f"{'promoted':>8} {'recv ms':>7} {'late/early':>10}",
        flush=True,
    )


def print_row(keys: str, name: str, f: dict) -> None:
    s = f["spent"]
    late = f"{f['late_early']:.2f}" if f["late_early"] is not None else "-"
    print(
        f"{keys:>8} {name:<16} {f['msgs_per_s']:>8,} {f['seconds']:>7.2f} {f['receives']:>8,} "
        f"{f['per_receive']:>9.1f} {f['empty_receives']:>5} {s['receive']:>9.2f} {s['ack']:>6.2f} "
        f"{s['retry']:>7.2f} {s['tier']:>6.2f} {f['tier_runs']:>6} {f['promoted']:>8,} "
        f"{f['receive_ms'] or 0:>7.2f} {late:>10}",
        flush=True,
    )
    where = ", ".join(
        f"{t['name']} {t['s']:.2f} s ({t['calls']:,} x {t['ms']:.2f} ms)" for t in f["statements"]
    )
    cpu = f["cpu"]
    server = f"{cpu['server']:.2f}" if cpu["server"] is not None else "-"
    print(f"{'':>8} {'':<16} cpu s: this process {cpu['client']:.2f}, its PostgreSQL backend {server}; "
          f"time in: {where}", flush=True)  # fmt: skip
    if f["error"]:
        print(
            f"{'':>8} {'':<16} FAILED after {f['committed']:,} of {f['expected']:,} committed (msgs/s above: "
            f"until then): {f['error']}",
            flush=True,
        )


def ratio_of(ours: dict, theirs: dict) -> float | None:
    """msgs/s ``ours`` / ``theirs``; None when either drain failed."""
    return None if ours["error"] or theirs["error"] else round(ours["msgs_per_s"] / theirs["msgs_per_s"], 2)


def verdict(ratio: float | None, target: float, most: bool = False) -> str:
    """``ratio`` against ``target``: at least it, or, ``most``, at most it."""
    sign = "<=" if most else ">="
    if ratio is None:
        return f"not measured (a drain failed; target {sign} {target:.2f}x): MISSED"
    met = ratio <= target if most else ratio >= target
    return f"{ratio:.2f}x {sign} {target:.2f}x: {'met' if met else 'MISSED'}"


def target(ratio: float | None, goal: float, most: bool = False) -> dict:
    met = ratio is not None and (ratio <= goal if most else ratio >= goal)
    return {"ratio": ratio, "target": goal, "met": met, **({"at_most": True} if most else {})}


def best(rounds: list[dict]) -> dict:
    """A group's best round (the least disturbed): the most msgs/s among those that did not fail, else
    the first."""
    done = [r for r in rounds if not r["error"]]
    return max(done, key=lambda r: r["msgs_per_s"]) if done else rounds[0]


def spread(rounds: list[dict]) -> float | None:
    """How much a group's rounds (the same work) differ: 1 - slowest / fastest."""
    rates = [r["msgs_per_s"] for r in rounds if not r["error"]]
    return round(1 - min(rates) / max(rates), 3) if len(rates) > 1 and max(rates) else None


def key_count(url: str, keys: int, n: int, fail: set[int], args) -> dict:
    """``args.rounds`` rounds of an unordered and an ordered drain of ``n`` messages over ``keys``
    keys, each from a fresh publish, the order alternating: every round, each group's best, their
    ratio, the noise."""
    rounds: dict[str, list[dict]] = {UNORDERED: [], ORDERED: []}
    published = []
    for r in range(args.rounds):
        topic = f"bench_k{keys}"
        published.append(prepare(url, topic, {UNORDERED: False, ORDERED: True}, entries(n, keys)))
        for group in (UNORDERED, ORDERED) if r % 2 == 0 else (ORDERED, UNORDERED):
            figures = drain(url, topic, group, n, fail, args).figures()
            rounds[group].append(figures)
            print_row(f"{keys:,}", f"{group} #{r + 1}", figures)
    rows = {group: best(rounds[group]) for group in rounds}
    rows["ratio"] = ratio_of(rows[ORDERED], rows[UNORDERED])
    rows["rounds"] = rounds
    rows["noise"] = {group: spread(rounds[group]) for group in (UNORDERED, ORDERED)}
    rows["publish_s"] = round(min(published), 2)
    return rows


def hot_key(url: str, n: int, fail: set[int], args, hot: int) -> dict:
    print(
        f"one hot key: {hot:,} more messages spread among the {n:,} over {args.hot_keys:,} keys, its "
        f"head retried in {FAR:,} s (the rest BLOCKED); ordered group only; msgs/s of the other keys"
    )
    runs = {}
    for name, extra in (("without hot key", 0), ("with hot key", hot)):
        topic = "bench_hot" if extra else "bench_cold"
        prepare(url, topic, {ORDERED: True}, entries(n, args.hot_keys, extra))
        runs[name] = drain(url, topic, ORDERED, n, fail, args).figures()
        print_row(f"{args.hot_keys:,}", name, runs[name])
    ratio = ratio_of(runs["with hot key"], runs["without hot key"])
    return {"messages": hot, "keys": args.hot_keys, **runs, "ratio": ratio}


def report(summary: dict) -> None:
    """The targets, each measured in this run."""
    print("targets, same run (each group's best round):")
    for keys, rows in summary["by_keys"].items():
        noise = ", ".join(f"{g} {v:.1%}" for g, v in rows["noise"].items() if v is not None)
        if keys == TARGET_KEYS:
            text = verdict(rows["ratio"], TARGET)
            summary["targets"]["ordered_vs_unordered"] = target(rows["ratio"], TARGET)
            flat = rows[ORDERED]["late_early"]
            summary["targets"]["ordered_receive_flat"] = target(flat, FLAT_TARGET, most=True)
            text += f"; ordered receive's late/early {verdict(flat, FLAT_TARGET, most=True)}"
        elif rows["ratio"] is None:
            text = "not measured (a drain failed)"
        else:
            text = f"{rows['ratio']:.2f}x (reported; the target is for {TARGET_KEYS:,} keys)"
        per = rows[ORDERED]["per_receive"]
        print(f"  ordered / unordered, {keys:,} keys: {text}; ordered receives hand out {per:.1f} msgs each")
        if noise:
            print(f"    noise: the rounds of a group (the same work) differ by {noise}")
    if summary["hot"]:
        ratio = summary["hot"]["ratio"]
        summary["targets"]["hot_key"] = target(ratio, HOT_TARGET)
        left = summary["hot"]["with hot key"]["blocked_left"]
        print(
            f"  hot key: other keys' msgs/s with / without {verdict(ratio, HOT_TARGET)} "
            f"({left:,} BLOCKED rows left behind its head)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--keys", default="1000,100000", help="key counts, comma-separated")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--fail-share", type=float, default=0.1, help="share failing on first delivery")
    parser.add_argument("--hot-keys", type=int, default=100_000, help="other keys of the hot-key runs")
    parser.add_argument(
        "--hot-share", type=float, default=0.1, help="hot key's messages / --messages (0: no hot-key runs)"
    )
    parser.add_argument("--tier-every", type=float, default=1.0, help="seconds between tier windows")
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds per key count (each group's best counts)"
    )
    parser.add_argument("--quick", action="store_true", help=f"a small run: {QUICK_MESSAGES:,} messages")
    args = parser.parse_args()
    from redelivery.store import db

    n = QUICK_MESSAGES if args.quick else args.messages
    url = database()
    db.migrate(url)
    fail = failing(list(range(n)), args.fail_share)
    summary = {"messages": n, "batch": args.batch, "fail_share": args.fail_share, "rounds": args.rounds,
               "tier_every": args.tier_every, "by_keys": {}, "hot": None, "targets": {}}  # fmt: skip
    print_header(n, args)
    for keys in (int(k) for k in args.keys.split(",") if k):
        summary["by_keys"][keys] = key_count(url, keys, n, fail, args)
    hot = round(n * args.hot_share)
    if hot:
        summary["hot"] = hot_key(url, n, fail, args, hot)
    report(summary)
    print("ORDERED_SUMMARY " + json.dumps(summary, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
