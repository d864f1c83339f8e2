"""The outage story of issue 41 with a real HTTP receiver (the consumer DAG's delivery,
``airflow.http_delivery``): the receiver answers 503 for a few seconds, then recovers. With the
breaker, only the failures that open it and its probes spend attempts, the outage makes no dead
letter, and every message is delivered once the receiver is back; without it, the same run
dead-letters, and a standing redrive brings each dead letter back once the receiver is back."""

import time

import pytest

from demo.outage import PaymentsService as Receiver  # the demo's: 503 for a while, then 200
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
    receiver.stop()
    return receiver


@pytest.mark.timeout(120)
def test_with_the_breaker_the_outage_makes_no_dead_letter(client, topic_group, database_url):
    config = configured(client, {**POLICY, "breaker": BREAKER})
    receiver = run_outage(client, database_url, config)
    states = client.stats()["orders"]["billing"]
    assert states["DLQ"] == 0 and states["COMMITTED"] == MESSAGES
    assert set(receiver.taken.values()) == {1} and len(receiver.taken) == MESSAGES  # each once
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
    again.stop()
    assert client.stats()["orders"]["billing"]["COMMITTED"] == MESSAGES
    assert not set(receiver.taken) & set(again.taken)  # each once
    assert set(again.taken.values()) == {1} and len(again.taken) == dead and again.refused == 0
    moves = client.conn.execute(
        "SELECT count(*), count(DISTINCT m.message_id), max(m.generation) FROM redrive_moves m"
        " JOIN redrive_runs r ON r.id = m.run_id WHERE r.triggered_by = 'standing:outage'"
    ).fetchone()
    assert moves == (dead, dead, 1)
