"""The demo's two consumer groups' handlers (picklable, run inside Spark tasks)."""

from __future__ import annotations

import requests

from redelivery.messaging.codec import ReceivedMessage

REQUIRED_FIELDS = ("year", "month", "day", "carrier", "flight", "origin", "dest")
_sessions: dict[str, requests.Session] = {}


class HttpDelivery:
    """Delivers each flight to the HTTP receiver, ``chunk`` flights per request (keep-alive).
    429/503 or a network error: every flight of the request is retried; 422: that flight is."""

    def __init__(self, url: str, chunk: int = 100, timeout: float = 30.0):
        self.url, self.chunk, self.timeout = url, chunk, timeout

    def __call__(self, messages: list[ReceivedMessage]) -> list[tuple[str, str | None]]:
        session = _sessions.setdefault(self.url, requests.Session())
        outcomes: list[tuple[str, str | None]] = []
        for start in range(0, len(messages), self.chunk):
            part = messages[start : start + self.chunk]
            try:
                reply = session.post(
                    self.url,
                    json=[{"id": m.message_id, "flight": m.body} for m in part],
                    timeout=self.timeout,
                )
            except requests.RequestException as exc:
                outcomes += [("retry", f"receiver unreachable: {type(exc).__name__}")] * len(part)
                continue
            if reply.status_code != 200:
                outcomes += [("retry", f"HTTP {reply.status_code} {reply.reason}")] * len(part)
                continue
            by_id = {r["id"]: r for r in reply.json()["results"]}
            for m in part:
                result = by_id.get(m.message_id, {"status": 500, "error": "missing from the reply"})
                outcomes.append(
                    ("ack", None)
                    if result["status"] == 201
                    else ("retry", f"HTTP {result['status']}: {result.get('error')}")
                )
        return outcomes


def validate_flight(messages: list[ReceivedMessage]) -> list[tuple[str, str | None]]:
    """The statistics group: a flight missing a required field is rejected (dead-lettered at once)."""
    outcomes = []
    for m in messages:
        missing = [f for f in REQUIRED_FIELDS if not isinstance(m.body, dict) or m.body.get(f) is None]
        outcomes.append(("reject", f"missing fields {missing}") if missing else ("ack", None))
    return outcomes


#: The outcomes ``deliver_over_http`` gives ``spark.dataframes.settle``.
OUTCOME_SCHEMA = "message_id long, delivery_count int, outcome string, error string"


def deliver_over_http(url: str, chunk: int = 100):
    """``mapInArrow`` function for a leased DataFrame (``spark.dataframes.lease``): each Spark
    task posts its flights to the receiver, ``chunk`` per request, and yields one outcome per
    message (ack, or retry with the receiver's answer)."""

    def run(batches):
        import json

        import pyarrow as pa

        delivery = HttpDelivery(url, chunk=chunk)
        for batch in batches:
            rows = batch.select(["message_id", "delivery_count", "body"]).to_pylist()
            messages = [_Flight(r["message_id"], json.loads(r["body"])) for r in rows]
            outcomes = delivery(messages) if messages else []
            yield pa.RecordBatch.from_pylist(
                [
                    {
                        "message_id": r["message_id"],
                        "delivery_count": r["delivery_count"],
                        "outcome": o,
                        "error": e,
                    }
                    for r, (o, e) in zip(rows, outcomes, strict=True)
                ],
                schema=pa.schema(
                    [
                        ("message_id", pa.int64()),
                        ("delivery_count", pa.int32()),
                        ("outcome", pa.string()),
                        ("error", pa.string()),
                    ]
                ),
            )

    return run


class _Flight:
    """What ``HttpDelivery`` reads of a message: its id and decoded body."""

    __slots__ = ("message_id", "body")

    def __init__(self, message_id: int, body):
        self.message_id, self.body = message_id, body
