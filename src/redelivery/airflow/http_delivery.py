"""Deliver a consumer group's messages to an HTTP endpoint in batches, and answer each receipt by
the endpoint's answer (the consumer DAG's task, ``airflow.dags.consumer``).

The endpoint takes ``POST`` of a JSON array ``[{"id": message id, "<body_field>": body}]`` (the
demo's receiver, ``demo.receiver``: ``body_field`` is ``"flight"``) and answers ``200`` with
``{"results": [{"id", "status", "error"}]}``, one result per item. The answers:

- an item with a 2xx status: **ack** (COMMITTED);
- an item with a 4xx status other than 408 and 429 (the demo's 422 for a cancelled flight): the
  message itself is bad, **reject** (dead-lettered at once, reason REJECTED, the answer as error);
- any other item status, an item missing from the results: **retry** (``nack``: the policy's
  next wait);
- a whole request that failed (network error, timeout, any status but 200, a reply that is not
  the results): every message of the batch is **retried**; after a 429 or 503 with a
  ``Retry-After`` of whole seconds, after that many seconds (``reconsume_later``, 1 to 864000).

The demo's own Spark consumer (``demo.handlers.HttpDelivery``) retries a 422 until the retries are
used up (its check expects 16 reconsume times); a consumer that is not a test of the retries
rejects it at once, as here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import requests

from redelivery.client import Client, Outcome
from redelivery.messaging.codec import ReceivedMessage
from redelivery.rules.levels import MAX_DELAY_SECONDS, MIN_DELAY_SECONDS

#: Item statuses that are not the message's fault (a retry may succeed).
TRANSIENT_ITEM_STATUSES = frozenset({408, 429})
#: Whole-request statuses whose Retry-After is taken as the retry's delay.
RETRY_AFTER_STATUSES = frozenset({429, 503})
DEFAULT_TIMEOUT_SECONDS = 30.0


@dataclass
class HttpEndpoint:
    """Posts a batch to ``url`` (``timeout`` in seconds per request) and returns one ``Outcome``
    per message, in order (see the module's documentation). Never raises for what the endpoint
    answers or for network errors: those are outcomes."""

    url: str
    body_field: str = "body"
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    session: requests.Session | None = None

    def __call__(self, messages: list[ReceivedMessage]) -> list[Outcome]:
        session = self.session or requests.Session()
        self.session = session
        posted, refused = [], []
        for m in messages:
            (refused if isinstance(m.body, bytes) else posted).append(m)
        outcomes = {
            id(m): Outcome(m, "reject", "binary body: the endpoint takes JSON bodies") for m in refused
        }
        if posted:
            for m, outcome in zip(posted, self._post(session, posted), strict=True):
                outcomes[id(m)] = outcome
        return [outcomes[id(m)] for m in messages]

    def _post(self, session: requests.Session, messages: list[ReceivedMessage]) -> list[Outcome]:
        items = [{"id": m.message_id, self.body_field: m.body} for m in messages]
        try:
            reply = session.post(self.url, json=items, timeout=self.timeout)
        except requests.RequestException as exc:
            return [Outcome(m, "retry", f"endpoint unreachable: {type(exc).__name__}") for m in messages]
        if reply.status_code != 200:
            error = f"HTTP {reply.status_code} {reply.reason}"
            delay = retry_after(reply) if reply.status_code in RETRY_AFTER_STATUSES else None
            return [Outcome(m, "retry", error, delay=delay) for m in messages]
        try:
            by_id = {r["id"]: r for r in reply.json()["results"]}
        except (ValueError, KeyError, TypeError):
            return [Outcome(m, "retry", "HTTP 200 without a list of results") for m in messages]
        return [item_outcome(m, by_id.get(m.message_id)) for m in messages]


def item_outcome(message: ReceivedMessage, result: dict | None) -> Outcome:
    """The answer to one message from its item of the reply (None: missing from the reply)."""
    if not isinstance(result, dict) or not isinstance(result.get("status"), int):
        return Outcome(message, "retry", "missing from the endpoint's reply")
    status = result["status"]
    if 200 <= status < 300:
        return Outcome(message, "ack")
    error = f"HTTP {status}: {result.get('error')}"
    if 400 <= status < 500 and status not in TRANSIENT_ITEM_STATUSES:
        return Outcome(message, "reject", error)
    return Outcome(message, "retry", error)


def retry_after(reply: requests.Response) -> int | None:
    """``Retry-After`` in whole seconds within the delay range (1 to 864000), else None (an HTTP
    date, or nothing: the policy's next wait)."""
    value = reply.headers.get("Retry-After", "").strip()
    if not value.isdigit():
        return None
    return min(max(int(value), MIN_DELAY_SECONDS), MAX_DELAY_SECONDS)


def drain(
    client: Client,
    topic: str,
    group: str,
    deliver: Callable[[list[ReceivedMessage]], list[Outcome]],
    *,
    batch_size: int = 100,
    max_messages: int | None = None,
    invisible_duration: float = 60,
    wait_seconds: float = 0,
) -> dict:
    """Receive batches of ``batch_size`` messages of ``topic`` for ``group`` (lease
    ``invisible_duration`` seconds), hand each to ``deliver`` and settle its outcomes in one
    transaction, until nothing is READY (after waiting up to ``wait_seconds``, 0..20, for a message
    to become so: ``Client.receive``) or ``max_messages`` were received (None: no limit).

    Returns ``{"batches", "received", "acked", "retried", "dead_lettered", "stale"}`` (stale: a
    lease that ended before the answer; the tier run retries those). Raises what
    ``Client.receive`` raises on bad input (``UnknownGroupError``, ``NotSubscribedError``,
    ``ValueError``...) before receiving anything."""
    if max_messages is not None and (
        isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1
    ):
        raise ValueError(f"max_messages must be a positive integer or None, got {max_messages!r}")
    counts = dict.fromkeys(("batches", "received", "acked", "retried", "dead_lettered", "stale"), 0)
    while max_messages is None or counts["received"] < max_messages:
        size = batch_size if max_messages is None else min(batch_size, max_messages - counts["received"])
        batch = client.receive(group, topic, size, invisible_duration, wait_seconds=wait_seconds)
        if not batch:
            break
        settled = client.settle(group, deliver(batch))
        counts["batches"] += 1
        counts["received"] += len(batch)
        for key in ("acked", "retried", "dead_lettered", "stale"):
            counts[key] += settled[key]
    return counts
