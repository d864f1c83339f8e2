"""Issue 38 under a real Airflow (api-server, scheduler, dag-processor, LocalExecutor): a tier's
scheduled DAG run applies its span's windows in turn, each recorded once, the runs meeting without
a gap; and ``redelivery_maintenance`` deletes its own and the tiers' finished runs past
``retention.airflow_runs`` through Airflow's REST API, with their task logs, never another DAG's.

The config compresses time: the seconds tier has windows of 2 s and runs of 20 s, the Airflow
retention is 20 s."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from helpers import REPO_ROOT

pytestmark = pytest.mark.airflow

TIER = "redelivery_tier_seconds"
WINDOW, SPAN = 2, 20


@pytest.fixture(scope="module")
def airflow(database_url, tmp_path_factory):
    from harness.local_airflow import LocalAirflow

    raw = yaml.safe_load((REPO_ROOT / "config" / "redelivery.yaml").read_text())
    raw["tiers"][0].update(window=f"{WINDOW}s", run_span=f"{SPAN}s")
    raw["retention"]["airflow_runs"] = "20s"
    home = tmp_path_factory.mktemp("airflow-batches")
    config = home / "redelivery.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {
        "REDELIVERY_DATABASE_URL": database_url,
        "REDELIVERY_CONFIG": str(config),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
    }
    with LocalAirflow(home, "airflow_tier_batches", env) as running:
        yield running


def runs_of(airflow, dag_id: str) -> list[dict]:
    answer = airflow.session().get(
        f"{airflow.url}/api/v2/dags/{dag_id}/dagRuns",
        params={"order_by": "run_after", "limit": 100},
        timeout=30,
    )
    answer.raise_for_status()
    return answer.json()["dag_runs"]


def finished(
    airflow, dag_id: str, count: int, since: datetime | None = None, timeout: float = 240
) -> list[dict]:
    """Until ``dag_id`` has ``count`` finished runs (that started at or after ``since``); returns
    them, oldest first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [
            r
            for r in runs_of(airflow, dag_id)
            if r["state"] in ("success", "failed")
            and (since is None or datetime.fromisoformat(r["run_after"]) >= since)
        ]
        if len(done) >= count:
            return done
        time.sleep(1)
    raise AssertionError(
        f"{dag_id}: fewer than {count} finished runs in {timeout} s: {runs_of(airflow, dag_id)}"
    )


def test_a_scheduled_run_applies_its_windows_in_turn(airflow, client, topic_group):
    now = client.conn.execute("SELECT now()").fetchone()[0]
    client.publish("orders", [{"n": i} for i in range(6)], at=now)
    got = client.receive("billing", "orders", 6, 60, at=now)
    client.reconsume_later("billing", got, delay=10, error="x", at=now - timedelta(seconds=7))  # due in 3 s

    deadline = time.monotonic() + 120
    while client.stats()["orders"]["billing"]["READY"] < 6:  # the batch running now promotes them
        assert time.monotonic() < deadline, client.stats()
        time.sleep(0.5)
    first, second = finished(airflow, TIER, 2, since=now)[:2]  # runs whose records are all here
    for run in (first, second):
        assert run["state"] == "success" and run["run_type"] == "scheduled"
        base = f"{airflow.url}/api/v2/dags/{TIER}/dagRuns/{run['dag_run_id']}/taskInstances/apply_window"
        xcoms = airflow.session().get(f"{base}/xcomEntries", timeout=30).json()
        assert xcoms["total_entries"] == 0  # a batched run needs none
    run_after = [datetime.fromisoformat(r["run_after"]) for r in (first, second)]
    assert run_after[1] - run_after[0] == timedelta(seconds=SPAN)

    # each window once, on the clock's 2 s grid, the second run starting where the first ended
    keys = [f"{TIER}/{r['dag_run_id']}/1/" for r in (first, second)]
    records = client.conn.execute(
        "SELECT window_start, window_end, status FROM tier_runs "
        "WHERE run_key LIKE %s OR run_key LIKE %s ORDER BY window_end",
        (keys[0] + "%", keys[1] + "%"),
    ).fetchall()
    assert {status for *_, status in records} == {"success"}
    assert all(end.timestamp() % WINDOW == 0 for _, end, _ in records)
    for (_, end, _), (start, _, _) in zip(records, records[1:], strict=False):
        assert start == end  # contiguous: nothing covered twice, no gap
    last_end = (run_after[1].timestamp() + SPAN) // WINDOW * WINDOW
    assert records[0][0] <= run_after[0] < records[0][1] and records[-1][1].timestamp() == last_end
    # promoted, never before the end of the window each was due in
    rows = client.conn.execute(
        "SELECT ready_at >= due_at FROM deliveries WHERE state = 'READY' AND due_at IS NOT NULL"
    ).fetchall()
    assert rows == [(True,)] * 6

    # a task-log file per run: its windows summed into a few lines, and the batch's summary
    folder = Path(airflow.home) / "logs" / f"dag_id={TIER}"
    texts = [
        (folder / f"run_id={r['dag_run_id']}" / "task_id=apply_window" / "attempt=1.log").read_text()
        for r in (first, second)
    ]
    # (a task that started late, on a loaded machine, applies the windows it missed as one)
    assert all("windows of 2 s ending" in text and "tier seconds batch: " in text for text in texts)


def test_the_maintenance_deletes_its_own_finished_runs_and_their_logs_only(airflow):
    session = airflow.session()
    other = session.post(
        f"{airflow.url}/api/v2/dags/dlq_redrive/dagRuns",
        json={"logical_date": None, "conf": {"group": "nobody", "dry_run": True}},
        timeout=30,
    )
    assert other.status_code == 200, other.text
    finished(airflow, "dlq_redrive", 1)
    old = finished(airflow, TIER, 2)
    first_maintenance = finished(airflow, "redelivery_maintenance", 1)[-1]  # scheduled at the start
    time.sleep(21)  # the retention of this config
    ended_before = datetime.now(UTC) - timedelta(seconds=20)
    expired = [
        r
        for r in runs_of(airflow, TIER)
        if r["end_date"] and datetime.fromisoformat(r["end_date"]) < ended_before
    ]
    assert expired and {r["dag_run_id"] for r in old} >= {r["dag_run_id"] for r in expired[:1]}

    triggered = session.post(
        f"{airflow.url}/api/v2/dags/redelivery_maintenance/dagRuns", json={"logical_date": None}, timeout=30
    ).json()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        states = {r["dag_run_id"]: r["state"] for r in runs_of(airflow, "redelivery_maintenance")}
        if states.get(triggered["dag_run_id"]) in ("success", "failed"):
            break
        time.sleep(1)
    assert states[triggered["dag_run_id"]] == "success"

    left = {r["dag_run_id"] for r in runs_of(airflow, TIER)}
    assert not left & {r["dag_run_id"] for r in expired}
    logs = Path(airflow.home) / "logs"
    assert not [r for r in expired if (logs / f"dag_id={TIER}" / f"run_id={r['dag_run_id']}").exists()]
    assert len(runs_of(airflow, "dlq_redrive")) == 1  # another DAG's run: never touched
    assert list((logs / "dag_id=dlq_redrive").glob("run_id=*"))
    # a DAG's newest scheduled run stays, past the retention too: Airflow schedules the next from it
    # (deleted, the hourly maintenance was given a run at once)
    assert first_maintenance["run_type"] == "scheduled"
    assert datetime.fromisoformat(first_maintenance["end_date"]) < ended_before
    left = {r["dag_run_id"] for r in runs_of(airflow, "redelivery_maintenance")}
    assert first_maintenance["dag_run_id"] in left
    folder = logs / "dag_id=redelivery_maintenance" / f"run_id={first_maintenance['dag_run_id']}"
    assert folder.exists()


def test_an_api_it_cannot_use_names_the_connection_and_deletes_nothing(airflow):
    from redelivery.airflow.retention import ApiAccess, apply_airflow_retention
    from redelivery.config import load_config
    from redelivery.errors import ConfigError

    before = runs_of(airflow, "redelivery_maintenance")
    config = load_config(REPO_ROOT / "config" / "redelivery.yaml")
    logs, template = Path(airflow.home) / "logs", "dag_id={{ ti.dag_id }}/run_id={{ ti.run_id }}/x"
    for access in (
        ApiAccess(f"{airflow.url}/nowhere", None, "a wrong base URL"),
        ApiAccess("http://127.0.0.1:9", None, "a closed port"),
    ):
        with pytest.raises(ConfigError, match="define the connection 'redelivery_airflow_api'"):
            apply_airflow_retention(config, access, logs, template)
    assert runs_of(airflow, "redelivery_maintenance") == before


def test_pausing_the_tier_stops_its_running_batch_within_a_window(airflow, client):
    """A paused tier stopped at once when a DAG run was a window; a batch asks before each window."""

    def running_with_time_left():
        """The tier's run whose task runs now, with 8 s of its span left."""
        now = datetime.now(UTC)
        return [
            r
            for r in runs_of(airflow, TIER)
            if r["state"] == "running"
            and datetime.fromisoformat(r["run_after"]) + timedelta(seconds=SPAN - 8) > now
            and airflow.session()
            .get(
                f"{airflow.url}/api/v2/dags/{TIER}/dagRuns/{r['dag_run_id']}/taskInstances/apply_window",
                timeout=30,
            )
            .json()["state"]
            == "running"
        ]

    deadline = time.monotonic() + 120
    while not (running := running_with_time_left()):
        assert time.monotonic() < deadline, runs_of(airflow, TIER)
        time.sleep(0.2)
    session = airflow.session()
    session.patch(
        f"{airflow.url}/api/v2/dags/{TIER}", json={"is_paused": True}, timeout=30
    ).raise_for_status()
    paused_at = client.conn.execute("SELECT now()").fetchone()[0]
    try:
        # the task's own end (a paused DAG's run is marked finished by the scheduler only later)
        run, task = running[0], f"{airflow.url}/api/v2/dags/{TIER}/dagRuns/{running[0]['dag_run_id']}"
        while (ti := session.get(f"{task}/taskInstances/apply_window", timeout=30).json())[
            "state"
        ] == "running":
            assert time.monotonic() < deadline + 60, ti
            time.sleep(0.5)
        assert ti["state"] == "success"
        span_end = datetime.fromisoformat(run["run_after"]) + timedelta(seconds=SPAN)
        assert datetime.fromisoformat(ti["end_date"]) < span_end  # it stopped before its span ended
        log = (
            Path(airflow.home)
            / "logs"
            / f"dag_id={TIER}"
            / f"run_id={run['dag_run_id']}"
            / "task_id=apply_window"
        )
        assert "the DAG is paused: the batch stops" in (log / "attempt=1.log").read_text()
        later = client.conn.execute(
            "SELECT count(*) FROM tier_runs WHERE tier = 'seconds' AND started_at > %s",
            (paused_at + timedelta(seconds=WINDOW + 1),),
        ).fetchone()[0]
        assert later == 0
    finally:
        airflow.unpause(TIER)
