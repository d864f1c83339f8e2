"""The demo's outage (issue 41), in real time: a payments service answers 503 for ``OUTAGE_SECONDS``,
then recovers. The same payments go to two groups, delivered by the consumer DAG's HTTP delivery
(``airflow.http_delivery.drain``) with two retries a second apart:

- ``payments-breaker`` has a circuit breaker: it opens on the first failures, parks them, probes,
  and closes once the service is back; the outage makes no dead letter;
- ``payments-standing`` has none: its payments die during the outage, and a standing redrive
  (``payments-after-outage``, every 2 s, one generation) brings each back once the service is back.

Both must end with every payment delivered once. ``write_outage_chart`` draws both runs.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PAYMENTS_TOPIC = "payments"
BREAKER_GROUP, STANDING_GROUP = "payments-breaker", "payments-standing"
PAYMENTS, OUTAGE_SECONDS, BATCH = 200, 6.0, 20
#: The most the outage phase may take, in seconds (it ends when both groups committed everything).
DEADLINE_SECONDS = 90


class PaymentsService:
    """``POST`` a JSON array of ``{"id": ...}``: 503 until ``up_at`` (time.monotonic()), then 200
    with a result per item. Counts what it refused and what it took (``taken``: id -> times)."""

    def __init__(self, down_for: float):
        self.up_at = time.monotonic() + down_for
        self.taken: dict[int, int] = {}
        self.refused = 0
        self._lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with service._lock:
                    if time.monotonic() < service.up_at:
                        service.refused += len(items)
                        self.send_response(503)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    for item in items:
                        service.taken[item["id"]] = service.taken.get(item["id"], 0) + 1
                body = json.dumps({"results": [{"id": i["id"], "status": 200} for i in items]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/payments"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def outage_config(config):
    """The demo's config with the payments groups' policies: two retries a second apart; a breaker
    for ``payments-breaker``; the standing redrive of ``payments-standing``."""
    from redelivery.config import RedeliveryConfig

    retries = {
        "topic": PAYMENTS_TOPIC,
        "max_reconsume_times": 2,
        "backoff": {"kind": "fixed", "interval": "1s"},
    }
    breaker = {
        "min_attempts": 10,
        "failure_ratio": 0.5,
        "open_time": "2s",
        "max_open_time": "1m",
        "probe_size": 3,
    }
    # a dead letter comes back once, after the outage: its first generation waits longer than it
    standing = {"name": "payments-after-outage", "group": STANDING_GROUP, "after": "every", "every": "2s",
                "generation_wait": f"{int(OUTAGE_SECONDS) + 2}s", "max_generations": 1}  # fmt: skip
    raw = config.model_dump(exclude_unset=True)
    raw["policies"] = [
        *raw.get("policies", []),
        retries,
        {**retries, "group": BREAKER_GROUP, "breaker": breaker},
    ]
    raw["standing_redrives"] = [*raw.get("standing_redrives", []), standing]
    return RedeliveryConfig.model_validate(raw)


def run_outage(client_factory, config, bodies: list) -> dict:
    """Publish ``bodies`` to the payments topic for both groups, then, in real time, deliver them,
    apply the seconds tier's window and tick the standing redrives in turn until both groups
    committed everything (at most ``DEADLINE_SECONDS``). Returns ``{"timeline": [(seconds, {group:
    {state: n}})], "service": PaymentsService, "transitions": the breaker's, "brought_back": n}``."""
    from redelivery.airflow.http_delivery import HttpEndpoint, drain
    from redelivery.standing import tick
    from redelivery.tiers.run import TierRunRequest, run_tier

    config = outage_config(config)
    with client_factory(config) as client:
        if client.conn.execute("SELECT 1 FROM topics WHERE name = %s", (PAYMENTS_TOPIC,)).fetchone():
            client.delete_topic(PAYMENTS_TOPIC)  # a fresh demo every time
        client.create_topic(PAYMENTS_TOPIC)
        for group in (BREAKER_GROUP, STANDING_GROUP):
            client.create_group(group)
            client.subscribe(group, PAYMENTS_TOPIC)
        client.publish(PAYMENTS_TOPIC, bodies)
        service = PaymentsService(OUTAGE_SECONDS)
        endpoint = HttpEndpoint(service.url, timeout=10)
        started, timeline, n = time.monotonic(), [], 0
        try:
            while time.monotonic() - started < DEADLINE_SECONDS:
                for group in (BREAKER_GROUP, STANDING_GROUP):
                    drain(client, PAYMENTS_TOPIC, group, endpoint, batch_size=BATCH, invisible_duration=30)
                now, n = client.conn.execute("SELECT now()").fetchone()[0], n + 1
                run_tier(
                    TierRunRequest(tier="seconds", window_end=now, run_key=f"demo-outage-{n}"), config=config
                )
                tick(config=config, sync_config=True, log=lambda *_: None)
                stats = client.stats()[PAYMENTS_TOPIC]
                timeline.append((time.monotonic() - started, stats))
                if all(stats[g]["COMMITTED"] == len(bodies) for g in (BREAKER_GROUP, STANDING_GROUP)):
                    break
                time.sleep(0.25)
        finally:
            service.stop()
        brought_back = client.conn.execute(  # of this topic: a demo run before left its own
            "SELECT count(*) FROM redrive_moves m JOIN redrive_runs r ON r.id = m.run_id"
            " WHERE r.triggered_by = 'standing:payments-after-outage' AND m.topic_id = %s",
            (client.admin.context.topic_id(PAYMENTS_TOPIC),),
        ).fetchone()[0]
        transitions = client.breaker_history(BREAKER_GROUP, limit=100)
    return {
        "timeline": timeline,
        "service": service,
        "transitions": transitions,
        "brought_back": brought_back,
    }


def check(result: dict, total: int) -> list[str]:
    """With the breaker: no dead letter ever, all committed; without: dead letters during the
    outage, then all committed, each dead letter brought back once; each payment taken once by the
    service, per group. Returns failures."""
    failures, timeline = [], result["timeline"]
    final = timeline[-1][1]
    for group in (BREAKER_GROUP, STANDING_GROUP):
        if final[group]["COMMITTED"] != total:
            failures.append(f"{group}: {final[group]['COMMITTED']} of {total} payments committed")
    if any(stats[BREAKER_GROUP]["DLQ"] for _, stats in timeline):
        failures.append(f"{BREAKER_GROUP}: the outage made dead letters despite its breaker")
    peak = max(stats[STANDING_GROUP]["DLQ"] for _, stats in timeline)
    if not peak:
        failures.append(f"{STANDING_GROUP}: the outage made no dead letter: nothing for the standing redrive")
    elif result["brought_back"] != peak:
        failures.append(
            f"{STANDING_GROUP}: the standing redrive brought back {result['brought_back']}, not {peak}"
        )
    twice = {i: n for i, n in result["service"].taken.items() if n > 2}  # one per group at most
    if twice:
        failures.append(f"the service took {len(twice)} payments more than once per group")
    return failures


def summary(result: dict) -> dict:
    """The outage's figures for the demo's summary.json."""
    timeline = result["timeline"]
    return {
        "final": timeline[-1][1],
        "seconds": timeline[-1][0],
        "refused": result["service"].refused,
        "dead_letters_peak": max(s[STANDING_GROUP]["DLQ"] for _, s in timeline),
        "brought_back": result["brought_back"],
        "breaker_transitions": len(result["transitions"]),
    }


def report(result: dict) -> str:
    timeline, service = result["timeline"], result["service"]
    peak = max(stats[STANDING_GROUP]["DLQ"] for _, stats in timeline)
    opened = sum(1 for t in result["transitions"] if t["to"] in ("open", "held"))
    return (
        f"outage: the payments service refused {service.refused:,} deliveries for {OUTAGE_SECONDS:.0f} s; "
        f"{BREAKER_GROUP}: breaker opened {opened}x, 0 dead letters; {STANDING_GROUP}: {peak} dead "
        f"letters, {result['brought_back']} brought back by its standing redrive, each once; both done in "
        f"{timeline[-1][0]:.0f} s"
    )


def write_outage_chart(path: Path, result: dict) -> Path:
    """Two panels over real time, one per group: committed, dead letters and the rest (waiting,
    ready, in flight), the outage shaded; the breaker's openings marked on the first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = result["timeline"]
    x = [t for t, _ in timeline]
    fig, axes = plt.subplots(2, 1, sharex=True, figsize=(13, 6), layout="constrained")
    titles = {
        BREAKER_GROUP: "with a circuit breaker: failures parked, nothing dead-lettered",
        STANDING_GROUP: "without one: dead letters, brought back by a standing redrive once the service "
        "is up",
    }
    for axis, group in zip(axes, (BREAKER_GROUP, STANDING_GROUP), strict=True):
        committed = [s[group]["COMMITTED"] for _, s in timeline]
        dead = [s[group]["DLQ"] for _, s in timeline]
        live = [s[group]["READY"] + s[group]["INFLIGHT"] + s[group]["WAITING_RETRY"] for _, s in timeline]
        axis.axvspan(
            0, OUTAGE_SECONDS, color="#fed7d7", alpha=0.6, label=f"service down ({OUTAGE_SECONDS:.0f} s)"
        )
        axis.step(x, committed, where="post", color="#2f855a", label=f"COMMITTED ({committed[-1]:,} at end)")
        axis.step(x, live, where="post", color="#2b6cb0", label="waiting, ready or in flight")
        axis.step(x, dead, where="post", color="#c53030", label=f"DLQ (peak {max(dead):,})")
        axis.set_title(f"group {group}: {titles[group]}", loc="left", fontsize=11)
        axis.set_ylabel("payments")
        axis.grid(color="#e2e8f0", linewidth=0.6)
        axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8.5, frameon=False)
    axes[-1].set_xlabel("seconds since publish (real time)")
    fig.suptitle(
        "redelivery demo: an outage of the payments service, two ways", fontsize=13, fontweight="bold"
    )
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
