"""Messages as callers see them: what a producer publishes (``Message``), what a consumer receives
(``ReceivedMessage``), and how bodies and properties are stored (``encode``) and read back
(``decode``). Also the delivery states and the reserved retry property names."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .errors import MalformedMessageError

JSON = "application/json"
BINARY = "application/octet-stream"
TEXT = "text/plain"
CONTENT_TYPES = (JSON, BINARY, TEXT)
#: The states of a delivery (RocketMQ 5 PushConsumer, seeds/001).
STATES = ("READY", "INFLIGHT", "WAITING_RETRY", "COMMITTED", "DLQ")
#: Properties set on a redelivered message (Pulsar retry letter, seeds/000); publishers may not set them.
RETRY_PROPERTIES = ("REAL_TOPIC", "ORIGIN_MESSAGE_ID", "RETRY_TOPIC", "RECONSUMETIMES")


@dataclass(frozen=True)
class Message:
    """A message to publish. ``body``: ``bytes`` (stored as application/octet-stream), or any
    JSON-serialisable value (application/json); with ``content_type="application/json"`` a ``str``
    body is taken as JSON text and must parse; with ``"text/plain"`` a ``str`` is stored as text.
    ``properties``: string keys and string values."""

    body: Any
    key: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None


@dataclass(frozen=True)
class ReceivedMessage:
    """A message handed to a consumer of ``group``. ``body`` is decoded by content type (JSON
    value, ``bytes`` or ``str``). ``delivery_count`` counts this delivery; ``reconsume_times`` the
    retries scheduled before it. A retried message's ``properties`` carry REAL_TOPIC,
    ORIGIN_MESSAGE_ID, RETRY_TOPIC and RECONSUMETIMES (seeds/000). The receipt of this delivery is
    (``group``, ``message_id``, ``delivery_count``)."""

    message_id: int
    group: str
    topic: str
    key: str | None
    body: Any
    content_type: str
    properties: dict
    published_at: datetime
    delivery_count: int
    reconsume_times: int
    delay_level: int | None
    invisible_until: datetime
    origin_message_id: int
    last_error: str | None


def encode(message: Message | Any, index: int = 0) -> tuple[str | None, bytes, str, dict]:
    """``(key, body bytes, content type, properties)`` of a message to publish (a ``Message`` or a
    bare body). Raises ``MalformedMessageError`` naming the message ``index``."""
    if not isinstance(message, Message):
        message = Message(body=message)
    where = f"message {index}"
    body, ctype = message.body, message.content_type
    try:
        if ctype is None:
            ctype = BINARY if isinstance(body, (bytes, bytearray, memoryview)) else JSON
        if ctype == BINARY:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise MalformedMessageError(
                    f"{where}: an {BINARY} body must be bytes, got {type(body).__name__}"
                )
            raw = bytes(body)
        elif ctype == TEXT:
            if not isinstance(body, str):
                raise MalformedMessageError(f"{where}: a {TEXT} body must be str, got {type(body).__name__}")
            raw = body.encode()
        elif ctype == JSON:
            if isinstance(body, (bytes, str)):
                json.loads(body)  # JSON text: must parse
                raw = body.encode() if isinstance(body, str) else body
            else:
                raw = json.dumps(body, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode()
        else:
            raise MalformedMessageError(
                f"{where}: unknown content type {ctype!r}; use {JSON}, {BINARY} or {TEXT}"
            )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, MalformedMessageError):
            raise
        raise MalformedMessageError(f"{where}: body is not valid {ctype}: {exc}") from exc
    props = dict(message.properties or {})
    for name, value in props.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise MalformedMessageError(f"{where}: properties must map str to str, got {name!r}: {value!r}")
        if name in RETRY_PROPERTIES:
            raise MalformedMessageError(f"{where}: property {name!r} is reserved for redelivered messages")
    if message.key is not None and not isinstance(message.key, str):
        raise MalformedMessageError(f"{where}: key must be a str, got {type(message.key).__name__}")
    return message.key, raw, ctype, props


def decode(body: bytes, content_type: str) -> Any:
    """A stored body as its content type says: a JSON value, ``str`` or ``bytes``."""
    if content_type == JSON:
        return json.loads(body)
    if content_type == TEXT:
        return bytes(body).decode()
    return bytes(body)


def retry_properties(
    properties: dict, *, topic: str, origin_message_id: int, retry_topic: str, reconsume_times: int
) -> dict:
    """A message's properties as a consumer sees them: a redelivered one (reconsume times > 0)
    also carries REAL_TOPIC, ORIGIN_MESSAGE_ID, RETRY_TOPIC and RECONSUMETIMES (Pulsar, seeds/000)."""
    if reconsume_times <= 0:
        return properties
    return {
        **properties,
        "REAL_TOPIC": topic,
        "ORIGIN_MESSAGE_ID": str(origin_message_id),
        "RETRY_TOPIC": retry_topic,
        "RECONSUMETIMES": str(reconsume_times),
    }
