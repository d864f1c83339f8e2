"""What the tiers cost the user's Airflow, per day and per 90 days: a DAG run per window (the design
until issue 38) against a DAG run that applies an hour of windows in turn (the default now).

    make bench-airflow                                  # about 95 minutes
    .venv/bin/python bench/bench_airflow.py [--minutes 60] [--per-window-minutes 20] [--warmup 3]
                                            [--designs per-window,batched] [--history-days 7]

For each design a real Airflow (api-server, scheduler, dag-processor, LocalExecutor with 8 slots:
``harness.local_airflow``) starts on a fresh metadata database, task-log folder and state store,
with the project's DAGs and the checkout's config at Airflow's defaults (INFO task logs); only the
tiers' ``run_span`` differs: ``per-window`` sets it to each tier's window (a DAG run per window),
``batched`` keeps the default (an hour). The tier DAGs and ``redelivery_maintenance`` are unpaused
at creation, as in a user's Airflow.

Workload (as ``make live-bench``'s): 100 messages published every 2 s; a consumer fails every
first delivery (70 % nack: the 10 s level; 20 % reconsume_later 30 s; 10 % 60 s) and acks the
retry, reading the retry's lateness (its delivery row's ``ready_at`` minus ``due_at``: when it
became receivable, against when it was due) before the ack.

After ``--warmup`` minutes (the first runs started, the workload flowing) it measures for
``--minutes`` (batched: 60, a whole run span of every tier, so each DAG's next run falls inside
it) or ``--per-window-minutes`` (20): DAG runs and task instances of redelivery's DAGs, the bytes
their rows take in the metadata database (``pg_column_size`` of the rows of redelivery's DAGs in
``dag_run``, ``task_instance``, its history, ``xcom``, ``log``, rendered fields, with their share
of each table's indexes), the tables' growth besides (``pg_total_relation_size``: Airflow's own
bookkeeping, such as the scheduler's ``job`` heartbeats, and dead tuples until autovacuum), the
task-log bytes of redelivery's DAGs (Airflow's own logs, the dag-processor's, apart), and CPU
seconds of the scheduler's process and of every Airflow process (the tasks with them); each per day
(x 1440 / minutes) and per 90 days. Lateness per tier: p50, p99, max of the retries received in the
measured minutes (the 20 m to 2 h levels' retries fall outside a run of this length).

With ``--history-days`` (batched only): that many days of the tier DAGs' hourly runs are made
through the REST API (a run triggered, then marked success), and the calls that list a tier DAG's
runs (``/api/v2/dags/<id>/dagRuns``, the 100 latest) and draw its grid (``/ui/grid/structure``,
``/ui/grid/runs`` for the 365 latest, ``/ui/grid/ti_summaries`` of those) are timed (median of 5).

Prints both designs side by side with the ratio batched / per-window and the targets of issue 38
(runs, metadata bytes and task-log bytes per day at most 0.1x; the 10 s tier's lateness p99 at most
11 s; the list and the grid under 2 s), and one JSON line ``AIRFLOW_FOOTPRINT``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from airflow_footprint import ROOT, environ_defaults, fresh_store, growth, snapshot

TOPIC, GROUP = "live", "live"
DESIGNS = ("per-window", "batched")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


class Workload:
    """The publisher and failing-then-acking consumer, in a thread; ``lateness`` per tier of the
    retries received while ``measuring``."""

    def __init__(self, url: str, config, seed: int):
        self.url, self.config, self.rng = url, config, random.Random(seed)
        self.tier_of = {level: tier.name for tier in config.tiers for level in tier.levels}
        self.lateness: dict[str, list[float]] = {t.name: [] for t in config.tiers}
        self.measuring, self.stop = threading.Event(), threading.Event()
        self.published, self.errors = 0, []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # reported, and the figures say the workload stopped
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _loop(self) -> None:
        from redelivery.client import Client

        with Client(self.url, config=self.config) as client:
            tick = 0
            while not self.stop.is_set():
                started = time.monotonic()
                client.publish(TOPIC, [{"tick": tick, "n": i} for i in range(100)])
                self.published += 100
                while batch := client.receive(GROUP, TOPIC, 500, 60):
                    retries = [m for m in batch if m.delivery_count > 1]
                    if retries and self.measuring.is_set():
                        self._record(client, retries)
                    client.ack(GROUP, retries)
                    self._fail(client, [m for m in batch if m.delivery_count == 1])
                tick += 1
                self.stop.wait(max(0.0, 2.0 - (time.monotonic() - started)))

    def _record(self, client, retries) -> None:
        rows = client.conn.execute(
            "SELECT delay_level, extract(epoch FROM ready_at - due_at)::float8 FROM deliveries "
            "WHERE message_id = ANY(%s) AND due_at IS NOT NULL",
            ([m.message_id for m in retries],),
        ).fetchall()
        for level, seconds in rows:
            self.lateness[self.tier_of[level]].append(seconds)

    def _fail(self, client, first) -> None:
        self.rng.shuffle(first)
        cut1, cut2 = int(len(first) * 0.7), int(len(first) * 0.9)
        client.nack(GROUP, first[:cut1], error="first delivery fails")
        client.reconsume_later(GROUP, first[cut1:cut2], delay=30, error="first delivery fails")
        client.reconsume_later(GROUP, first[cut2:], delay=60, error="first delivery fails")


def design_config(design: str, workdir: Path) -> Path:
    raw = yaml.safe_load((ROOT / "config" / "redelivery.yaml").read_text())
    if design == "per-window":
        for tier in raw["tiers"]:
            tier["run_span"] = tier["window"]
    path = workdir / f"config-{design}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def run_design(design: str, minutes: float, warmup: float, workdir: Path, history_days: int) -> dict:
    from harness.local_airflow import LocalAirflow
    from redelivery.client import Client
    from redelivery.config import load_config

    url = fresh_store("redelivery_bench_airflow")
    config_path = design_config(design, workdir)
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
    name = design.replace("-", "_")
    with LocalAirflow(workdir / f"airflow-{design}", f"airflow_bench_{name}", env) as airflow:
        workload = Workload(url, config, seed=13)
        workload.thread.start()
        print(f"  {design}: Airflow up, warming up {warmup} min", flush=True)
        time.sleep(warmup * 60)
        before = snapshot(airflow)
        windows_before = tier_windows(url)
        workload.measuring.set()
        print(f"  {design}: measuring {minutes} min", flush=True)
        time.sleep(minutes * 60)
        workload.measuring.clear()
        after = snapshot(airflow)
        windows = {t: n - windows_before.get(t, 0) for t, n in tier_windows(url).items()}
        workload.stop.set()
        workload.thread.join(timeout=60)
        result = {
            "design": design,
            "minutes": minutes,
            "growth": growth(before, after),
            "windows": windows,
            "published": workload.published,
            "workload_errors": workload.errors,
            "lateness": {
                tier: {
                    "retries": len(v),
                    "p50": percentile(v, 0.5),
                    "p99": percentile(v, 0.99),
                    "max": max(v) if v else None,
                }
                for tier, v in workload.lateness.items()
            },
            "failed_runs": failed_runs(airflow),
        }
        # The figures before the history: a history that fails keeps them.
        print("AIRFLOW_DESIGN " + json.dumps(result, default=str), flush=True)
        if history_days and design == "batched":
            try:
                result["history"] = history(airflow, config, history_days)
            except Exception as exc:  # noqa: BLE001 - reported beside the figures, not lost with them
                result["history_error"] = f"{type(exc).__name__}: {exc}"
                print(f"  batched: history failed: {result['history_error']}", flush=True)
    return result


def tier_windows(url: str) -> dict[str, int]:
    """Windows applied so far per tier (records of ``tier_runs``)."""
    from redelivery.store import db

    with db.connect(url) as conn:
        return dict(conn.execute("SELECT tier, count(*) FROM tier_runs GROUP BY 1").fetchall())


def failed_runs(airflow) -> int:
    import psycopg
    from airflow_footprint import OWN, metadata_url

    with psycopg.connect(metadata_url(airflow)) as conn:
        return conn.execute(f"SELECT count(*) FROM dag_run WHERE state = 'failed' AND {OWN}").fetchone()[0]


def history(airflow, config, days: int) -> dict:
    """``days`` of hourly runs of every tier DAG made through the REST API, then the list and the
    grid of each timed (seconds, median of 5)."""
    session, base = airflow.session(), airflow.url
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    dag_ids = [f"redelivery_tier_{t.name}" for t in config.tiers]
    print(f"  batched: making {days} days of hourly runs of {len(dag_ids)} tier DAGs", flush=True)
    for dag_id in dag_ids:  # paused: the scheduler starts none of the runs made below (a run it
        # had started answered the PATCH to success with a 500)
        session.patch(f"{base}/api/v2/dags/{dag_id}", json={"is_paused": True}, timeout=60).raise_for_status()
    for dag_id in dag_ids:
        for hour in range(1, days * 24 + 1):
            at = (now - timedelta(hours=hour)).isoformat()
            made = session.post(
                f"{base}/api/v2/dags/{dag_id}/dagRuns",
                json={"dag_run_id": f"history__{at}", "logical_date": at, "conf": {"dry_run": True}},
                timeout=60,
            )
            made.raise_for_status()
            done = session.patch(
                f"{base}/api/v2/dags/{dag_id}/dagRuns/history__{at}", json={"state": "success"}, timeout=60
            )
            done.raise_for_status()
    timings = {}
    for dag_id in dag_ids:
        listed = timed(lambda d=dag_id: session.get(
            f"{base}/api/v2/dags/{d}/dagRuns", params={"limit": 100, "order_by": "-run_after"}, timeout=60
        ))  # fmt: skip
        timings[dag_id] = {
            "runs": listed[1].json()["total_entries"],
            "list": listed[0],
            "grid": grid_seconds(session, base, dag_id),
        }
    return timings


def grid_seconds(session, base: str, dag_id: str) -> float:
    """The grid view's three calls for the 365 latest runs, as the UI makes them (median of 5)."""

    def grid():
        session.get(f"{base}/ui/grid/structure/{dag_id}", timeout=60).raise_for_status()
        runs = session.get(
            f"{base}/ui/grid/runs/{dag_id}", params={"limit": 365, "order_by": "-run_after"}, timeout=60
        )
        runs.raise_for_status()
        ids = [r["run_id"] for r in runs.json()]
        summaries = session.get(f"{base}/ui/grid/ti_summaries/{dag_id}", params={"run_ids": ids}, timeout=60)
        summaries.raise_for_status()
        return summaries

    return timed(grid)[0]


def timed(call) -> tuple[float, object]:
    samples, answer = [], None
    for _ in range(5):
        started = time.perf_counter()
        answer = call()
        answer.raise_for_status()
        samples.append(time.perf_counter() - started)
    return round(statistics.median(samples), 3), answer


def per_day(result: dict) -> dict:
    g, scale = result["growth"], 1440 / result["minutes"]
    return {
        "dag_runs": g["runs"] * scale,
        "task_instances": g["task_instances"] * scale,
        "metadata_mb": g["metadata_bytes"] * scale / 1e6,
        "tables_grown_mb": g["tables_grown_bytes"] * scale / 1e6,
        "task_log_mb": g["own_log_bytes"] * scale / 1e6,
        "airflow_own_log_mb": g["airflow_log_bytes"] * scale / 1e6,
        "scheduler_cpu_s_per_hour": g["cpu"]["scheduler"] * 60 / result["minutes"],
        "airflow_cpu_s_per_hour": g["cpu"]["airflow"] * 60 / result["minutes"],
        "windows": sum(result["windows"].values()) * scale,
    }


def report(results: list[dict]) -> None:
    days = {r["design"]: per_day(r) for r in results}
    rows = [
        ("DAG runs / day", "dag_runs", "{:,.0f}"),
        ("task instances / day", "task_instances", "{:,.0f}"),
        ("metadata rows MB / day", "metadata_mb", "{:,.2f}"),
        ("  tables grown MB / day", "tables_grown_mb", "{:,.2f}"),
        ("task logs MB / day", "task_log_mb", "{:,.2f}"),
        ("Airflow's own logs MB / day", "airflow_own_log_mb", "{:,.2f}"),
        ("scheduler CPU s / hour", "scheduler_cpu_s_per_hour", "{:,.1f}"),
        ("all Airflow CPU s / hour", "airflow_cpu_s_per_hour", "{:,.1f}"),
        ("windows applied / day", "windows", "{:,.0f}"),
    ]
    names = [r["design"] for r in results]
    print(f"\n{'per day (x 90 for 90 days)':<30}" + "".join(f"{n:>16}" for n in names) + f"{'ratio':>10}")
    for label, key, fmt in rows:
        values = [days[n][key] for n in names]
        ratio = f"{values[-1] / values[0]:.3f}x" if len(values) == 2 and values[0] else ""
        print(f"{label:<30}" + "".join(f"{fmt.format(v):>16}" for v in values) + f"{ratio:>10}")
    for r in results:
        print(f"\n{r['design']}: measured {r['minutes']} min, failed runs {r['failed_runs']}, "
              f"workload errors {r['workload_errors'] or 'none'}; tables grown (bytes): "
              + ", ".join(f"{t} {b:,}" for t, b in list(r["growth"]["table_bytes"].items())[:8]))  # fmt: skip
        for tier, f in r["lateness"].items():
            if f["retries"]:
                print(f"  lateness {tier:<10} retries {f['retries']:>7,}  p50 {f['p50']:.1f} s  "
                      f"p99 {f['p99']:.1f} s  max {f['max']:.1f} s")  # fmt: skip
        for dag_id, h in (r.get("history") or {}).items():
            print(f"  {dag_id}: {h['runs']} runs; list {h['list']:.3f} s, grid {h['grid']:.3f} s")
        if r.get("history_error"):
            print(f"  history of runs not measured: {r['history_error']}")
    targets(results, days)
    print("AIRFLOW_FOOTPRINT " + json.dumps({"results": results, "per_day": days}, default=str), flush=True)


def targets(results: list[dict], days: dict) -> None:
    print("\ntargets (issue 38):")
    if set(days) == set(DESIGNS):
        old, new = days["per-window"], days["batched"]
        for key in ("dag_runs", "metadata_mb", "task_log_mb"):
            ratio = new[key] / old[key] if old[key] else float("inf")
            print(
                f"  {key} per day {ratio:.3f}x of per-window (<= 0.1x): {'MET' if ratio <= 0.1 else 'MISSED'}"
            )
        both = (new["metadata_mb"] + new["task_log_mb"]) / (old["metadata_mb"] + old["task_log_mb"])
        print(f"  metadata + task logs per day {both:.3f}x (<= 0.1x): {'MET' if both <= 0.1 else 'MISSED'}")
    for r in results:
        p99 = r["lateness"].get("seconds", {}).get("p99")
        if p99 is not None:
            verdict = "MET" if p99 <= 11 else "MISSED"
            print(f"  {r['design']}: 10 s tier lateness p99 {p99:.1f} s (<= 11 s): {verdict}")
        for dag_id, h in (r.get("history") or {}).items():
            ok = h["list"] < 2 and h["grid"] < 2
            print(f"  {dag_id} with {h['runs']} runs: list and grid under 2 s: {'MET' if ok else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="measured minutes, batched design")
    parser.add_argument("--per-window-minutes", type=float, default=20.0, help="measured minutes, per-window")
    parser.add_argument("--warmup", type=float, default=3.0, help="minutes before measuring")
    parser.add_argument("--designs", default=",".join(DESIGNS))
    parser.add_argument("--history-days", type=int, default=7)
    args = parser.parse_args()
    environ_defaults()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-airflow-") as tmp:
        for design in args.designs.split(","):
            minutes = args.per_window_minutes if design == "per-window" else args.minutes
            print(f"design {design}: {minutes} minutes measured under a real Airflow ...", flush=True)
            results.append(run_design(design, minutes, args.warmup, Path(tmp), args.history_days))
    report(results)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "plugins"))
    main()
