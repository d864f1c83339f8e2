"""The outage story of issue 41 with a real HTTP receiver (the consumer DAG's delivery,
``airflow.http_delivery``): the receiver answers 503 for a few seconds, then recovers. With the
breaker, only the failures that open it and its probes spend attempts, the outage makes no dead
letter, and every message is delivered once the receiver is back; without it, the same run
dead-letters, and a standing redrive brings each dead letter back once the receiver is back."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers import configured
from redelivery.airflow.http_delivery import HttpEndpoint, drain
from redelivery.rules.standing import StandingRedrive
from redelivery.standing import tick
from redelivery.store import db
from redelivery.tiers.run import TierRunRequest, run_tier

MESSAGES, OUTAGE_SECONDS, BATCH = 40, 4.0, 5
#: Two retries, a second apart: without a breaker, a message is dead 3 s into the outage.
POLICY = {"max_reconsume_times": 2, "backoff": {"kind": "fixed", "interval": "1s"}}
BREAKER = {"min_attempts": 5, "failure_ratio": 0.5, "open_time": "1s", "max_open_time": "1m", "probe_size": 2}


class Receiver:
    """An HTTP endpoint that answers 503 until ``up_at`` (time.monotonic()), then acks each item;
    it records the ids it acked, and counts the deliveries it refused."""

    def __init__(self, down_for: float):
        self.up_at = time.monotonic() + down_for
        self.acked: list[int] = []
        self.refused = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if time.monotonic() < receiver.up_at:
                    receiver.refused += len(items)
                    self.send_response(503)
                    self.end_headers()
                    return
                receiver.acked += [item["id"] for item in items]
                body = json.dumps({"results": [{"id": i["id"], "status": 200} for i in items]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/"


def run_outage(client, database_url, config) -> Receiver:
    """Publish, then deliver and run the seconds tier in turn until every message is acked or
    dead, at most 40 s."""
    client.publish("orders", [{"n": i} for i in range(MESSAGES)])
    receiver = Receiver(OUTAGE_SECONDS)
    endpoint = HttpEndpoint(receiver.url, timeout=5)
    deadline, n = time.monotonic() + 40, 0
    while time.monotonic() < deadline:
        drain(client, "orders", "billing", endpoint, batch_size=BATCH, invisible_duration=30)
        with db.connect(database_url) as conn:
            now = conn.execute("SELECT now()").fetchone()[0]
        n += 1
        request = TierRunRequest(tier="seconds", window_end=now, run_key=f"outage-{n}")
        run_tier(request, url=database_url, config=config)
        states = client.stats()["orders"]["billing"]
        if states["COMMITTED"] + states["DLQ"] == MESSAGES:
            break
        time.sleep(0.2)
    receiver.server.shutdown()
    return receiver


@pytest.mark.timeout(120)
def test_with_the_breaker_the_outage_makes_no_dead_letter(client, topic_group, database_url):
    config = configured(client, {**POLICY, "breaker": BREAKER})
    receiver = run_outage(client, database_url, config)
    states = client.stats()["orders"]["billing"]
    assert states["DLQ"] == 0 and states["COMMITTED"] == MESSAGES
    assert sorted(set(receiver.acked)) == sorted(receiver.acked) and len(receiver.acked) == MESSAGES
    moves = [(t["from"], t["to"]) for t in reversed(client.breaker_history("billing"))]
    assert moves[0] == ("closed", "open") and moves[-1][1] == "closed"
    opened = sum(1 for _, to in moves if to == "open")
    # the outage cost the batch that opened it, and a probe each time it was half-open: nothing else
    # was handed out while the receiver was down
    assert receiver.refused <= BATCH + BREAKER["probe_size"] * opened
    assert client.conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 0


@pytest.mark.timeout(120)
def test_without_it_the_same_outage_dead_letters_and_a_standing_redrive_brings_each_back_once(
    client, topic_group, database_url
):
    config = configured(client, POLICY)
    receiver = run_outage(client, database_url, config)
    states = client.stats()["orders"]["billing"]
    dead = states["DLQ"]
    assert dead > 0 and states["COMMITTED"] + dead == MESSAGES
    assert receiver.refused > BATCH + BREAKER["probe_size"] * 4  # every message, again and again
    # the receiver is back: a standing redrive brings the outage's dead letters back, each once
    policy = StandingRedrive(name="outage", group="billing", after="every", every="1s", generation_wait="1s",
                             max_generations=1)  # fmt: skip
    config = config.model_copy(update={"standing_redrives": [policy]})
    again = Receiver(0)
    endpoint = HttpEndpoint(again.url, timeout=5)
    deadline = time.monotonic() + 30
    while client.stats()["orders"]["billing"]["COMMITTED"] < MESSAGES and time.monotonic() < deadline:
        tick(database_url, config, sync_config=True, log=lambda *_: None)
        drain(client, "orders", "billing", endpoint, batch_size=BATCH, invisible_duration=30)
        time.sleep(0.3)
    again.server.shutdown()
    assert client.stats()["orders"]["billing"]["COMMITTED"] == MESSAGES
    assert sorted(receiver.acked + again.acked) == sorted(set(receiver.acked + again.acked))  # once each
    assert len(again.acked) == dead and again.refused == 0
    moves = client.conn.execute(
        "SELECT count(*), count(DISTINCT m.message_id), max(m.generation) FROM redrive_moves m"
        " JOIN redrive_runs r ON r.id = m.run_id WHERE r.triggered_by = 'standing:outage'"
    ).fetchone()
    assert moves == (dead, dead, 1)
