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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


from . import db
from .config import RedeliveryConfig, cached_config
from .errors import (
    InvalidNameError,
    MalformedMessageError,
    NotSubscribedError,
    RedeliveryError,
    UnknownGroupError,
    UnknownTopicError,
)
from .levels import check_delay
from .transitions import _DLQ_INSERT, _RETURNING_MOVED, dlq_table_name, ensure_dlq_tables

JSON = "application/json"
BINARY = "application/octet-stream"
TEXT = "text/plain"
STATES = ("READY", "INFLIGHT", "WAITING_RETRY", "COMMITTED", "DLQ")
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
    try:
        dlq_table_name(name)
    except InvalidNameError:
        raise InvalidNameError(
            f"{kind} name {name!r} is invalid: use 1 to 59 letters, digits, '_', '.' or '-', starting with a letter or digit"
        ) from None
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
        self._groups: dict[str, tuple[int, int]] = {}
        self._topics: dict[str, int] = {}

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

        ``max_reconsume_times`` (default: the config's, 16): retries before the next failed delivery
        dead-letters; -1 = unlimited (RocketMQ maxReconsumeTimes). Raises ``ValueError`` below -1."""
        _check_name("group", name)
        limit = self.config.max_reconsume_times if max_reconsume_times is None else max_reconsume_times
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < -1:
            raise ValueError(f"max_reconsume_times must be an integer >= -1, got {limit!r}")
        row = self.conn.execute(
            """INSERT INTO consumer_groups (name, max_reconsume_times) VALUES (%s, %s)
               ON CONFLICT (name) DO UPDATE SET max_reconsume_times = EXCLUDED.max_reconsume_times RETURNING id""",
            (name, limit)).fetchone()
        self._groups.pop(name, None)
        return row[0]

    def subscribe(self, group: str, topic: str) -> None:
        """Subscribe ``group`` to ``topic`` (idempotent). Messages published from now on are
        delivered to the group. Raises ``UnknownGroupError`` / ``UnknownTopicError``."""
        group_id, _ = self._group(group)
        topic_id = self._topic(topic)
        self.conn.execute(
            "INSERT INTO subscriptions (topic_id, group_id) VALUES (%s, %s) ON CONFLICT DO NOTHING", (topic_id, group_id))

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

    def _group(self, name: str) -> tuple[int, int]:
        """(id, max_reconsume_times) of group ``name``; ``UnknownGroupError`` if there is none."""
        if name not in self._groups:
            row = self.conn.execute(
                "SELECT id, max_reconsume_times FROM consumer_groups WHERE name = %s", (name,)).fetchone()
            if row is None:
                raise UnknownGroupError(f"unknown consumer group {name!r}")
            self._groups[name] = (row[0], row[1])
        return self._groups[name]

    # ---- producer -----------------------------------------------------------------------------

    def publish(self, topic: str, messages: Iterable[Message | Any], *, batch_id: str | None = None,
                at: datetime | None = None) -> list[int]:
        """Publish ``messages`` to ``topic`` in one transaction; return their ids in order.

        Each item is a ``Message`` or a bare body. With ``batch_id`` the batch is applied once:
        publishing the same batch id again returns the ids of the first publish and adds nothing.
        Raises ``UnknownTopicError`` or ``MalformedMessageError`` (naming the message index)
        before anything is written."""
        topic_id = self._topic(topic)
        rows = [encode(m, i) for i, m in enumerate(messages)]
        with self.conn.transaction():
            if batch_id is not None:
                fresh = self.conn.execute(
                    """INSERT INTO publish_batches (batch_id, topic_id, message_count) VALUES (%s, %s, %s)
                       ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id""",
                    (batch_id, topic_id, len(rows))).fetchone()
                if fresh is None:
                    return [r[0] for r in self.conn.execute(
                        "SELECT id FROM messages WHERE publish_batch = %s ORDER BY id", (batch_id,))]
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
        if not self.conn.execute("SELECT 1 FROM subscriptions WHERE topic_id = %s AND group_id = %s",
                                 (topic_id, group_id)).fetchone():
            raise NotSubscribedError(f"group {group!r} is not subscribed to topic {topic!r}")
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
                         "RETRY_TOPIC": f"%RETRY%{group}", "RECONSUMETIMES": str(reconsumed)}
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
        """Report failed deliveries; the retry waits the level of its retry number (RocketMQ 5 retry
        table, seeds/001: retry n -> level min(n, 16)). Returns how many were retried or
        dead-lettered (stale receipts are ignored). ``error``: one text, or one per message."""
        return self._fail(group, messages, error, at, mode="next")

    def reconsume_later(self, group: str, messages: ReceivedMessage | Iterable[ReceivedMessage], *,
                        delay: int | None = None, level: int | None = None,
                        error: str | Sequence[str] | None = None, at: datetime | None = None) -> int:
        """Retry later (Pulsar ``reconsumeLater``, seeds/000): after ``delay`` seconds (1..864000),
        at delay ``level`` (1..len(level table)), or with neither at the next level (retry n ->
        level n). Raises ``InvalidDelayError`` / ``InvalidLevelError`` / ``ValueError`` (both given)
        before changing anything. Returns how many were retried or dead-lettered."""
        if delay is not None and level is not None:
            raise ValueError("give a delay or a level, not both")
        if delay is not None:
            return self._fail(group, messages, error, at, mode="delay", delay=check_delay(delay))
        if level is not None:
            self.levels.check_level(level)
            return self._fail(group, messages, error, at, mode="level", level=level)
        return self._fail(group, messages, error, at, mode="next")

    def reject(self, group: str, messages: ReceivedMessage | Iterable[ReceivedMessage],
               error: str | Sequence[str] | None = None, at: datetime | None = None) -> int:
        """Dead-letter received messages at once (reason REJECTED), whatever their attempts."""
        return self._fail(group, messages, error, at, mode="reject")

    def _fail(self, group: str, messages, error, at, *, mode: str, delay: int = 0, level: int = 0) -> int:
        group_id, max_times = self._group(group)
        items = _receipts(messages)
        errors = _errors(error, len(items))
        if not items:
            return 0
        params = {"g": group_id, "at": at, "ids": [m.message_id for m in items],
                  "counts": [m.delivery_count for m in items], "errors": errors,
                  "delays": list(self.levels.delays), "top": len(self.levels)}
        if mode == "reject":
            retry_allowed = "false"
        else:
            retry_allowed = "true" if max_times == -1 else f"d.reconsume_times < {int(max_times)}"
        if mode == "next":
            level_sql = "least(d.reconsume_times + 1, %(top)s)"
            delay_sql = f"(%(delays)s::int[])[{level_sql}]"
        elif mode == "level":
            params.update(level=level, delay=self.levels.delay(level))
            level_sql, delay_sql = "%(level)s", "%(delay)s"
        elif mode == "delay":
            params.update(level=self.levels.level_for_delay(delay), delay=delay)
            level_sql, delay_sql = "%(level)s", "%(delay)s"
        else:  # reject: no retry is scheduled
            level_sql, delay_sql = "NULL", "0"
        reason = "REJECTED" if mode == "reject" else "MAX_DELIVERIES_EXCEEDED"
        inputs = "unnest(%(ids)s::bigint[], %(counts)s::int[], %(errors)s::text[]) AS i(message_id, delivery_count, error)"
        matched = f"""d.message_id = i.message_id AND d.group_id = %(g)s AND {_IS_INFLIGHT}
                      AND d.delivery_count = i.delivery_count"""
        if self.conn.execute("SELECT 1 FROM dlq_tables WHERE group_id = %s", (group_id,)).fetchone() is None:
            # the group's DLQ table is made the first time one of its messages is dead-lettered
            if self.conn.execute(f"SELECT 1 FROM deliveries d, {inputs} WHERE {matched} AND NOT ({retry_allowed}) LIMIT 1",
                                 params).fetchone():
                ensure_dlq_tables(self.conn, {group_id})
        with self.conn.transaction():
            retried = self.conn.execute(
                f"""WITH retried AS (
                      UPDATE deliveries d SET state = 'WAITING_RETRY', reconsume_times = d.reconsume_times + 1,
                          delay_level = {level_sql}, due_at = {_AT} + make_interval(secs => {delay_sql}),
                          invisible_until = NULL, last_error = i.error, last_failure_at = {_AT},
                          first_failure_at = coalesce(d.first_failure_at, {_AT}), updated_at = now()
                      FROM {inputs} WHERE {matched} AND {retry_allowed}
                      RETURNING 1)
                    SELECT count(*) FROM retried""", params).fetchone()[0]
            params["dead_lettered_at"] = at
            dead = self.conn.execute(
                f"""WITH moved AS (
                      UPDATE deliveries d SET state = 'DLQ', invisible_until = NULL, due_at = NULL,
                          last_error = i.error, last_failure_at = {_AT},
                          first_failure_at = coalesce(d.first_failure_at, {_AT}), updated_at = now()
                      FROM {inputs} WHERE {matched} AND NOT ({retry_allowed})
                      {_RETURNING_MOVED}, '{reason}' AS reason)
                    {_DLQ_INSERT}""", params).fetchall()
        return retried + sum(n for _, _, n in dead)

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
        """The oldest ``limit`` dead letters of ``group`` as dicts (body decoded). Raises
        ``UnknownGroupError``."""
        group_id, _ = self._group(group)
        cur = self.conn.execute(
            """SELECT q.message_id, t.name AS topic, q.origin_message_id, q.key, q.body, q.content_type,
                      q.properties, q.reason::text AS reason, q.last_error, q.delivery_count, q.reconsume_times,
                      q.first_failure_at, q.last_failure_at, q.dead_lettered_at
               FROM dlq_messages q JOIN topics t ON t.id = q.topic_id
               WHERE q.group_id = %s ORDER BY q.dead_lettered_at, q.message_id LIMIT %s""", (group_id, limit))
        names = [c.name for c in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
        for row in rows:
            row["body"] = decode(row["body"], row.pop("content_type"))
        return rows


__all__ = ["Client", "Message", "ReceivedMessage"]
