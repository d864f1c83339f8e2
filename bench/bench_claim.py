"""Claim latency at fixed offered rates, the peak, and churn under a held horizon, against PGMQ's
SQL on the same PostgreSQL in the same run (issue 42).

    make bench-claim
    .venv/bin/python bench/bench_claim.py [--seconds 30] [--held-seconds 60] [--peak 50000]

Each system gets the same load: a publisher thread sends one message at a time at a fixed offered
rate (open loop: on a schedule, whatever the consumers do), stamping its body with the time it
started to send (how long the send took is printed beside: it is part of the latency); N consumer
threads (a connection each) claim up to 10 messages, take each one's publish-to-handler latency,
and acknowledge them. Latencies go to a fixed histogram (0.1 ms bins to
10 s: bounded memory, exact to a bin).

  pgmq          PGMQ 1.x's statements on a pgmq-shaped table (``pgmq.send``, ``pgmq.read``:
                an UPDATE of the visibility time over ``FOR UPDATE SKIP LOCKED`` rows,
                ``pgmq.delete``), polled as ``pgmq.read_with_poll`` polls: read, and when empty
                sleep ``--poll-ms`` (10 ms here; PGMQ's default is 100 ms) and read again.
  redelivery    ``Client.publish`` / ``Client.receive(..., wait_seconds=20)`` / ``Client.ack``:
                an idle consumer waits for a wake-up (LISTEN/NOTIFY, sent only while somebody
                waits), not a poll.
  redelivery-poll  the same without ``wait_seconds``, polled as PGMQ is (the claim alone).

Phases: 40 msg/s with 4 consumers, 400 msg/s with 16 (``--seconds`` each; latency p50/p95/p99,
completion, and the rate the publisher reached: one thread, one publish at a time, it falls
behind the schedule when a publish takes longer than the interval); the peak: ``--peak``
messages waiting, drained by 16 consumers in batches of ``--peak-batch`` (msg/s); dead tuples
after ``--held-seconds`` at 400 msg/s with a transaction holding the xmin horizon, against the
same run without it. Targets (issue 42): claim p50 at 400/s x 16 <= PGMQ's, and <= 10 ms at 40/s
with wait_seconds; p99 at 400/s x 16 <= PGMQ's; peak >= 1.5x PGMQ's; dead tuples with the held
horizon within 1.2x of the clean level. Runs on a database of its own (redelivery_bench).

Where the time goes (``cpu.py``): each phase prints the CPU a message of this process (the client:
publisher and consumers) and of the PostgreSQL server (every backend), and how busy the machine's
cores were; a MISSED target says it, ours beside PGMQ's, and for the dead tuples, their tables.
"""

from __future__ import annotations

import argparse
import threading
import time
from array import array

import orjson
from bench_tier import database
from cpu import CpuMeter, Spent, postmaster

BATCH = 10
BINS = 100_000  # 0.1 ms each: 0 .. 10 s
PGMQ_TABLE = """
DROP TABLE IF EXISTS bench_pgmq;
CREATE TABLE bench_pgmq (
    msg_id bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    read_ct int NOT NULL DEFAULT 0,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    vt timestamptz NOT NULL DEFAULT now(),
    message jsonb);
CREATE INDEX bench_pgmq_vt ON bench_pgmq (vt ASC)"""
PGMQ_SEND = "INSERT INTO bench_pgmq (vt, message) VALUES (clock_timestamp(), %s::jsonb) RETURNING msg_id"
PGMQ_READ = """
WITH cte AS (SELECT msg_id FROM bench_pgmq WHERE vt <= clock_timestamp()
             ORDER BY msg_id ASC LIMIT %(n)s FOR UPDATE SKIP LOCKED)
UPDATE bench_pgmq m SET vt = clock_timestamp() + interval '30 seconds', read_ct = read_ct + 1
FROM cte WHERE m.msg_id = cte.msg_id
RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.vt, m.message"""
PGMQ_DELETE = "DELETE FROM bench_pgmq WHERE msg_id = ANY(%(ids)s) RETURNING msg_id"


class Histogram:
    """Latencies in 0.1 ms bins up to 10 s (the last bin: above), thread-safe enough for ``+=`` on
    one array under the GIL."""

    def __init__(self) -> None:
        self.bins = array("q", [0]) * (BINS + 1)
        self.count = 0

    def add(self, seconds: float) -> None:
        self.bins[min(max(int(seconds * 10_000), 0), BINS)] += 1
        self.count += 1

    def quantile(self, q: float) -> float:
        """Milliseconds at quantile ``q`` (the upper edge of its bin)."""
        wanted, seen = q * self.count, 0
        for index, n in enumerate(self.bins):
            seen += n
            if seen >= wanted and n:
                return (index + 1) / 10
        return float("nan")


class System:
    """One system's publish, claim and ack, each on a connection of its caller's."""

    name = ""

    def open(self, url: str):
        raise NotImplementedError

    def publish(self, handle, body: bytes) -> None:
        raise NotImplementedError

    def claim(self, handle, wait: float, batch: int = 10) -> list[bytes]:
        """Up to ``batch`` bodies claimed and acknowledged (empty after polling ``wait`` seconds)."""
        raise NotImplementedError


class Pgmq(System):
    name = "pgmq"

    def __init__(self, poll_seconds: float):
        self.poll = poll_seconds

    def reset(self, url: str) -> None:
        from redelivery.store import db

        with db.connect(url, autocommit=True) as conn:
            for statement in PGMQ_TABLE.split(";"):
                conn.execute(statement)

    def open(self, url: str):
        from redelivery.store import db

        return db.connect(url, autocommit=True)

    def publish(self, conn, body: bytes) -> None:
        conn.execute(PGMQ_SEND, (body.decode(),))

    def claim(self, conn, wait: float, batch: int = BATCH) -> list:
        deadline = time.monotonic() + wait
        while True:  # pgmq.read_with_poll: read; empty: sleep the poll interval, read again
            rows = conn.execute(PGMQ_READ, {"n": batch}).fetchall()
            if rows:
                conn.execute(PGMQ_DELETE, {"ids": [r[0] for r in rows]})
                return [r[4] for r in rows]
            if time.monotonic() >= deadline:
                return []
            time.sleep(self.poll)

    def dead_tuples(self, conn) -> dict[str, int]:
        """Dead tuples by table."""
        return dict(
            conn.execute(
                "SELECT relname, n_dead_tup FROM pg_stat_user_tables WHERE relname LIKE 'bench_pgmq%%'"
            ).fetchall()
        )


class Redelivery(System):
    def __init__(self, poll_seconds: float | None):
        self.poll = poll_seconds  # None: wait_seconds, no poll
        self.name = "redelivery" if poll_seconds is None else "redelivery-poll"

    def reset(self, url: str) -> None:
        from redelivery.client import Client
        from redelivery.store import db, maintenance

        with db.connect(url, autocommit=True) as conn:
            maintenance.empty_state_store(conn)
        with Client(url) as client:
            client.create_topic("claim")
            client.create_group("bench")
            client.subscribe("bench", "claim")

    def open(self, url: str):
        from redelivery.client import Client

        return Client(url)

    def publish(self, client, body: bytes) -> None:
        client.publish("claim", [orjson.loads(body)])

    def claim(self, client, wait: float, batch: int = BATCH) -> list:
        deadline = time.monotonic() + wait
        while True:
            remaining = max(deadline - time.monotonic(), 0)
            waits = min(remaining, 20) if self.poll is None else 0
            got = client.receive("bench", "claim", batch, 30, wait_seconds=waits)
            if got:
                client.ack("bench", got)
                return [m.body for m in got]
            if time.monotonic() >= deadline:
                return []
            if self.poll is not None:
                time.sleep(self.poll)

    def dead_tuples(self, conn) -> dict[str, int]:
        """Dead tuples by table (the log's partitions as one: ``messages``)."""
        return dict(
            conn.conn.execute(
                "SELECT CASE WHEN schemaname = 'redelivery_log' THEN 'messages' ELSE relname END, "
                "sum(n_dead_tup)::bigint FROM pg_stat_user_tables "
                "WHERE schemaname IN ('redelivery', 'redelivery_log') GROUP BY 1"
            ).fetchall()
        )


def offered(system: System, url: str, rate: float, consumers: int, seconds: float, meter: CpuMeter) -> dict:
    """Publish at ``rate`` msg/s for ``seconds`` with ``consumers`` consumers; latency quantiles
    (ms), messages handled / offered, and the CPU spent (``cpu``: a ``Spent``)."""
    histogram, stop, handled = Histogram(), threading.Event(), [0] * consumers
    publishing = Histogram()  # how long a publish call takes: part of every latency above

    def consume(i: int) -> None:
        handle = system.open(url)
        try:
            while not stop.is_set():
                for body in system.claim(handle, 0.5):
                    sent = body["t"] if isinstance(body, dict) else orjson.loads(body)["t"]
                    histogram.add(time.time() - sent)
                    handled[i] += 1
        finally:
            handle.close()

    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(consumers)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # connected and waiting
    publisher = system.open(url)
    sent, start = 0, time.monotonic()
    meter.start()
    try:
        while time.monotonic() - start < seconds:
            due = start + sent / rate
            if (pause := due - time.monotonic()) > 0:
                time.sleep(pause)
            stamp = time.time()
            system.publish(publisher, orjson.dumps({"t": stamp, "payload": "x" * 200}))
            publishing.add(time.time() - stamp)
            sent += 1
        drain_until = time.monotonic() + 10
        while sum(handled) < sent and time.monotonic() < drain_until:
            time.sleep(0.05)
        spent = meter.stop()
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        publisher.close()
    return {
        "p50": histogram.quantile(0.5), "p95": histogram.quantile(0.95), "p99": histogram.quantile(0.99),
        "completion": sum(handled) / sent, "offered": sent / seconds, "publish": publishing.quantile(0.5),
        "cpu": spent, "handled": sum(handled),
    }  # fmt: skip


def peak(
    system: System, url: str, n: int, consumers: int, batch: int, meter: CpuMeter
) -> tuple[float, Spent, int]:
    """Messages per second for ``consumers`` draining ``n`` waiting messages, ``batch`` a claim, the
    CPU the drain spent, and the messages drained."""
    handle = system.open(url)
    body = orjson.dumps({"t": 0, "payload": "x" * 200})
    for _ in range(0, n, 1000):
        if isinstance(system, Pgmq):
            handle.execute(
                "INSERT INTO bench_pgmq (message) SELECT %s::jsonb FROM generate_series(1, 1000)",
                (body.decode(),),
            )
        else:
            handle.publish("claim", [orjson.loads(body)] * 1000)
    handle.close()
    done = [0] * consumers

    def drain(i: int) -> None:
        h = system.open(url)
        try:
            while got := system.claim(h, 0, batch):
                done[i] += len(got)
        finally:
            h.close()

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(consumers)]
    meter.start()
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    return sum(done) / seconds, meter.stop(), sum(done)


def churn(system: System, url: str, seconds: float, held: bool, meter: CpuMeter) -> dict[str, int]:
    """Dead tuples by table after ``seconds`` at 400 msg/s with 16 consumers, a transaction holding
    the xmin horizon all along when ``held`` (from a clean, vacuumed start)."""
    from redelivery.store import db

    system.reset(url)
    with db.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM")
    holder = db.connect(url)
    if held:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT txid_current()").fetchone()  # a snapshot and an xid: the horizon held
    try:
        offered(system, url, 400, 16, seconds, meter)
        time.sleep(1.0)  # the statistics collector
        handle = system.open(url)
        try:
            return system.dead_tuples(handle)
        finally:
            handle.close()
    finally:
        holder.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30, help="each offered-rate phase")
    parser.add_argument("--held-seconds", type=float, default=60)
    parser.add_argument("--peak", type=int, default=50_000, help="messages waiting for the peak")
    parser.add_argument("--peak-batch", type=int, default=100, help="messages a claim takes at the peak")
    parser.add_argument(
        "--poll-ms", type=float, default=10, help="PGMQ's poll interval (and redelivery-poll's)"
    )
    args = parser.parse_args()
    from redelivery.store import db

    url = database()
    db.migrate(url)
    with db.connect(url, autocommit=True) as conn:
        meter = CpuMeter(postmaster(conn))
    poll = args.poll_ms / 1000
    systems = [Pgmq(poll), Redelivery(None), Redelivery(poll)]
    rows = latency_phases(systems, url, args, meter)
    peaks = {}
    for system in systems[:2]:
        system.reset(url)
        peaks[system.name] = peak(system, url, args.peak, 16, args.peak_batch, meter)
        print(
            f"peak {system.name:<12} {peaks[system.name][0]:>10,.0f} msg/s ({args.peak:,} waiting, "
            f"16 consumers, batches of {args.peak_batch}); "
            f"{peaks[system.name][1].per_message(peaks[system.name][2])}",
            flush=True,
        )
    dead = {}
    for system in systems[:2]:
        clean = churn(system, url, args.held_seconds, False, meter)
        held = churn(system, url, args.held_seconds, True, meter)
        dead[system.name] = (clean, held)
        before, after = sum(clean.values()), sum(held.values())
        print(
            f"dead tuples {system.name:<12} clean {before:>9,}  held horizon {after:>9,}  "
            f"({after / max(before, 1):.2f}x)",
            flush=True,
        )
    report(rows, peaks, dead)
    with db.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_pgmq")


def latency_phases(systems: list[System], url: str, args, meter: CpuMeter) -> dict:
    """The offered-rate phases, printed as they end; ``{(system, rate): offered(...)}``."""
    rows: dict = {}
    print(
        f"claim latency: one publisher at a fixed rate, {args.seconds:g} s a phase; "
        f"PGMQ polls every {args.poll_ms:g} ms"
    )
    print(
        f"{'system':<16} {'rate x consumers':>16} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'done':>6}"
        f" {'publish p50':>12} {'sent':>8}  CPU"
    )
    for rate, consumers in ((40, 4), (400, 16)):
        for system in systems:
            system.reset(url)
            r = offered(system, url, rate, consumers, args.seconds, meter)
            rows[(system.name, rate)] = r
            print(
                f"{system.name:<16} {rate:>8}/s x {consumers:<4} {r['p50']:>8.1f} {r['p95']:>8.1f} "
                f"{r['p99']:>8.1f} {r['completion']:>6.1%} {r['publish']:>9.1f} ms {r['offered']:>6.0f}/s"
                f"  {r['cpu'].per_message(r['handled'])}",
                flush=True,
            )
    return rows


def report(rows: dict, peaks: dict, dead: dict) -> None:
    """Each target met or MISSED, and for a missed one where the time (or the dead tuples) went."""
    ours, theirs = rows[("redelivery", 400)], rows[("pgmq", 400)]
    slow = rows[("redelivery", 40)]
    (ours_peak, ours_cpu, ours_n), (their_peak, their_cpu, their_n) = peaks["redelivery"], peaks["pgmq"]
    by_table, held_by_table = dead["redelivery"]
    clean, held = sum(by_table.values()), sum(held_by_table.values())
    at_400 = why_slower(ours, theirs, 400)
    checks = [
        ("claim p50 at 400/s x 16 <= PGMQ's", ours["p50"], theirs["p50"], ours["p50"] <= theirs["p50"],
         at_400),
        ("claim p99 at 400/s x 16 <= PGMQ's", ours["p99"], theirs["p99"], ours["p99"] <= theirs["p99"],
         at_400),
        ("claim p50 at 40/s x 4 <= 10 ms (wait_seconds)", slow["p50"], 10.0, slow["p50"] <= 10,
         why_slower(slow, rows[("pgmq", 40)], 40)),
        ("peak >= 1.5x PGMQ's", ours_peak, 1.5 * their_peak, ours_peak >= 1.5 * their_peak,
         f"redelivery {ours_cpu.per_message(ours_n)}; PGMQ {their_cpu.per_message(their_n)}"),
        ("dead tuples, held horizon <= 1.2x clean", held, 1.2 * clean, held <= 1.2 * max(clean, 1),
         "by table, held horizon (clean): " + ", ".join(
             f"{table} {n:,} ({by_table.get(table, 0):,})"
             for table, n in sorted(held_by_table.items(), key=lambda kv: -kv[1]) if n)),
    ]  # fmt: skip
    print("\ntargets")
    for label, got, bound, ok, why in checks:
        ratio = got / bound if bound else float("nan")
        print(f"  {label:<48} {got:>10,.1f} vs {bound:>10,.1f} ({ratio:.2f}x): {'met' if ok else 'MISSED'}")
        if not ok:
            print(f"      where it goes: {why}")


def why_slower(ours: dict, theirs: dict, rate: int) -> str:
    """A latency phase's CPU a message, ours against PGMQ's, and what it asked of the cores."""
    mine, other = ours["cpu"], theirs["cpu"]
    demand = rate * ((mine.client + (mine.server or 0)) / max(ours["handled"], 1))
    return (
        f"redelivery {mine.per_message(ours['handled'])}; PGMQ {other.per_message(theirs['handled'])}; "
        f"at {rate}/s redelivery asks {demand:.2f} cores of CPU; its publisher reached "
        f"{ours['offered']:.0f}/s"
    )


if __name__ == "__main__":
    main()
