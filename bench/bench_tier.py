"""Benchmark: the tier job against one hand-written SQL statement (receive+ack: bench_receive.py).

    make bench                      # 100,000 and 1,000,000 due retries
    .venv/bin/python bench/bench_tier.py --sizes 100000 --rounds 1

For each size, N messages are made due at level 1 (WAITING_RETRY), then promoted to READY by
  sql      one UPDATE statement written by hand (the baseline),
  in-task  the tier job with its ranges in this process (a window under spark_threshold),
  warm     the tier job in an already started local Spark session: Spark's start excluded,
  connect  a fresh interpreter running the job on the warm Spark Connect server, as an Airflow
           task does: interpreter start, imports, session, job, commit included,
  submit   `spark-submit redelivery/jobs/tier_window.py`: JVM and Spark start included (with the
           class-data sharing archive that `make` set-up builds).
Every variant starts from the same freshly built, vacuumed table. Runs on a database of its own
(redelivery_bench).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from redelivery.jobs import application

ROOT = Path(__file__).resolve().parents[1]
WINDOW_END = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)


def database() -> str:
    from redelivery.store import embedded

    if os.environ.get("REDELIVERY_BENCH_DATABASE_URL"):
        return os.environ["REDELIVERY_BENCH_DATABASE_URL"]
    embedded.ensure_running(("redelivery", "airflow", "redelivery_bench"))
    return embedded.url("redelivery_bench")


def build(url: str, n: int, state: str = "WAITING_RETRY") -> None:
    """A fresh topic with one group and ``n`` messages: WAITING_RETRY (a delivery row each, due at
    level 1) or READY (past the group's consume offset: no delivery row, as published)."""
    from redelivery.store import db, maintenance
    from redelivery.store.log import ensure_partition

    with db.connect(url, autocommit=True) as conn:
        maintenance.empty_state_store(conn)
        ensure_partition(conn, WINDOW_END - timedelta(minutes=1), 3600)
        topic = conn.execute("INSERT INTO topics (name) VALUES ('bench') RETURNING id").fetchone()[0]
        group = conn.execute("INSERT INTO consumer_groups (name) VALUES ('bench') RETURNING id").fetchone()[0]
        conn.execute("INSERT INTO subscriptions VALUES (%s, %s)", (topic, group))
        conn.execute(
            """INSERT INTO messages (topic_id, body, content_type, published_at)
                        SELECT %s, convert_to(
                                   '{"n": ' || i || ', "payload": "' || repeat('x', 200) || '"}', 'UTF8'),
                               'application/json', %s
                        FROM generate_series(1, %s) i""",
            (topic, WINDOW_END - timedelta(minutes=1), n),
        )
        if state == "WAITING_RETRY":
            conn.execute(
                """INSERT INTO deliveries (message_id, group_id, topic_id, published_at, state,
                                          delivery_count, reconsume_times, delay_level, due_at, last_error,
                                          first_failure_at, last_failure_at)
                            SELECT id, %s, %s, published_at, 'WAITING_RETRY', 1, 1, 1, %s, 'boom', %s, %s
                            FROM messages""",
                (
                    group,
                    topic,
                    WINDOW_END - timedelta(seconds=5),
                    WINDOW_END - timedelta(seconds=15),
                    WINDOW_END - timedelta(seconds=15),
                ),
            )
            conn.execute("UPDATE subscriptions SET consume_offset = %s, messages_taken = %s", (n, n))
        conn.execute("VACUUM ANALYZE messages")
        conn.execute("VACUUM ANALYZE deliveries")
        conn.execute("CHECKPOINT")


def promoted(url: str) -> int:
    from redelivery.store import db

    with db.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM deliveries WHERE state = 'READY'").fetchone()[0]


def run_sql(url: str) -> float:
    from redelivery.store import db

    with db.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        conn.execute(
            """UPDATE deliveries SET state = 'READY', updated_at = now()
                        WHERE state = 'WAITING_RETRY' AND delay_level = ANY('{1,2}') AND due_at <= %s""",
            (WINDOW_END,),
        )
        return time.perf_counter() - start


def run_spark_warm(url: str, spark) -> float:
    from redelivery.tiers.run import TierRunRequest, run_tier

    start = time.perf_counter()
    run_tier(
        TierRunRequest(tier="seconds", window_end=WINDOW_END, run_key=f"bench-{time.time()}"),
        spark=spark,
        url=url,
        spark_threshold=0,
    )
    return time.perf_counter() - start


def run_spark_cold(url: str) -> float:
    """spark-submit of the tier job with the environment and conf the Airflow operator gives it."""
    from redelivery.spark.session import submit_environment

    env_vars, conf = submit_environment("local[2]", url)
    confs = [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]
    start = time.perf_counter()
    subprocess.run(
        [
            "spark-submit",
            "--master",
            "local[2]",
            *confs,
            application("tier_window"),
            "--request",
            request(f"bench-cold-{time.time()}"),
        ],
        check=True,
        env={**os.environ, **env_vars},
        capture_output=True,
    )
    return time.perf_counter() - start


def request(run_key: str) -> str:
    """The seconds tier's window ending at WINDOW_END, as the entry point takes it (JSON)."""
    from redelivery.tiers.run import TierRunRequest

    return TierRunRequest(tier="seconds", window_end=WINDOW_END, run_key=run_key).model_dump_json()


def run_in_task(url: str) -> float:
    """The tier job with its ranges in this process (what a window under spark_threshold costs)."""
    from redelivery.tiers.run import TierRunRequest, run_tier

    start = time.perf_counter()
    run_tier(TierRunRequest(tier="seconds", window_end=WINDOW_END, run_key=f"bench-{time.time()}"), url=url)
    return time.perf_counter() - start


def run_connect_task(url: str) -> float:
    """A fresh interpreter running redelivery/jobs/tier_window.py on the warm Spark Connect
    server, as an Airflow task does: interpreter start, imports, session, job and commit all included."""
    env = {**os.environ, "REDELIVERY_DATABASE_URL": url, "REDELIVERY_SPARK": "connect"}
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            application("tier_window"),
            "--request",
            request(f"bench-connect-{time.time()}"),
            "--spark-threshold",
            "0",
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    return time.perf_counter() - start


VARIANTS = {
    "sql": "one UPDATE",
    "in-task": "ranges in this process",
    "warm": "started local session",
    "connect": "fresh task, Connect",
    "submit": "spark-submit",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument(
        "--rounds", type=int, default=2, help="runs per variant and size; the median is reported"
    )
    args = parser.parse_args()
    from redelivery.spark import connect_server
    from redelivery.spark.session import get_spark
    from redelivery.store.db import migrate

    url = database()
    migrate(url)
    connect_server.ensure_running()  # the warm server is up, as the set-up leaves it
    spark = get_spark("redelivery-bench", master="local[2]")
    build(url, 10_000)
    run_spark_warm(url, spark)  # warm the session up once on real work (Python workers, JIT)
    run_connect_task(url)
    print("seconds to promote N due retries; ratio = variant / one UPDATE statement")
    print(f"{'due retries':>12} " + " ".join(f"{v:>22}" for v in VARIANTS.values()))
    for n in (int(s) for s in args.sizes.split(",")):
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name in VARIANTS:
                build(url, n)
                seconds = {
                    "sql": lambda: run_sql(url),
                    "in-task": lambda: run_in_task(url),
                    "warm": lambda: run_spark_warm(url, spark),
                    "connect": lambda: run_connect_task(url),
                    "submit": lambda: run_spark_cold(url),
                }[name]()
                assert promoted(url) == n, f"{name} promoted {promoted(url)} of {n}"
                times[name].append(seconds)
        medians = {name: statistics.median(values) for name, values in times.items()}
        cells = [f"{medians[name]:>8.2f} s ({medians[name] / medians['sql']:>5.2f}x)" for name in VARIANTS]
        print(f"{n:>12,} " + " ".join(f"{c:>22}" for c in cells), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
