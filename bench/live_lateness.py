"""How late retries are under a real Airflow scheduler: the tier DAGs on their schedule.

    make live-bench                                     # 3 minutes of workload per mode
    .venv/bin/python bench/live_lateness.py --minutes 5 --modes spark-submit,connect,auto

For each mode a real Airflow (api-server, scheduler, dag-processor, LocalExecutor) starts on the
embedded PostgreSQL with the project's DAGs and a fresh metadata database, the tier DAGs are
unpaused, and for N minutes a workload runs: 100 messages published every 2 s, a consumer that
fails every first delivery (70 % nack: 10 s, 20 % reconsume_later 30 s, 10 % reconsume_later
60 s) and acks the retry. Then it waits for the retries of the workload to be promoted and prints,
per tier: retries measured, lateness (the time the retry became receivable, minus its due time)
p50 / p99 / max, run wall time (commit of the run, minus its window end) p50 / p99, runs per
minute, failed runs. Modes (the ``redelivery_spark`` connection, and the config's spark_threshold):
  spark-submit  every window runs on Spark, each run a spark-submit (a JVM per run)
  connect       every window runs on Spark, in the warm Spark Connect server
  auto          the default: windows under spark_threshold move in the task itself, larger ones
                on the warm server
Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TOPIC, GROUP = "live", "live"
TIER_DAGS = (
    "redelivery_tier_seconds",
    "redelivery_tier_minutes",
    "redelivery_tier_half_hours",
    "redelivery_tier_hours",
)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def fresh_database(name: str) -> str:
    import psycopg
    from psycopg import sql

    from redelivery.store import embedded
    from redelivery.store.db import migrate

    with psycopg.connect(embedded.url("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = embedded.url(name)
    migrate(url)
    return url


def workload(url: str, config, stop: threading.Event, rng: random.Random) -> dict:
    from redelivery.client import Client

    counts = {"published": 0, "failed_first": 0, "acked": 0}
    with Client(url, config=config) as client:
        tick = 0
        while not stop.is_set():
            started = time.monotonic()
            client.publish(TOPIC, [{"tick": tick, "n": i} for i in range(100)])
            counts["published"] += 100
            while batch := client.receive(GROUP, TOPIC, 500, 60):
                first = [m for m in batch if m.delivery_count == 1]
                client.ack(GROUP, [m for m in batch if m.delivery_count > 1])
                counts["acked"] += len(batch) - len(first)
                counts["failed_first"] += len(first)
                rng.shuffle(first)
                cut1, cut2 = int(len(first) * 0.7), int(len(first) * 0.9)
                client.nack(GROUP, first[:cut1], error="first delivery fails")
                client.reconsume_later(GROUP, first[cut1:cut2], delay=30, error="first delivery fails")
                client.reconsume_later(GROUP, first[cut2:], delay=60, error="first delivery fails")
            tick += 1
            stop.wait(max(0.0, 2.0 - (time.monotonic() - started)))
    return counts


def measure(url: str, config, started, ended) -> dict:
    """Per tier: lateness of the workload's retries (due in [started, ended]) and run figures."""
    from redelivery.store import db

    tier_of = {level: tier.name for tier in config.tiers for level in tier.levels}
    out = {}
    with db.connect(url) as conn:
        rows = conn.execute(
            """SELECT delay_level, extract(epoch FROM ready_at - due_at), state::text FROM deliveries
               WHERE due_at BETWEEN %s AND %s""",
            (started, ended),
        ).fetchall()
        runs = conn.execute(
            """SELECT tier, status, extract(epoch FROM finished_at - window_end) FROM tier_runs
               WHERE window_end BETWEEN %s AND %s""",
            (started, ended),
        ).fetchall()
    minutes = (ended - started).total_seconds() / 60
    for tier in config.tiers:
        late = [
            float(s)
            for level, s, state in rows
            if tier_of.get(level) == tier.name and state != "WAITING_RETRY"
        ]
        waiting = sum(
            1 for level, _, state in rows if tier_of.get(level) == tier.name and state == "WAITING_RETRY"
        )
        walls = [
            float(w) for t, status, w in runs if t == tier.name and status == "success" and w is not None
        ]
        out[tier.name] = {
            "window_seconds": tier.window_seconds,
            "retries_measured": len(late),
            "still_waiting": waiting,
            "lateness_p50": percentile(late, 0.5),
            "lateness_p99": percentile(late, 0.99),
            "lateness_max": max(late) if late else None,
            "run_wall_p50": percentile(walls, 0.5),
            "run_wall_p99": percentile(walls, 0.99),
            "runs_per_minute": round(sum(1 for t, s, _ in runs if t == tier.name) / minutes, 2),
            "failed_runs": sum(1 for t, s, _ in runs if t == tier.name and s == "failed"),
        }
    return out


def run_mode(mode: str, minutes: float, workdir: Path, seed: int) -> dict:
    from harness.local_airflow import LocalAirflow
    from redelivery.client import Client
    from redelivery.config import load_config
    from redelivery.spark import connect_server

    url = fresh_database("redelivery_live")
    config_file = workdir / f"config-{mode}.yaml"
    raw = yaml.safe_load((ROOT / "config" / "redelivery.yaml").read_text())
    if mode != "auto":
        raw["spark_threshold"] = 0  # every window on Spark
    config_file.write_text(yaml.safe_dump(raw))
    config = load_config(config_file)
    if mode == "spark-submit":
        spark_conn = {"conn_type": "spark", "host": "local[2]"}
    else:
        connect_server.ensure_running()  # the set-up starts the warm server; its start is not measured
        spark_conn = {
            "conn_type": "spark_connect",
            "host": "localhost",
            "port": 15002,
            "password": connect_server.token(),
        }
    env = {
        "REDELIVERY_DATABASE_URL": url,
        "REDELIVERY_CONFIG": str(config_file),
        "AIRFLOW_CONN_REDELIVERY_SPARK": json.dumps(spark_conn),
        "AIRFLOW__CORE__PARALLELISM": "8",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }
    with Client(url, config=config) as client:
        client.create_topic(TOPIC)
        client.create_group(GROUP)
        client.subscribe(GROUP, TOPIC)
    with LocalAirflow(workdir / f"airflow-{mode}", f"airflow_live_{mode.replace('-', '_')}", env) as airflow:
        for dag_id in TIER_DAGS:
            airflow.unpause(dag_id)
        time.sleep(15)  # the scheduler's first runs of the unpaused DAGs
        with Client(url) as client:
            started = client.conn.execute("SELECT now()").fetchone()[0]
        stop = threading.Event()
        result: dict = {}
        worker = threading.Thread(
            target=lambda: result.update(workload(url, config, stop, random.Random(seed)))
        )
        worker.start()
        time.sleep(minutes * 60)
        stop.set()
        worker.join()
        with Client(url) as client:
            ended = client.conn.execute("SELECT now()").fetchone()[0]
        time.sleep(90)  # the last retries due are promoted (the minutes tier runs every minute)
        figures = measure(url, config, started, ended)
    return {"mode": mode, "workload": result, "tiers": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="workload minutes per mode")
    parser.add_argument("--modes", default="spark-submit,connect,auto")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="live-lateness-") as tmp:
        for mode in args.modes.split(","):
            print(f"mode {mode}: {args.minutes} minutes of workload under a real Airflow ...", flush=True)
            results.append(run_mode(mode, args.minutes, Path(tmp), args.seed))
    header = (
        f"{'mode':<13} {'tier':<11} {'window':>6} {'retries':>8} {'late p50':>9} {'late p99':>9} "
        f"{'late max':>9} {'run p50':>8} {'run p99':>8} {'runs/min':>9} {'failed':>7}"
    )
    print("\n" + header)
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    for result in results:
        for tier, f in result["tiers"].items():
            if not f["retries_measured"] and not f["runs_per_minute"]:
                continue
            print(
                f"{result['mode']:<13} {tier:<11} {f['window_seconds']:>5}s {f['retries_measured']:>8} "
                f"{fmt(f['lateness_p50']):>9} {fmt(f['lateness_p99']):>9} {fmt(f['lateness_max']):>9} "
                f"{fmt(f['run_wall_p50']):>8} {fmt(f['run_wall_p99']):>8} {f['runs_per_minute']:>9} "
                f"{f['failed_runs']:>7}"
            )
    print("seconds; lateness = when the retry became receivable - its due time; run = commit - window end")
    print("LIVE_LATENESS " + json.dumps(results, default=str), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "plugins"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    main()
