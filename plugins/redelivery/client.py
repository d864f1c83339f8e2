"""The Python client: topics, groups, publish, receive, ack, nack / reconsume_later, reject, stats.

Semantics (RocketMQ 5 PushConsumer state machine, seeds/001):

- ``publish`` stores each message once and gives every group subscribed to its topic its own
  delivery row in READY.
- ``receive`` claims READY rows (``FOR UPDATE SKIP LOCKED``), sets them INFLIGHT with a lease of
  ``invisible_duration`` seconds and increments the delivery count; the transaction commits before
  any message is returned (Artemis ``persist-delivery-count-before-delivery``, seeds/004), so a
  crash can never under-count a delivery.
- ``ack`` commits; ``nack`` / ``reconsume_later`` schedule a retry (WAITING_RETRY, reconsume times
  + 1) or, once the group's max reconsume times are used up, dead-letter the message; ``reject``
  dead-letters it at once. A consumer that goes silent past its lease is handled by the tier job.

Every call is one transaction and raises before changing anything on bad input. Times passed as
``at`` (timezone-aware ``datetime``) replace the database clock; ``None`` uses ``now()``.
A ``Client`` holds one connection: use one client per thread.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import db
from .config import RedeliveryConfig, cached_config
from .errors import (
    InvalidLevelError,
    InvalidNameError,
    MalformedMessageError,
    NotSubscribedError,
    TooManyRequestsError,
    UnknownGroupError,
    UnknownTopicError,
)
from .levels import check_delay
from .policies import EffectivePolicy
from .producer import MIN_CONNECT_TIMEOUT, retrying
from .transitions import (
    BACKLOG_LOCK,
    CAN_RETRY,
    DLQ_INSERT,
    NEXT_DELAY,
    NEXT_LEVEL,
    POLICIES_CTE,
    POLICY_JOIN,
    RETURNING_MOVED,
    attempt,
    effective_policies,
    ensure_dlq_tables,
    policy_table,
)

JSON = "application/json"
BINARY = "application/octet-stream"
TEXT = "text/plain"
STATES = ("READY", "INFLIGHT", "WAITING_RETRY", "COMMITTED", "DLQ")
NAME_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,58}$")
#: Properties set on a redelivered message (Pulsar retry letter, seeds/000); publishers may not set them.
RETRY_PROPERTIES = ("REAL_TOPIC", "ORIGIN_MESSAGE_ID", "RETRY_TOPIC", "RECONSUMETIMES")
#: Lease bounds in seconds (RocketMQ SimpleConsumer invisible duration: 10 s .. 12 h).
MIN_INVISIBLE_SECONDS, MAX_INVISIBLE_SECONDS = 1, 43_200
PUBLISH_CHUNK = 5_000
_AT = "coalesce(%(at)s::timestamptz, now())"
# Acks and nacks find their rows through the primary key. Written as a text comparison so that the
# planner cannot use the partial index of leases instead: that index keeps an entry for every row
# that was ever in flight until VACUUM, and scanning it whole made each ack slower than the last.
_IS_INFLIGHT = "d.state::text = 'INFLIGHT'"


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
    ORIGIN_MESSAGE_ID, RETRY_TOPIC and RECONSUMETIMES (seeds/000)."""

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


def encode(message: Message | Any, index: int = 0) -> tuple[str | None, bytes, str, str]:
    """``(key, body bytes, content type, properties JSON)``; raises ``MalformedMessageError``."""
    if not isinstance(message, Message):
        message = Message(body=message)
    where = f"message {index}"
    body, ctype = message.body, message.content_type
    try:
        if ctype is None:
            ctype = BINARY if isinstance(body, (bytes, bytearray, memoryview)) else JSON
        if ctype == BINARY:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise MalformedMessageError(f"{where}: an {BINARY} body must be bytes, got {type(body).__name__}")
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
            raise MalformedMessageError(f"{where}: unknown content type {ctype!r}; use {JSON}, {BINARY} or {TEXT}")
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
    return message.key, raw, ctype, json.dumps(props)


def fan_out_sql(source: str) -> str:
    """One statement that inserts the messages of ``source`` (a FROM item with columns key, body,
    content_type, properties (JSON text) and seq) into topic ``%(topic_id)s`` in seq order, gives
    every subscribed group a READY delivery, and returns the new ids in order. JSON bodies are
    parsed by PostgreSQL on the way in, so a malformed one fails the whole statement."""
    return f"""
        WITH new AS (
          INSERT INTO messages (topic_id, key, body, content_type, properties, publish_batch, published_at)
          SELECT %(topic_id)s, u.key, u.body, u.content_type, u.properties::jsonb, %(batch)s, {_AT}
          FROM {source}
          WHERE u.content_type <> 'application/json' OR convert_from(u.body, 'UTF8')::jsonb IS NOT NULL
          ORDER BY u.seq
          RETURNING id, published_at),
        fan AS (
          INSERT INTO deliveries (message_id, group_id, topic_id, created_at, updated_at)
          SELECT new.id, s.group_id, %(topic_id)s, new.published_at, new.published_at
          FROM new JOIN subscriptions s ON s.topic_id = %(topic_id)s)
        SELECT id FROM new ORDER BY id"""


def decode(body: bytes, content_type: str) -> Any:
    if content_type == JSON:
        return json.loads(body)
    if content_type == TEXT:
        return bytes(body).decode()
    return bytes(body)


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not NAME_RULE.match(name):
        raise InvalidNameError(
            f"{kind} name {name!r} is invalid: use 1 to 59 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return name


def _receipts(messages: ReceivedMessage | Iterable[ReceivedMessage]) -> list[ReceivedMessage]:
    items = [messages] if isinstance(messages, ReceivedMessage) else list(messages)
    for item in items:
        if not isinstance(item, ReceivedMessage):
            raise TypeError(f"expected ReceivedMessage objects (from receive), got {type(item).__name__}")
    return items


def _errors(error: str | Sequence[str] | None, count: int) -> list[str | None]:
    if error is None or isinstance(error, str):
        return [error] * count
    errors = list(error)
    if len(errors) != count:
        raise ValueError(f"got {len(errors)} errors for {count} messages")
    return errors


class Client:
    """A connection to the state store. ``url``: libpq URL (default: ``database_url()``)."""

    def __init__(self, url: str | None = None, config: RedeliveryConfig | None = None):
        self.url = url or db.database_url()
        self.config = config or cached_config()
        self.levels = self.config.level_table
        self.conn = db.connect(self.url, autocommit=True)
        self._groups: dict[str, tuple[int, int | None]] = {}
        self._topics: dict[str, int] = {}
        self._policies: dict[tuple[int, int], tuple[EffectivePolicy, dict]] = {}
        self._caps: dict[int, dict] = {}  # topic id -> {(topic id, group id): max ready backlog}
        self._sleep = time.sleep  # the producer retry's sleep (tests replace it)
        self.publish_waits: list[float] = []  # the waits of the last publish's retries, seconds

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- topology -----------------------------------------------------------------------------

    def create_topic(self, name: str) -> int:
        """Create topic ``name`` if it does not exist; return its id. ``InvalidNameError`` on a bad name."""
        _check_name("topic", name)
        row = self.conn.execute(
            """INSERT INTO topics (name) VALUES (%s) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
               RETURNING id""", (name,)).fetchone()
        return row[0]

    def create_group(self, name: str, max_reconsume_times: int | None = None) -> int:
        """Create consumer group ``name`` if it does not exist; return its id.

        ``max_reconsume_times``: the group's own limit (RocketMQ group metadata), which wins over
        the policies; -1 = unlimited; ``None`` = the matching policy decides (RocketMQ default 16).
        On an existing group it replaces the limit. Raises ``InvalidNameError``, ``ValueError``."""
        _check_name("group", name)
        limit = max_reconsume_times
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < -1):
            raise ValueError(f"max_reconsume_times must be an integer >= -1 or None, got {limit!r}")
        row = self.conn.execute(
            """INSERT INTO consumer_groups (name, max_reconsume_times) VALUES (%s, %s)
               ON CONFLICT (name) DO UPDATE SET max_reconsume_times = EXCLUDED.max_reconsume_times RETURNING id""",
            (name, limit)).fetchone()
        self._groups.pop(name, None)
        self._policies.clear()
        self._caps.clear()
        return row[0]

    def policy(self, topic: str, group: str) -> EffectivePolicy:
        """The effective retry and dead-letter policy of ``group`` on ``topic``. Raises
        ``UnknownGroupError``, ``UnknownTopicError``, ``NotSubscribedError``."""
        return self._policy(self._topic(topic), self._group(group)[0], topic, group)[0]

    def _policy(self, topic_id: int, group_id: int, topic: str, group: str) -> tuple[EffectivePolicy, dict]:
        """(policy, SQL parameters of the policy table) of one subscription, cached."""
        key = (topic_id, group_id)
        if key not in self._policies:
            found = effective_policies(self.conn, self.config, [key])
            if key not in found:
                raise NotSubscribedError(f"group {group!r} is not subscribed to topic {topic!r}")
            self._policies[key] = (found[key], policy_table(self.conn, self.config, found))
        return self._policies[key]

    def subscribe(self, group: str, topic: str) -> None:
        """Subscribe ``group`` to ``topic`` (idempotent). Messages published from now on are
        delivered to the group. Raises ``UnknownGroupError`` / ``UnknownTopicError``."""
        group_id, _ = self._group(group)
        topic_id = self._topic(topic)
        self.conn.execute(
            "INSERT INTO subscriptions (topic_id, group_id) VALUES (%s, %s) ON CONFLICT DO NOTHING", (topic_id, group_id))
        self._policies.pop((topic_id, group_id), None)
        self._caps.pop(topic_id, None)

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` with its messages, deliveries, subscriptions and dead letters, in one
        transaction. Raises ``UnknownTopicError``."""
        topic_id = self._topic(name)
        with self.conn.transaction():
            self.conn.execute("DELETE FROM dlq_messages WHERE topic_id = %s", (topic_id,))
            self.conn.execute("DELETE FROM topics WHERE id = %s", (topic_id,))
        self._topics.pop(name, None)

    def _topic(self, name: str) -> int:
        if name not in self._topics:
            row = self.conn.execute("SELECT id FROM topics WHERE name = %s", (name,)).fetchone()
            if row is None:
                raise UnknownTopicError(f"unknown topic {name!r}")
            self._topics[name] = row[0]
        return self._topics[name]

    def _group(self, name: str) -> tuple[int, int | None]:
        """(id, own max_reconsume_times) of group ``name``; ``UnknownGroupError`` if there is none."""
        if name not in self._groups:
            row = self.conn.execute(
                "SELECT id, max_reconsume_times FROM consumer_groups WHERE name = %s", (name,)).fetchone()
            if row is None:
                raise UnknownGroupError(f"unknown consumer group {name!r}")
            self._groups[name] = (row[0], row[1])
        return self._groups[name]

    # ---- producer -----------------------------------------------------------------------------

    def publish(self, topic: str, messages: Iterable[Message | Any], *, batch_id: str | None = None,
                at: datetime | None = None, retry: bool = True) -> list[int]:
        """Publish ``messages`` to ``topic`` in one transaction; return their ids in order.

        Each item is a ``Message`` or a bare body. A batch id publishes once: publishing the same
        ``batch_id`` again returns the first publish's ids and adds nothing. With ``retry`` (the
        default), transient failures (lost connection, deadlock, flow control) are retried with the
        producer backoff of the config file (seeds/002) under a batch id made up for the call if
        none is given, so a retry after a commit whose answer was lost publishes nothing twice.

        Raises ``UnknownTopicError`` or ``MalformedMessageError`` (naming the message index) before
        anything is written; ``TooManyRequestsError`` (530) when a subscribed group's ready backlog
        would pass its policy's ``max_ready_backlog``, after the retries; the last transient
        ``psycopg.OperationalError`` when the attempts are used up."""
        topic_id = self._topic(topic)
        rows = [encode(m, i) for i, m in enumerate(messages)]
        if not retry:
            return self._publish_once(topic_id, topic, rows, batch_id, at)
        batch_id = batch_id or f"auto-{uuid.uuid4()}"
        self.publish_waits = []
        for attempt_ in retrying(self.config.producer, before_retry=self._before_publish_retry, sleep=self._sleep):
            with attempt_:
                return self._publish_once(topic_id, topic, rows, batch_id, at)

    def _before_publish_retry(self, retry_state) -> None:
        self.publish_waits.append(retry_state.upcoming_sleep)
        if self.conn.closed or self.conn.broken:
            self.conn = db.connect(self.url, autocommit=True, connect_timeout=MIN_CONNECT_TIMEOUT)

    def _publish_once(self, topic_id: int, topic: str, rows: list, batch_id: str | None, at) -> list[int]:
        with self.conn.transaction():
            if batch_id is not None:
                fresh = self.conn.execute(
                    """INSERT INTO publish_batches (batch_id, topic_id, message_count) VALUES (%s, %s, %s)
                       ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id""",
                    (batch_id, topic_id, len(rows))).fetchone()
                if fresh is None:
                    return [r[0] for r in self.conn.execute(
                        "SELECT id FROM messages WHERE publish_batch = %s ORDER BY id", (batch_id,))]
            self._check_backlog(topic_id, topic, len(rows))
            ids: list[int] = []
            for start in range(0, len(rows), PUBLISH_CHUNK):
                chunk = rows[start:start + PUBLISH_CHUNK]
                keys, bodies, ctypes, props = (list(col) for col in zip(*chunk))
                ids.extend(r[0] for r in self.conn.execute(
                    fan_out_sql("""unnest(%(keys)s::text[], %(bodies)s::bytea[], %(ctypes)s::text[], %(props)s::text[])
                                   WITH ORDINALITY AS u(key, body, content_type, properties, seq)"""),
                    {"topic_id": topic_id, "batch": batch_id, "at": at, "keys": keys, "bodies": bodies,
                     "ctypes": ctypes, "props": props}))
        return ids

    def _check_backlog(self, topic_id: int, topic: str, adding: int) -> None:
        """Flow control inside the publishing transaction: raise ``TooManyRequestsError`` if a
        subscribed group's READY backlog would pass its cap. Serialised per topic with other
        publishers and with tier runs by an advisory lock."""
        if topic_id not in self._caps:  # resolved once per topic, like the other policy lookups
            pairs = [(topic_id, g) for (g,) in self.conn.execute(
                "SELECT group_id FROM subscriptions WHERE topic_id = %s", (topic_id,))]
            self._caps[topic_id] = {k: p.max_ready_backlog for k, p in
                                    effective_policies(self.conn, self.config, pairs).items()
                                    if p.max_ready_backlog is not None}
        capped = self._caps[topic_id]
        if not capped:
            return
        self.conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (BACKLOG_LOCK, topic_id))
        for (_, group_id), cap in capped.items():
            ready = self.conn.execute("SELECT count(*) FROM deliveries WHERE group_id = %s AND topic_id = %s AND state = 'READY'",
                                      (group_id, topic_id)).fetchone()[0]
            if ready + adding > cap:
                raise TooManyRequestsError(
                    f"530 TOO_MANY_REQUESTS: topic {topic!r} has {ready} ready messages for group id {group_id}; "
                    f"{adding} more would pass its max_ready_backlog of {cap}")

    # ---- consumer -----------------------------------------------------------------------------

    def receive(self, group: str, topic: str, max_messages: int = 32, invisible_duration: int = 60,
                at: datetime | None = None) -> list[ReceivedMessage]:
        """Claim up to ``max_messages`` READY messages of ``topic`` for ``group``, oldest first.

        ``invisible_duration``: the lease in seconds (1..43200); unacknowledged past it, a message
        counts as a failed delivery. The incremented delivery count is committed before this
        returns. Raises ``UnknownGroupError``, ``UnknownTopicError``, ``NotSubscribedError``,
        ``ValueError`` (max_messages < 1 or a lease out of range)."""
        group_id, _ = self._group(group)
        topic_id = self._topic(topic)
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise ValueError(f"max_messages must be a positive integer, got {max_messages!r}")
        if not (isinstance(invisible_duration, (int, float)) and MIN_INVISIBLE_SECONDS <= invisible_duration <= MAX_INVISIBLE_SECONDS):
            raise ValueError(f"invisible_duration must be {MIN_INVISIBLE_SECONDS}..{MAX_INVISIBLE_SECONDS} seconds, got {invisible_duration!r}")
        retry_topic = self._policy(topic_id, group_id, topic, group)[0].retry_name  # NotSubscribedError
        # The claimed ids go to the UPDATE as an array: a primary-key lookup. Joined as a table, they
        # were matched by scanning every delivery of the group, slower as the table grew.
        with self.conn.transaction():
            rows = self.conn.execute(
                f"""WITH claimed AS (
                      SELECT message_id FROM deliveries
                      WHERE group_id = %(g)s AND topic_id = %(t)s AND state = 'READY'
                      ORDER BY message_id LIMIT %(n)s FOR UPDATE SKIP LOCKED),
                    leased AS (
                      UPDATE deliveries d SET state = 'INFLIGHT', delivery_count = d.delivery_count + 1,
                          invisible_until = {_AT} + make_interval(secs => %(lease)s), updated_at = now()
                      WHERE d.message_id = ANY(ARRAY(SELECT message_id FROM claimed)) AND d.group_id = %(g)s
                      RETURNING d.message_id, d.delivery_count, d.reconsume_times, d.delay_level,
                                d.invisible_until, d.last_error)
                    SELECT l.message_id, m.key, m.body, m.content_type, m.properties::text, m.published_at,
                           l.delivery_count, l.reconsume_times, l.delay_level, l.invisible_until,
                           coalesce(m.origin_message_id, m.id), l.last_error
                    FROM leased l JOIN messages m ON m.id = l.message_id ORDER BY l.message_id""",
                {"g": group_id, "t": topic_id, "n": max_messages, "lease": float(invisible_duration), "at": at},
            ).fetchall()
        out = []
        for (mid, key, body, ctype, props, published, count, reconsumed, level, until, origin, error) in rows:
            props = json.loads(props) if props != "{}" else {}  # most messages carry none
            if reconsumed > 0:
                props = {**props, "REAL_TOPIC": topic, "ORIGIN_MESSAGE_ID": str(origin),
                         "RETRY_TOPIC": retry_topic, "RECONSUMETIMES": str(reconsumed)}
            out.append(ReceivedMessage(mid, group, topic, key, decode(body, ctype), ctype, props, published,
                                       count, reconsumed, level, until, origin, error))
        return out

    def ack(self, group: str, messages: ReceivedMessage | Iterable[ReceivedMessage]) -> int:
        """Commit received messages; return how many were acknowledged.

        An ack counts only for the delivery it answers (same delivery count) while that delivery is
        still INFLIGHT; an ack that comes after the lease was expired by a tier run and the message
        moved on is ignored (not counted), so no message is ever committed twice."""
        group_id, _ = self._group(group)
        items = _receipts(messages)
        if not items:
            return 0
        row = self.conn.execute(
            f"""WITH acked AS (
                 UPDATE deliveries d SET state = 'COMMITTED', invisible_until = NULL, updated_at = now()
                 FROM unnest(%(ids)s::bigint[], %(counts)s::int[]) AS i(message_id, delivery_count)
                 WHERE d.message_id = i.message_id AND d.group_id = %(g)s AND {_IS_INFLIGHT}
                   AND d.delivery_count = i.delivery_count
                 RETURNING 1)
               SELECT count(*) FROM acked""",
            {"g": group_id, "ids": [m.message_id for m in items], "counts": [m.delivery_count for m in items]},
        ).fetchone()
        return row[0]

    def nack(self, group: str, messages: ReceivedMessage | Iterable[ReceivedMessage],
             error: str | Sequence[str] | None = None, at: datetime | None = None) -> int:
        """Report failed deliveries; each retry waits as the group's policy says for its retry
        number (default: RocketMQ 5 table, seeds/001), and a message whose reconsume times are used
        up is dead-lettered. Returns how many were retried or dead-lettered (stale receipts are
        ignored). ``error``: one text, or one per message."""
        return self._fail(group, messages, error, at, mode="next")

    def reconsume_later(self, group: str, messages: ReceivedMessage | Iterable[ReceivedMessage], *,
                        delay: int | None = None, level: int | None = None,
                        error: str | Sequence[str] | None = None, at: datetime | None = None) -> int:
        """Retry later (Pulsar ``reconsumeLater``, seeds/000): after ``delay`` whole seconds
        (1..864000), at delay ``level`` of the policy's level table (1..its length; a negative level
        dead-letters at once, RocketMQ ``delayLevel < 0``), or with neither at the next level (the
        policy's wait for the next retry). Raises ``InvalidDelayError``, ``InvalidLevelError`` (also
        for level 0), ``ValueError`` (both given) before changing anything."""
        if delay is not None and level is not None:
            raise ValueError("give a delay or a level, not both")
        if delay is not None:
            return self._fail(group, messages, error, at, mode="delay", delay=check_delay(delay))
        if level is not None:
            if isinstance(level, int) and not isinstance(level, bool) and level < 0:
                return self._fail(group, messages, error, at, mode="negative")
            return self._fail(group, messages, error, at, mode="level", level=level)
        return self._fail(group, messages, error, at, mode="next")

    def reject(self, group: str, messages: ReceivedMessage | Iterable[ReceivedMessage],
               error: str | Sequence[str] | None = None, at: datetime | None = None) -> int:
        """Dead-letter received messages at once (reason REJECTED), whatever their attempts."""
        return self._fail(group, messages, error, at, mode="reject")

    _OUTCOMES = {"next": ("nack", "MAX_DELIVERIES_EXCEEDED"), "level": ("reconsume_later", "MAX_DELIVERIES_EXCEEDED"),
                 "delay": ("reconsume_later", "MAX_DELIVERIES_EXCEEDED"), "reject": ("rejected", "REJECTED"),
                 "negative": ("negative_level", "NEGATIVE_LEVEL")}

    def _fail(self, group: str, messages, error, at, *, mode: str, delay: int = 0, level: int = 0) -> int:
        group_id, _ = self._group(group)
        items = _receipts(messages)
        errors = _errors(error, len(items))
        by_topic: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            by_topic.setdefault(item.topic, []).append(index)
        plans = []
        for topic, indexes in by_topic.items():  # everything is checked before anything changes
            policy, table = self._policy(self._topic(topic), group_id, topic, group)
            params = {**table, "g": group_id, "at": at, "dead_lettered_at": at,
                      "ids": [items[i].message_id for i in indexes], "counts": [items[i].delivery_count for i in indexes],
                      "errors": [errors[i] for i in indexes]}
            level_sql, delay_sql, retry_allowed = NEXT_LEVEL, NEXT_DELAY, CAN_RETRY
            if mode == "level":
                explicit = policy.explicit_levels(self.levels)
                try:
                    explicit.check_level(level)
                except InvalidLevelError as exc:
                    raise InvalidLevelError(f"{exc}; a negative level dead-letters (RocketMQ)") from None
                params.update(delay=float(explicit.delay(level)), level=self.levels.level_for_delay(explicit.delay(level)))
                level_sql, delay_sql = "%(level)s", "%(delay)s"
            elif mode == "delay":
                params.update(delay=float(delay), level=self.levels.level_for_delay(delay))
                level_sql, delay_sql = "%(level)s", "%(delay)s"
            elif mode in ("reject", "negative"):
                retry_allowed = "false"
            plans.append((policy, params, level_sql, delay_sql, retry_allowed))
        outcome, reason = self._OUTCOMES[mode]
        done = 0
        inputs = "unnest(%(ids)s::bigint[], %(counts)s::int[], %(errors)s::text[]) AS i(message_id, delivery_count, error)"
        matched = f"""d.message_id = i.message_id AND d.group_id = %(g)s AND {_IS_INFLIGHT}
                      AND d.delivery_count = i.delivery_count AND {POLICY_JOIN}"""
        for policy, params, level_sql, delay_sql, retry_allowed in plans:
            self._ensure_dlq_table(params, inputs, matched, retry_allowed)
        with self.conn.transaction():
            for policy, params, level_sql, delay_sql, retry_allowed in plans:
                done += self.conn.execute(
                    f"""WITH {POLICIES_CTE}, retried AS (
                          UPDATE deliveries d SET state = 'WAITING_RETRY', reconsume_times = d.reconsume_times + 1,
                              delay_level = {level_sql}, due_at = {_AT} + make_interval(secs => {delay_sql}),
                              invisible_until = NULL, last_error = i.error, last_failure_at = {_AT},
                              first_failure_at = coalesce(d.first_failure_at, {_AT}),
                              attempts = {attempt(_AT, repr(outcome), "i.error")}, updated_at = now()
                          FROM {inputs}, policies p WHERE {matched} AND {retry_allowed}
                          RETURNING 1)
                        SELECT count(*) FROM retried""", params).fetchone()[0]
                done += sum(n for _, _, n in self.conn.execute(
                    f"""WITH {POLICIES_CTE}, moved AS (
                          UPDATE deliveries d SET state = 'DLQ', invisible_until = NULL, due_at = NULL,
                              last_error = i.error, last_failure_at = {_AT},
                              first_failure_at = coalesce(d.first_failure_at, {_AT}),
                              attempts = {attempt(_AT, repr(outcome), "i.error")}, updated_at = now()
                          FROM {inputs}, policies p WHERE {matched} AND NOT ({retry_allowed})
                          {RETURNING_MOVED}, '{reason}' AS reason)
                        {DLQ_INSERT}""", params))
        return done

    def _ensure_dlq_table(self, params: dict, inputs: str, matched: str, retry_allowed: str) -> None:
        """Create the DLQ table before the first message is dead-lettered into it (not earlier)."""
        dlq_id = params["p_dlq"][0]
        if self.conn.execute("SELECT table_created_at FROM dead_letter_queues WHERE id = %s", (dlq_id,)).fetchone()[0]:
            return
        if self.conn.execute(f"""WITH {POLICIES_CTE} SELECT 1 FROM deliveries d, {inputs}, policies p
                                 WHERE {matched} AND NOT ({retry_allowed}) LIMIT 1""", params).fetchone():
            ensure_dlq_tables(self.conn, {dlq_id})

    # ---- views --------------------------------------------------------------------------------

    def stats(self) -> dict:
        """Counts per topic, group and state: ``{topic: {group: {"READY": n, "INFLIGHT": n,
        "WAITING_RETRY": n, "COMMITTED": n, "DLQ": n}}}`` for every subscription."""
        out: dict = {}
        for topic, group in self.conn.execute(
                """SELECT t.name, g.name FROM subscriptions s JOIN topics t ON t.id = s.topic_id
                   JOIN consumer_groups g ON g.id = s.group_id ORDER BY 1, 2"""):
            out.setdefault(topic, {})[group] = dict.fromkeys(STATES, 0)
        for topic, group, state, n in self.conn.execute(
                """SELECT t.name, g.name, c.state::text, c.n
                   FROM (SELECT topic_id, group_id, state, count(*) AS n FROM deliveries GROUP BY 1, 2, 3) c
                   JOIN topics t ON t.id = c.topic_id JOIN consumer_groups g ON g.id = c.group_id"""):
            out.setdefault(topic, {}).setdefault(group, dict.fromkeys(STATES, 0))[state] = n
        return out

    def dlq_list(self, group: str, limit: int = 100) -> list[dict]:
        """The oldest ``limit`` dead letters of ``group`` as dicts (body decoded, properties,
        attempt history, DLQ name). Raises ``UnknownGroupError``."""
        from .redrive import DlqFilter, select

        return select(self.conn, DlqFilter(group=group), limit=limit, with_body=True)


__all__ = ["Client", "Message", "ReceivedMessage"]
