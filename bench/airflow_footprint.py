"""What redelivery's DAGs leave in an Airflow, read from the outside: its metadata database, its
task-log folder and its processes' CPU (bench_airflow.py and soak_airflow.py).

Each Airflow measured here runs only the project's DAGs on a metadata database of its own
(``harness.local_airflow``), so the growth of a table is what they and Airflow's own bookkeeping
cost; the rows of redelivery's own DAGs (the tiers, ``redelivery_maintenance``) are counted apart.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The DAGs whose runs are the tiers' footprint: the tiers and the maintenance.
OWN = "(dag_id LIKE 'redelivery\\_tier\\_%' OR dag_id = 'redelivery_maintenance')"
#: The tables that hold a row per DAG run or task run of a DAG (with a ``dag_id`` column).
RUN_TABLES = (
    "dag_run",
    "task_instance",
    "task_instance_history",
    "xcom",
    "log",
    "rendered_task_instance_fields",
)


@dataclass
class Snapshot:
    """One reading: ``at`` (``time.monotonic()``), ``table_bytes`` (every table of the metadata
    database: ``pg_total_relation_size``, rows, indexes, TOAST and dead tuples), ``own_rows`` (rows
    of redelivery's DAGs per table of ``RUN_TABLES``, and asset events they emitted), ``own_bytes``
    (those rows' bytes, ``pg_column_size``, and their share of the table's indexes), ``runs``
    (DAG runs per DAG), ``log_bytes`` (per folder at the top of the logs: ``dag_id=...``,
    ``dag_processor``, ...), ``cpu`` (seconds: ``scheduler``, the scheduler's own process; ``airflow``,
    every Airflow process with the task processes they ran)."""

    at: float
    table_bytes: dict[str, int] = field(default_factory=dict)
    own_rows: dict[str, int] = field(default_factory=dict)
    own_bytes: dict[str, int] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)
    log_bytes: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def own_log_bytes(self) -> int:
        return sum(n for name, n in self.log_bytes.items() if _own_folder(name))

    @property
    def own_runs(self) -> int:
        return sum(
            n
            for dag, n in self.runs.items()
            if dag.startswith("redelivery_tier_") or dag == "redelivery_maintenance"
        )


def _own_folder(name: str) -> bool:
    return name.startswith("dag_id=redelivery_tier_") or name == "dag_id=redelivery_maintenance"


def metadata_url(airflow) -> str:
    """The libpq URL of a ``LocalAirflow``'s metadata database."""
    return airflow.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace(
        "postgresql+psycopg://", "postgresql://"
    )


def snapshot(airflow) -> Snapshot:
    """A reading of ``airflow`` (a running ``harness.local_airflow.LocalAirflow``)."""
    taken = Snapshot(at=time.monotonic())
    with psycopg.connect(metadata_url(airflow)) as conn:
        taken.table_bytes = dict(
            conn.execute(
                "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
            ).fetchall()
        )
        for table in RUN_TABLES:
            rows, row_bytes, index_share = conn.execute(
                f"""SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0),
                           count(*) * pg_indexes_size('{table}'::regclass)
                           / greatest((SELECT count(*) FROM {table}), 1)
                    FROM {table} t WHERE {OWN}"""
            ).fetchone()
            taken.own_rows[table], taken.own_bytes[table] = rows, int(row_bytes + index_share)
        taken.own_rows["asset_event"] = conn.execute(
            f"SELECT count(*) FROM asset_event WHERE {OWN.replace('dag_id', 'source_dag_id')}"
        ).fetchone()[0]
        taken.runs = dict(conn.execute("SELECT dag_id, count(*) FROM dag_run GROUP BY 1").fetchall())
    logs = Path(airflow.home) / "logs"
    for top in logs.iterdir() if logs.exists() else []:
        taken.log_bytes[top.name] = sum(p.stat().st_size for p in top.rglob("*") if p.is_file())
    taken.cpu = cpu_seconds(airflow)
    return taken


def cpu_seconds(airflow) -> dict[str, float]:
    """CPU seconds (user + system) of ``airflow``'s processes so far: ``scheduler`` (its own
    process, the scheduling loop), ``airflow`` (every component and all its descendants, those that
    exited included: a process's reaped children count in its ``children_*`` times)."""
    total, scheduler = 0.0, 0.0
    for proc, command in zip(airflow.procs, airflow.components, strict=False):
        try:
            root = psutil.Process(proc.pid)
            times = root.cpu_times()
            if command[0] == "scheduler":
                scheduler = times.user + times.system
            total += times.user + times.system + times.children_user + times.children_system
            for child in root.children(recursive=True):
                try:
                    t = child.cpu_times()
                    total += t.user + t.system + t.children_user + t.children_system
                except psutil.NoSuchProcess:
                    continue
        except psutil.NoSuchProcess:
            continue
    return {"scheduler": round(scheduler, 2), "airflow": round(total, 2)}


def growth(before: Snapshot, after: Snapshot) -> dict:
    """What ``after`` holds more than ``before``: seconds between them, tables that grew (bytes:
    Airflow's own bookkeeping and dead tuples with the rest), redelivery's rows and their bytes
    (``metadata_bytes``: what its DAGs' runs leave), runs, task instances, task-log bytes
    (redelivery's and Airflow's own) and CPU seconds."""
    tables = {
        name: after.table_bytes.get(name, 0) - before.table_bytes.get(name, 0)
        for name in after.table_bytes
        if after.table_bytes.get(name, 0) != before.table_bytes.get(name, 0)
    }
    return {
        "seconds": round(after.at - before.at, 1),
        "table_bytes": dict(sorted(tables.items(), key=lambda kv: -kv[1])),
        "tables_grown_bytes": sum(tables.values()),
        "own_rows": {t: after.own_rows.get(t, 0) - before.own_rows.get(t, 0) for t in after.own_rows},
        "own_bytes": {t: after.own_bytes.get(t, 0) - before.own_bytes.get(t, 0) for t in after.own_bytes},
        "metadata_bytes": sum(after.own_bytes.values()) - sum(before.own_bytes.values()),
        "runs": after.own_runs - before.own_runs,
        "task_instances": after.own_rows["task_instance"] - before.own_rows["task_instance"],
        "own_log_bytes": after.own_log_bytes - before.own_log_bytes,
        "airflow_log_bytes": sum(after.log_bytes.values())
        - sum(before.log_bytes.values())
        - (after.own_log_bytes - before.own_log_bytes),
        "cpu": {k: round(after.cpu[k] - before.cpu.get(k, 0.0), 2) for k in after.cpu},
    }


def fresh_store(name: str) -> str:
    """An empty, migrated state store ``name`` on the embedded server; returns its URL."""
    from psycopg import sql

    from redelivery.store import embedded
    from redelivery.store.db import migrate

    embedded.ensure_running(("redelivery", "airflow"))
    with psycopg.connect(embedded.url("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = embedded.url(name)
    migrate(url)
    return url


def environ_defaults() -> None:
    """The checkout's settings, as the Makefile sets them, when the caller did not."""
    os.environ.setdefault("REDELIVERY_HOME", str(ROOT / ".redelivery"))
    os.environ.setdefault("REDELIVERY_CONFIG", str(ROOT / "config" / "redelivery.yaml"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
