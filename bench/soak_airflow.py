"""Does what the tiers leave in Airflow stay the same size? The Airflow side of the soak, in
compressed time (issue 38).

    make soak-airflow                        # 20 minutes
    .venv/bin/python bench/soak_airflow.py [--minutes 20] [--warmup 6] [--retention 2m]

A real Airflow (api-server, scheduler, dag-processor, LocalExecutor: ``harness.local_airflow``)
runs the project's DAGs with time compressed: the seconds tier's windows are 2 s in runs of 20 s,
the other tiers' 10 s or 30 s in runs of 60 s (about 250 DAG runs an hour, where the defaults make
120 a day), ``retention.airflow_runs`` is ``--retention`` (2 minutes), and
``redelivery_maintenance`` is triggered every 30 s through the REST API (it runs hourly
otherwise). A workload keeps the windows busy: 20 messages published every 2 s, each failing its
first delivery with a retry at the 10 s level.

Every 30 s it samples, for redelivery's DAGs: DAG runs, task instances, XComs and task-instance
history rows in Airflow's metadata database, the bytes of those tables (``pg_total_relation_size``,
dead tuples included until autovacuum), and the task-log bytes under ``logs/dag_id=...``; and
Airflow's audit log (table ``log``), which only ``airflow db clean`` deletes.

Verdict (issue 38, as the store's soak): after ``--warmup`` minutes (the retention, a run span and
a maintenance period past), the largest later sample of each figure is within 1.25x of its value at
the warm-up's end. The audit log is reported, not judged: it grows by about 3 rows a DAG run until
the deployment's ``airflow db clean --tables log``. Prints one JSON line ``AIRFLOW_SOAK``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import yaml
from airflow_footprint import OWN, ROOT, environ_defaults, fresh_store, metadata_url

TOPIC, GROUP = "soak", "soak"
SPANS = {
    "seconds": ("2s", "20s"),
    "minutes": ("10s", "60s"),
    "half_hours": ("30s", "60s"),
    "hours": ("30s", "60s"),
}
JUDGED = ("dag_runs", "task_instances", "xcoms", "ti_history", "table_bytes", "task_log_bytes")


def soak_config(workdir: Path, retention: str) -> Path:
    raw = yaml.safe_load((ROOT / "config" / "redelivery.yaml").read_text())
    for tier in raw["tiers"]:
        tier["window"], tier["run_span"] = SPANS[tier["name"]]
    raw["retention"]["airflow_runs"] = retention
    path = workdir / "config-soak.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def sample(airflow) -> dict:
    with psycopg.connect(metadata_url(airflow)) as conn:

        def count(table: str) -> int:
            return conn.execute(f"SELECT count(*) FROM {table} WHERE {OWN}").fetchone()[0]

        table_bytes = conn.execute(
            "SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest(%s::text[]) t",
            (["dag_run", "task_instance", "xcom", "task_instance_history"],),
        ).fetchone()[0]
        figures = {
            "dag_runs": count("dag_run"),
            "task_instances": count("task_instance"),
            "xcoms": count("xcom"),
            "ti_history": count("task_instance_history"),
            "table_bytes": int(table_bytes),
            "audit_log_rows": count("log"),
        }
    logs = Path(airflow.home) / "logs"
    figures["task_log_bytes"] = sum(
        p.stat().st_size
        for folder in logs.glob("dag_id=*")
        if folder.name.startswith(("dag_id=redelivery_tier_", "dag_id=redelivery_maintenance"))
        for p in folder.rglob("*")
        if p.is_file()
    )
    return figures


def workload(url: str, config, stop: threading.Event) -> None:
    from redelivery.client import Client

    with Client(url, config=config) as client:
        while not stop.is_set():
            client.publish(TOPIC, [{"n": i} for i in range(20)])
            while batch := client.receive(GROUP, TOPIC, 200, 60):
                client.ack(GROUP, [m for m in batch if m.delivery_count > 1])
                client.nack(GROUP, [m for m in batch if m.delivery_count == 1], error="first delivery fails")
            stop.wait(2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=6.0, help="minutes before the reference sample")
    parser.add_argument("--retention", default="2m", help="retention.airflow_runs")
    args = parser.parse_args()
    environ_defaults()
    from harness.local_airflow import LocalAirflow
    from redelivery.client import Client
    from redelivery.config import load_config

    url = fresh_store("redelivery_soak_airflow")
    with tempfile.TemporaryDirectory(prefix="soak-airflow-") as tmp:
        config_path = soak_config(Path(tmp), args.retention)
        config = load_config(config_path)
        with Client(url, config=config) as client:
            client.create_topic(TOPIC)
            client.create_group(GROUP)
            client.subscribe(GROUP, TOPIC)
        env = {
            "REDELIVERY_DATABASE_URL": url,
            "REDELIVERY_CONFIG": str(config_path),
            "AIRFLOW__CORE__PARALLELISM": "8",
        }
        with LocalAirflow(Path(tmp) / "airflow", "airflow_soak", env) as airflow:
            stop = threading.Event()
            worker = threading.Thread(target=workload, args=(url, config, stop), daemon=True)
            worker.start()
            samples = run(airflow, args.minutes)
            stop.set()
            worker.join(timeout=30)
    verdict(samples, args.warmup)


def run(airflow, minutes: float) -> list[tuple[float, dict]]:
    session, started, samples = airflow.session(), time.monotonic(), []
    next_maintenance = 0.0
    while (elapsed := time.monotonic() - started) < minutes * 60:
        if elapsed >= next_maintenance:
            made = session.post(
                f"{airflow.url}/api/v2/dags/redelivery_maintenance/dagRuns",
                json={"logical_date": None},
                timeout=30,
            )
            made.raise_for_status()
            next_maintenance += 30
        figures = sample(airflow)
        samples.append((elapsed / 60, figures))
        print(
            f"  {elapsed / 60:5.1f} min  " + "  ".join(f"{k} {v:,}" for k, v in figures.items()), flush=True
        )
        time.sleep(30)
    return samples


def verdict(samples: list[tuple[float, dict]], warmup: float) -> None:
    reference = next(((m, f) for m, f in samples if m >= warmup), None)
    if reference is None:
        print(f"no sample after the {warmup}-minute warm-up: run longer")
        return
    later = [f for m, f in samples if m > reference[0]]
    result = {}
    print(f"\nafter {reference[0]:.1f} min (reference) against the largest later sample:")
    for key in (*JUDGED, "audit_log_rows"):
        top = max([f[key] for f in later] or [reference[1][key]])
        # none then and none since is flat (no XCom at all); none then and some since grows
        ratio = top / reference[1][key] if reference[1][key] else (1.0 if top == 0 else float("inf"))
        judged = key in JUDGED
        ok = ratio <= 1.25
        result[key] = {"reference": reference[1][key], "largest_later": top, "ratio": round(ratio, 3)}
        mark = ("FLAT" if ok else "GROWS") if judged else "reported (airflow db clean's)"
        print(f"  {key:<16} {reference[1][key]:>12,} -> {top:>12,}  {ratio:.2f}x  {mark}")
    flat = all(result[k]["ratio"] <= 1.25 for k in JUDGED)
    print(f"verdict: the Airflow side {'stays flat (<= 1.25x)' if flat else 'GROWS'} after warm-up")
    print("AIRFLOW_SOAK " + json.dumps({"samples": samples, "result": result, "flat": flat}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "plugins"))
    main()
