"""The Python client: topics, groups, publish, receive, ack, nack / reconsume_later, reject, stats.

Semantics (RocketMQ 5 PushConsumer state machine, seeds/001):

- ``publish`` stores each message once and gives every group subscribed to its topic its own
  delivery row in READY. A batch id publishes one batch once.
- ``receive`` claims READY rows (``FOR UPDATE SKIP LOCKED``), sets them INFLIGHT with a lease of
  ``invisible_duration`` seconds and increments the delivery count; the transaction commits before
  any message is returned (Artemis ``persist-delivery-count-before-delivery``, seeds/004), so a
  crash can never under-count a delivery. The delivery count never decreases.
- ``ack`` commits; ``nack`` / ``reconsume_later`` schedule a retry (WAITING_RETRY, reconsume times
  + 1) or, once the group's max reconsume times are used up, dead-letter the message; ``reject``
  dead-letters it at once. A consumer that goes silent past its lease is handled by the tier job.
- A receipt, (group, message id, delivery count), answers exactly one delivery: a late or repeated
  answer changes nothing and is counted as stale; an answer for another group is refused.

Every call is one transaction and raises before changing anything on bad input. Times passed as
``at`` (timezone-aware ``datetime``) replace the database clock; ``None`` uses ``now()``.
A ``Client`` holds one connection: use one client per thread. The statements are in
``redelivery.statements``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg.types.json import set_json_dumps

from . import catalog, db
from . import statements as S
from .codec import (
    BINARY,
    STATES,
    Message,
    ReceivedMessage,
    batch_fingerprint,
    decode,
    encode,
    retry_properties,
)
from .config import RedeliveryConfig, cached_config
from .dead_letters import DlqFilter, select
from .errors import (
    BatchConflictError,
    BatchTooLargeError,
    ConfigError,
    ForeignReceiptError,
    InvalidBatchIdError,
    InvalidLevelError,
    InvalidNameError,
    NotSubscribedError,
    TooManyRequestsError,
)
from .levels import check_delay
from .names import check_name
from .policies import MAX_INT, EffectivePolicy
from .producer import MIN_CONNECT_TIMEOUT, retrying

#: Lease bounds in seconds (ours; RocketMQ's SimpleConsumer takes an invisible duration per receive).
MIN_INVISIBLE_SECONDS, MAX_INVISIBLE_SECONDS = 1, 43_200
#: Column types of a binary COPY into publish_staging (statements.COPY_STAGING).
STAGING_TYPES = ["text", "text", "int4", "int8", "text", "bytea", "text", "jsonb"]


def copy_cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    """A cursor for a binary COPY of messages: their properties (jsonb) dumped by orjson, a few
    times faster than the standard json module for a value per row."""
    cursor = conn.cursor()
    set_json_dumps(orjson.dumps, context=cursor)
    return cursor


#: Column types of a binary COPY into messages (statements.COPY_MESSAGES).
MESSAGE_TYPES = ["int4", "text", "bytea", "text", "jsonb", "text", "timestamptz"]
MAX_BATCH_ID_LENGTH = 200
MAX_LIST_LIMIT = 10_000
UNDECODABLE_OUTCOME = "undecodable"


@dataclass(frozen=True)
class Outcome:
    """How to answer one receipt in ``Client.settle``: ``"ack"``, ``"retry"`` (``delay`` in
    seconds or ``level``, else the next level) or ``"reject"``, with an optional error text."""

    receipt: Any
    outcome: str
    error: str | None = None
    delay: int | None = None
    level: int | None = None


def check_batch_id(batch_id: object) -> str:
    """Return ``batch_id`` if it is a non-empty str of at most 200 characters; else raise
    ``InvalidBatchIdError``."""
    if not isinstance(batch_id, str) or not 0 < len(batch_id) <= MAX_BATCH_ID_LENGTH or "\x00" in batch_id:
        raise InvalidBatchIdError(
            f"batch id {batch_id!r} is invalid: use a str of 1 to {MAX_BATCH_ID_LENGTH} characters"
        )
    return batch_id


def check_max_reconsume_times(limit: object) -> int | None:
    """Return ``limit`` if it is None or an int from -1 (unlimited) to 2**31 - 1; else ``ValueError``."""
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not -1 <= limit <= MAX_INT
    ):
        raise ValueError(
            f"max_reconsume_times must be an integer from -1 (unlimited) to {MAX_INT}, or None; got {limit!r}"
        )
    return limit


def _receipts(group: str, messages: ReceivedMessage | Iterable[ReceivedMessage]) -> list[ReceivedMessage]:
    """The receipts, checked (``TypeError``, ``ForeignReceiptError``) and in message-id order: every
    statement then locks rows in the order the tier job's range scans do."""
    items = [messages] if isinstance(messages, ReceivedMessage) else list(messages)
    for item in items:
        if not isinstance(item, ReceivedMessage):
            raise TypeError(f"expected ReceivedMessage objects (from receive), got {type(item).__name__}")
        if item.group != group:
            raise ForeignReceiptError(
                f"message {item.message_id} was received by group {item.group!r}: "
                f"group {group!r} cannot answer for it"
            )
    return sorted(items, key=lambda m: (m.message_id, m.delivery_count))


def _check_error(error: object) -> str | None:
    """An error text as PostgreSQL can store it (``ValueError`` otherwise)."""
    if error is not None and (not isinstance(error, str) or "\x00" in error):
        raise ValueError(
            f"an error text must be a str without a NUL character (PostgreSQL cannot store it), got {error!r}"
        )
    return error


def _errors(error: str | Sequence[str] | None, count: int) -> list[str | None]:
    if error is None or isinstance(error, str):
        return [_check_error(error)] * count
    errors = [_check_error(e) for e in error]
    if len(errors) != count:
        raise ValueError(f"got {len(errors)} errors for {count} messages")
    return errors


def plan_outcome(item: Outcome) -> tuple[str, int, int]:
    """``(mode, delay seconds, level)`` of one ``settle`` outcome, mode being ``"ack"`` or a failure
    mode of ``Client._fail`` (``"reject"``, ``"delay"``, ``"level"``, ``"negative"``, ``"next"``).
    Raises ``ValueError`` (an unknown outcome, both a delay and a level, a bad error text),
    ``InvalidDelayError`` (not 1..864000 whole seconds, Pulsar reconsumeLater, seeds/000),
    ``InvalidLevelError`` (not an int), each naming the message."""
    where = f"message {getattr(item.receipt, 'message_id', '?')}"
    try:
        _check_error(item.error)
        if item.outcome == "ack":
            return ("ack", 0, 0)
        if item.outcome == "reject":
            return ("reject", 0, 0)
        if item.outcome != "retry":
            raise ValueError(f"unknown outcome {item.outcome!r}: use 'ack', 'retry' or 'reject'")
        if item.delay is not None and item.level is not None:
            raise ValueError("a retry takes a delay or a level, not both")
        if item.delay is not None:
            return ("delay", check_delay(item.delay), 0)
        if item.level is None or item.level == 0:
            return ("next", 0, 0)
        if not isinstance(item.level, int) or isinstance(item.level, bool):
            raise InvalidLevelError(f"delay level {item.level!r} is not an integer")
        return ("negative", 0, 0) if item.level < 0 else ("level", 0, item.level)
    except ValueError as exc:  # the same error, naming the message
        raise type(exc)(f"{where}: {exc}") from None


class _NeedDlqTable(Exception):
    """Rolls a receive back when an undecodable body must be dead-lettered into a DLQ without a table."""


class Client:
    """A connection to the state store. ``url``: libpq URL (default: ``database_url()``).

    Raises ``SchemaNotMigratedError`` when the database was never migrated or is at an older
    migration (run ``redelivery db upgrade``: a client never migrates), ``ConfigError`` when
    messages wait at delay levels the config's level table lacks."""

    def __init__(self, url: str | None = None, config: RedeliveryConfig | None = None):
        self.url = url or db.database_url()
        self.config = config or cached_config()
        self.levels = self.config.level_table
        self.conn = db.connect(self.url, autocommit=True)
        try:
            db.check_schema(self.conn)
            catalog.check_level_table(self.conn, self.config)
        except BaseException:
            self.conn.close()
            raise
        self._groups: dict[str, tuple[int, int | None]] = {}
        self._topics: dict[str, int] = {}
        self._policies: dict[tuple[int, int], tuple[EffectivePolicy, dict]] = {}
        self._caps: dict[int, dict] = {}  # topic id -> {group id: policy with a ready-backlog cap}
        self._sleep = time.sleep  # the producer retry's sleep (tests replace it)
        self.publish_waits: list[float] = []  # the waits of the last publish's retries, seconds

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- topology -----------------------------------------------------------------------------

    def _get_or_create(self, statement: str, params: dict) -> int:
        for _ in range(2):  # a creator that lost a race finds the winner's row the second time
            row = self.conn.execute(statement, params).fetchone()
            if row is not None:
                return row[0]
        raise AssertionError(f"{statement.splitlines()[0]} returned no id twice")

    def create_topic(self, name: str) -> int:
        """Create topic ``name`` if it does not exist; return its id. ``InvalidNameError`` on a bad name."""
        check_name("topic", name)
        return self._get_or_create(S.CREATE_TOPIC, {"name": name})

    def create_group(self, name: str, max_reconsume_times: int | None = None) -> int:
        """Create consumer group ``name`` if it does not exist; return its id.

        ``max_reconsume_times``: the group's own limit (RocketMQ group metadata), which wins over
        the policies; -1 = unlimited. ``None`` keeps an existing group's limit (a new group then has
        none: the matching policy decides, RocketMQ default 16); ``update_group`` clears it. Raises
        ``InvalidNameError``, ``ValueError``."""
        check_name("group", name)
        limit = check_max_reconsume_times(max_reconsume_times)
        group_id = self._get_or_create(S.CREATE_GROUP, {"name": name, "max_reconsume_times": limit})
        self._forget_group(name)
        return group_id

    def update_group(self, name: str, *, max_reconsume_times: int | None) -> None:
        """Set group ``name``'s own max reconsume times (-1 unlimited), or clear it with ``None`` so
        that the policies decide. Raises ``UnknownGroupError``, ``ValueError``."""
        limit = check_max_reconsume_times(max_reconsume_times)
        self._group(name)
        self.conn.execute(S.SET_GROUP_MAX, {"name": name, "max_reconsume_times": limit})
        self._forget_group(name)

    def _forget_group(self, name: str) -> None:
        self._groups.pop(name, None)
        self._policies.clear()
        self._caps.clear()

    def policy(self, topic: str, group: str) -> EffectivePolicy:
        """The effective retry and dead-letter policy of ``group`` on ``topic``. Raises
        ``UnknownGroupError``, ``UnknownTopicError``, ``NotSubscribedError``, ``ConfigError``."""
        return self._effective_policy(self._topic(topic), self._group(group)[0], topic, group)

    def _effective_policy(self, topic_id: int, group_id: int, topic: str, group: str) -> EffectivePolicy:
        """The policy of one subscription, read only (a check before a change writes nothing)."""
        key = (topic_id, group_id)
        if key in self._policies:
            return self._policies[key][0]
        found = catalog.effective_policies(self.conn, self.config, [key])
        if key not in found:
            raise NotSubscribedError(f"group {group!r} is not subscribed to topic {topic!r}")
        return found[key]

    def _policy(self, topic_id: int, group_id: int, topic: str, group: str) -> tuple[EffectivePolicy, dict]:
        """(policy, SQL parameters of the policy table) of one subscription, cached. Registers the
        DLQ's name (``catalog.policy_table``): for a call that is about to change state."""
        key = (topic_id, group_id)
        if key not in self._policies:
            policy = self._effective_policy(topic_id, group_id, topic, group)
            self._policies[key] = (policy, catalog.policy_table(self.conn, self.config, {key: policy}))
        return self._policies[key]

    def subscribe(self, group: str, topic: str) -> None:
        """Subscribe ``group`` to ``topic`` (idempotent). Messages published from now on are
        delivered to the group. Raises ``UnknownGroupError`` / ``UnknownTopicError``, and
        ``InvalidNameError`` when the pair's DLQ or retry name (by its policy) cannot name a table."""
        group_id, own_max = self._group(group)
        topic_id = self._topic(topic)
        try:
            self.config.policy_for(topic, group, own_max)
        except ConfigError as exc:
            raise InvalidNameError(f"cannot subscribe group {group!r} to topic {topic!r}: {exc}") from None
        self.conn.execute(S.SUBSCRIBE, {"topic_id": topic_id, "g": group_id})
        self._policies.pop((topic_id, group_id), None)
        self._caps.pop(topic_id, None)

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` with its messages, deliveries, subscriptions and dead letters, in one
        transaction: it waits for the publishes and redrives writing to the topic, and a dead letter
        written meanwhile goes with its delivery. Raises ``UnknownTopicError``."""
        topic_id = self._topic(name)
        with self.conn.transaction():
            self.conn.execute(S.LOCK_TOPIC_FOR_DELETE, {"topic_id": topic_id})
            self.conn.execute(S.DELETE_TOPIC, {"topic_id": topic_id})
        self._topics.pop(name, None)
        self._caps.pop(topic_id, None)
        self._policies = {k: v for k, v in self._policies.items() if k[0] != topic_id}

    def _topic(self, name: str) -> int:
        if name not in self._topics:
            self._topics[name] = catalog.topic_id(self.conn, name)
        return self._topics[name]

    def _group(self, name: str) -> tuple[int, int | None]:
        """(id, own max_reconsume_times) of group ``name``; ``UnknownGroupError`` if there is none."""
        if name not in self._groups:
            self._groups[name] = catalog.group(self.conn, name)
        return self._groups[name]

    # ---- producer -----------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        messages: Iterable[Message | Any],
        *,
        batch_id: str | None = None,
        at: datetime | None = None,
        retry: bool = True,
    ) -> list[int]:
        """Publish ``messages`` to ``topic`` in one transaction; return their ids in order.

        Each item is a ``Message`` or a bare body. The rows go to PostgreSQL with a binary COPY. A
        batch id means one batch, published once: publishing it again with the same content returns
        the first publish's ids and adds nothing. With ``retry`` (the default), transient failures
        (lost connection, deadlock, flow control) are retried with the producer backoff of the
        config file (seeds/002) under a batch id made up for the call if none is given, so a retry
        after a commit whose answer was lost publishes nothing twice.

        Raises before anything is written: ``UnknownTopicError``; ``MalformedMessageError`` (naming
        the message index); ``InvalidBatchIdError``; ``BatchConflictError`` when the batch id was
        published to another topic or with other content; ``BatchTooLargeError`` when the batch is
        larger than a subscribed group's ``max_ready_backlog``. ``TooManyRequestsError`` (530) when
        a group's ready backlog would pass its cap, after the retries; the last transient
        ``psycopg.OperationalError`` when the attempts are used up."""
        topic_id = self._topic(topic)
        if batch_id is not None:
            check_batch_id(batch_id)
        rows = [encode(m, i) for i, m in enumerate(messages)]
        content = batch_fingerprint(rows)
        if not retry:
            return self._publish_once(topic_id, rows, content, batch_id, at)
        batch_id = batch_id or f"auto-{uuid.uuid4()}"
        self.publish_waits = []
        for attempt_ in retrying(
            self.config.producer, before_retry=self._before_publish_retry, sleep=self._sleep
        ):
            with attempt_:
                return self._publish_once(topic_id, rows, content, batch_id, at)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _before_publish_retry(self, retry_state) -> None:
        self.publish_waits.append(retry_state.upcoming_sleep)
        if self.conn.closed or self.conn.broken:
            self.conn = db.connect(self.url, autocommit=True, connect_timeout=MIN_CONNECT_TIMEOUT)

    def _publish_once(self, topic_id: int, rows: list, content: str, batch_id: str | None, at) -> list[int]:
        self._check_fits(topic_id, len(rows))  # not transient: the retry loop lets it through at once
        batch_id = batch_id or f"auto-{uuid.uuid4()}"  # FAN_OUT finds the rows by their batch id
        with self.conn.transaction():
            catalog.lock_topic(self.conn, topic_id)
            claim = {"batch": batch_id, "topic_id": topic_id, "count": len(rows), "fingerprint": content}
            if self.conn.execute(S.CLAIM_PUBLISH_BATCH, claim).fetchone() is None:
                check_same_batch(self.conn, batch_id, topic_id, content)
                return [r[0] for r in self.conn.execute(S.PUBLISHED_IDS, {"batch": batch_id})]
            self.conn.execute(S.UNTAG_FORGOTTEN_BATCH, {"batch": batch_id})
            self._check_backlog(topic_id, len(rows))
            [published_at] = self.conn.execute(S.PUBLISH_TIME, {"at": at}).fetchone()
            with copy_cursor(self.conn).copy(S.COPY_MESSAGES) as copy:
                copy.set_types(MESSAGE_TYPES)
                for key, body, ctype, props in rows:
                    copy.write_row((topic_id, key, body, ctype, props, batch_id, published_at))
            ids = [r[0] for r in self.conn.execute(S.FAN_OUT, {"batch": batch_id}).fetchall()]
            if len(ids) != len(rows):  # another writer of this batch id: impossible once claimed
                raise AssertionError(
                    f"batch {batch_id!r}: {len(rows)} rows copied, {len(ids)} messages found"
                )
        return ids

    def _backlog_caps(self, topic_id: int) -> dict[int, EffectivePolicy]:
        """{group id: policy} of the topic's subscriptions with a ready-backlog cap, resolved once
        per topic. A subscription whose policy cannot be resolved has no known cap: it never blocks
        a publish (the tier runs report it)."""
        if topic_id not in self._caps:
            pairs = [(topic_id, g) for g in catalog.subscribed_groups(self.conn, topic_id)]
            policies = catalog.effective_policies(self.conn, self.config, pairs, problems={})
            self._caps[topic_id] = {g: p for (_, g), p in policies.items() if p.max_ready_backlog is not None}
        return self._caps[topic_id]

    def _check_fits(self, topic_id: int, adding: int) -> None:
        """``BatchTooLargeError`` for a batch that no ready-backlog cap can ever take: not flow control."""
        for policy in self._backlog_caps(topic_id).values():
            if adding > policy.max_ready_backlog:
                raise BatchTooLargeError(
                    f"a batch of {adding} messages can never fit the max_ready_backlog of "
                    f"{policy.max_ready_backlog} of group {policy.group!r} on topic {policy.topic!r}: "
                    "publish it in smaller batches"
                )

    def _check_backlog(self, topic_id: int, adding: int) -> None:
        """Flow control inside the publishing transaction: raise ``TooManyRequestsError`` if a
        subscribed group's READY backlog would pass its cap. Serialised per topic with other
        publishers and with tier runs by an advisory lock."""
        capped = self._backlog_caps(topic_id)
        if not capped:
            return
        catalog.lock_backlog(self.conn, topic_id)
        for group_id, policy in capped.items():
            ready = catalog.ready_count(self.conn, group_id, topic_id)
            if ready + adding > policy.max_ready_backlog:
                raise TooManyRequestsError(
                    f"530 TOO_MANY_REQUESTS: topic {policy.topic!r} has {ready} ready messages for group "
                    f"{policy.group!r}; {adding} more would pass its max_ready_backlog of "
                    f"{policy.max_ready_backlog}"
                )

    # ---- consumer -----------------------------------------------------------------------------

    def receive(
        self,
        group: str,
        topic: str,
        max_messages: int = 32,
        invisible_duration: float = 60,
        at: datetime | None = None,
    ) -> list[ReceivedMessage]:
        """Claim up to ``max_messages`` READY messages of ``topic`` for ``group``, oldest first.

        ``invisible_duration``: the lease in seconds (1..43200); unacknowledged past it, a message
        counts as a failed delivery. The incremented delivery count is committed before this
        returns. A message whose body cannot be decoded (JSON that PostgreSQL stores but Python
        refuses: nesting deeper than the interpreter allows, integers over 4300 digits) is
        dead-lettered in the same transaction with reason UNDECODABLE, so that nothing is left in
        flight for a message the caller does not get. Raises ``UnknownGroupError``,
        ``UnknownTopicError``, ``NotSubscribedError``, ``ValueError`` (max_messages < 1 or a lease
        out of range)."""
        group_id, _ = self._group(group)
        topic_id = self._topic(topic)
        self._check_lease(max_messages, invisible_duration)
        policy, table = self._policy(topic_id, group_id, topic, group)  # NotSubscribedError
        params = {
            "g": group_id,
            "topic_id": topic_id,
            "n": max_messages,
            "lease": float(invisible_duration),
            "at": at,
        }
        for _ in range(2):
            try:
                with self.conn.transaction():
                    rows = self.conn.execute(S.RECEIVE, params).fetchall()
                    out, bad = self._decode_received(rows, group, topic, policy.retry_name)
                    if bad:
                        self._dead_letter_undecodable(bad, group_id, table, at)
                return out
            except _NeedDlqTable:  # rolled back: make the table, then claim again
                catalog.ensure_dlq_tables(self.conn, {table["p_dlq"][0]})
        raise AssertionError("unreachable: the DLQ table exists on the second try")

    @staticmethod
    def _check_lease(max_messages, invisible_duration) -> None:
        if (
            isinstance(max_messages, bool)
            or not isinstance(max_messages, int)
            or not 1 <= max_messages <= MAX_INT
        ):
            raise ValueError(f"max_messages must be a positive integer, got {max_messages!r}")
        if isinstance(invisible_duration, bool) or not (
            isinstance(invisible_duration, (int, float))
            and MIN_INVISIBLE_SECONDS <= invisible_duration <= MAX_INVISIBLE_SECONDS
        ):
            raise ValueError(
                f"invisible_duration must be {MIN_INVISIBLE_SECONDS}..{MAX_INVISIBLE_SECONDS} seconds, "
                f"got {invisible_duration!r}"
            )

    def lease_rows(
        self, group: str, topic: str, max_messages: int, invisible_duration: float, at: datetime | None = None
    ) -> list[dict]:
        """``receive`` for DataFrames: the leased messages as dicts of plain values, bodies not
        decoded (``body``: the text of a JSON or text body; ``body_binary``: the bytes of a binary
        one). Committed before this returns; same arguments and errors as ``receive``."""
        group_id, _ = self._group(group)
        topic_id = self._topic(topic)
        self._check_lease(max_messages, invisible_duration)
        policy = self._effective_policy(topic_id, group_id, topic, group)
        params = {
            "g": group_id,
            "topic_id": topic_id,
            "n": max_messages,
            "lease": float(invisible_duration),
            "at": at,
        }
        with self.conn.transaction():
            rows = self.conn.execute(S.RECEIVE, params).fetchall()
        out = []
        for mid, key, body, ctype, props, published, count, reconsumed, _, _, origin, error, redriven in rows:
            props = retry_properties(
                json.loads(props) if props != "{}" else {},
                topic=topic,
                origin_message_id=origin,
                retry_topic=policy.retry_name,
                reconsume_times=reconsumed,
            )
            binary = ctype == BINARY
            out.append(
                {
                    "group": group,
                    "topic": topic,
                    "message_id": mid,
                    "delivery_count": count,
                    "reconsume_times": reconsumed,
                    "key": key,
                    "body": None if binary else bytes(body).decode("utf-8", errors="replace"),
                    "body_binary": bytes(body) if binary else None,
                    "content_type": ctype,
                    "properties": list(props.items()),
                    "published_at": published,
                    "origin_message_id": origin,
                    "last_error": error,
                    "redrive_count": redriven,
                }
            )
        return out

    @staticmethod
    def _decode_received(rows, group, topic, retry_topic) -> tuple[list[ReceivedMessage], list[tuple]]:
        """ReceivedMessages of the RECEIVE rows whose body decodes, and (id, delivery count, error)
        of those whose body does not."""
        out, bad = [], []
        for mid, key, body, ctype, props, *rest in rows:
            # rest: published at, delivery count, reconsume times, level, lease end, origin, error, redrives
            count, reconsumed, origin = rest[1], rest[2], rest[5]
            try:
                value = decode(body, ctype)
            except (ValueError, RecursionError) as exc:
                bad.append(
                    (mid, count, f"body is not decodable as {ctype}: {type(exc).__name__}: {exc}"[:1000])
                )
                continue
            props = json.loads(props) if props != "{}" else {}  # most messages carry none
            props = retry_properties(
                props,
                topic=topic,
                origin_message_id=origin,
                retry_topic=retry_topic,
                reconsume_times=reconsumed,
            )
            out.append(ReceivedMessage(mid, group, topic, key, value, ctype, props, *rest))
        return out, bad

    def _dead_letter_undecodable(self, bad: list[tuple], group_id: int, table: dict, at) -> None:
        if not self.conn.execute(S.DLQ_TABLE_STATE, {"dlq_id": table["p_dlq"][0]}).fetchone()[1]:
            raise _NeedDlqTable
        params = {**table, "g": group_id, "at": at, "dead_lettered_at": at, "outcome": UNDECODABLE_OUTCOME}
        params.update(reason="UNDECODABLE", force_dead_letter=True, level=None, delay=None)
        params.update(ids=[b[0] for b in bad], counts=[b[1] for b in bad], errors=[b[2] for b in bad])
        dead = sum(n for _, _, n in self.conn.execute(S.FAIL_DEAD_LETTER, params))
        catalog.add_group_totals(self.conn, dead_lettered={group_id: dead})

    def ack(self, group: str, messages: ReceivedMessage | Iterable[ReceivedMessage]) -> int:
        """Commit received messages; return how many were acknowledged.

        An ack counts only for the delivery it answers (same delivery count) while that delivery is
        still INFLIGHT; a late or repeated ack changes nothing and is counted as a stale receipt,
        so no message is ever committed twice. Raises ``ForeignReceiptError`` for a message another
        group received or a receipt naming another topic than its message's, ``TypeError`` for
        anything but a ``ReceivedMessage``, before anything changes."""
        group_id, _ = self._group(group)
        items = _receipts(group, messages)
        if not items:
            return 0
        self._check_receipt_topics(items)
        params = {
            "g": group_id,
            "ids": [m.message_id for m in items],
            "counts": [m.delivery_count for m in items],
            "count_stale": True,
        }
        return db.retry_lock_conflicts(lambda: self.conn.execute(S.ACK, params).fetchone()[0])

    def nack(
        self,
        group: str,
        messages: ReceivedMessage | Iterable[ReceivedMessage],
        error: str | Sequence[str] | None = None,
        at: datetime | None = None,
    ) -> int:
        """Report failed deliveries; each retry waits as the group's policy says for its retry
        number (default: RocketMQ 5 table, seeds/001), and a message whose reconsume times are used
        up is dead-lettered. Returns how many were retried or dead-lettered (stale receipts change
        nothing and are counted as stale). ``error``: one text, or one per message."""
        return self._fail(group, messages, error, at, mode="next")

    def reconsume_later(
        self,
        group: str,
        messages: ReceivedMessage | Iterable[ReceivedMessage],
        *,
        delay: int | None = None,
        level: int | None = None,
        error: str | Sequence[str] | None = None,
        at: datetime | None = None,
    ) -> int:
        """Retry later (Pulsar ``reconsumeLater``, seeds/000): after ``delay`` whole seconds
        (1..864000), or at delay ``level``, or with neither at the next level (the policy's wait for
        the next retry).

        ``level`` follows the brokers (seeds/000, seeds/003): ``n >= 1`` indexes the policy's
        explicit level table (RocketMQ and Pulsar presets: the broker's 18 levels ``1s 5s 10s 30s
        1m ... 2h``, so level 3 is 10 s; Artemis: the routing table); above the table RocketMQ takes
        its last level, the other presets refuse it; ``0`` is the next level (RocketMQ
        ``delayLevel == 0``: ``3 + reconsumeTimes``); a negative level dead-letters at once
        (reason NEGATIVE_LEVEL). Raises ``InvalidDelayError``, ``InvalidLevelError``,
        ``ValueError`` (both given) before changing anything."""
        if delay is not None and level is not None:
            raise ValueError("give a delay or a level, not both")
        if delay is not None:
            return self._fail(group, messages, error, at, mode="delay", delay=check_delay(delay))
        if level is not None:
            if not isinstance(level, int) or isinstance(level, bool):
                raise InvalidLevelError(f"delay level {level!r} is not an integer")
            if level < 0:
                return self._fail(group, messages, error, at, mode="negative")
            if level > 0:
                return self._fail(group, messages, error, at, mode="level", level=level)
        return self._fail(group, messages, error, at, mode="next")

    def reject(
        self,
        group: str,
        messages: ReceivedMessage | Iterable[ReceivedMessage],
        error: str | Sequence[str] | None = None,
        at: datetime | None = None,
    ) -> int:
        """Dead-letter received messages at once (reason REJECTED), whatever their attempts."""
        return self._fail(group, messages, error, at, mode="reject")

    #: mode -> (outcome in the attempt history, dead-letter reason, dead-letter without a retry)
    _MODES = {
        "next": ("nack", "MAX_DELIVERIES_EXCEEDED", False),
        "level": ("reconsume_later", "MAX_DELIVERIES_EXCEEDED", False),
        "delay": ("reconsume_later", "MAX_DELIVERIES_EXCEEDED", False),
        "reject": ("rejected", "REJECTED", True),
        "negative": ("negative_level", "NEGATIVE_LEVEL", True),
    }

    def _fail(self, group: str, messages, error, at, *, mode: str, delay: int = 0, level: int = 0) -> int:
        group_id, _ = self._group(group)
        items = _receipts(group, messages)
        self._check_receipt_topics(items)
        plans = self._plan_failures(
            group_id, group, items, _errors(error, len(items)), at, mode, delay, level
        )

        def apply() -> int:
            with self.conn.transaction():
                retried, dead = self._apply_failures(plans)
                catalog.add_group_totals(
                    self.conn, dead_lettered={group_id: dead}, stale={group_id: len(items) - retried - dead}
                )
            return retried + dead

        return db.retry_lock_conflicts(apply)

    def _plan_failures(
        self, group_id: int, group: str, items, errors, at, mode: str, delay=0, level=0
    ) -> list:
        """The parameters of FAIL_RETRY / FAIL_DEAD_LETTER for ``items`` (receipts), one set per
        topic; everything is checked here, before anything changes; the DLQ tables they would need
        are made (each in a short transaction of its own)."""
        outcome, reason, forced = self._MODES[mode]
        by_topic: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            by_topic.setdefault(item.topic, []).append(index)
        plans = []
        for topic, indexes in by_topic.items():
            policy, table = self._policy(self._topic(topic), group_id, topic, group)
            params = {**table, "g": group_id, "at": at, "dead_lettered_at": at, "outcome": outcome}
            params.update(reason=reason, force_dead_letter=forced, level=None, delay=None)
            params.update(
                ids=[items[i].message_id for i in indexes],
                counts=[items[i].delivery_count for i in indexes],
                errors=[errors[i] for i in indexes],
            )
            if mode == "level":
                seconds = policy.explicit_delay(level, self.levels)
                params.update(delay=float(seconds), level=self.levels.level_for_delay(seconds))
            elif mode == "delay":
                params.update(delay=float(delay), level=self.levels.level_for_delay(delay))
            plans.append(params)
        for params in plans:  # DLQ tables are made before the dead-lettering transaction, when needed
            self._ensure_dlq_table(params)
        return plans

    def _apply_failures(self, plans: list) -> tuple[int, int]:
        """(retried, dead-lettered) by ``plans``, in the caller's transaction."""
        retried = dead = 0
        for params in plans:
            retried += self.conn.execute(S.FAIL_RETRY, params).fetchone()[0]
            dead += sum(n for _, _, n in self.conn.execute(S.FAIL_DEAD_LETTER, params))
        return retried, dead

    def settle(
        self,
        group: str,
        outcomes: Iterable[Outcome],
        *,
        at: datetime | None = None,
        marker: tuple[str, int] | None = None,
    ) -> dict:
        """Answer many receipts at once, each with its own outcome, in one transaction: all of
        them or none. Each ``Outcome`` is a receipt (``ReceivedMessage``, or anything with
        ``message_id``, ``delivery_count``, ``topic`` and ``group``), ``"ack"``, ``"retry"``
        (with an optional ``delay`` in seconds or ``level``, as ``reconsume_later``) or
        ``"reject"``, and an optional error text. ``marker`` (a job run id and a part number)
        makes a repeated call with the same marker change nothing and return the first call's
        counts: a Spark task that runs twice settles its partition once.

        Returns ``{"acked", "retried", "dead_lettered", "stale"}``. Raises, before changing
        anything, what ``check_outcomes`` raises."""
        group_id, _ = self._group(group)
        items = list(outcomes)
        acks, failures = self._sort_outcomes(group, items)
        plans = []
        for (mode, delay, level), group_items in failures.items():
            receipts = sorted(
                (i.receipt for i in group_items), key=lambda r: (r.message_id, r.delivery_count)
            )
            by_id = {(i.receipt.message_id, i.receipt.delivery_count): i.error for i in group_items}
            errors = [by_id[(r.message_id, r.delivery_count)] for r in receipts]
            plans += self._plan_failures(group_id, group, receipts, errors, at, mode, delay, level)
        acks.sort(key=lambda r: (r.message_id, r.delivery_count))
        ack_params = {
            "g": group_id,
            "ids": [r.message_id for r in acks],
            "counts": [r.delivery_count for r in acks],
            "count_stale": False,  # counted below, after the failures' delivery rows are locked
        }

        def apply() -> dict:
            with self.conn.transaction():
                if marker is not None:
                    keys = {"settle_run": marker[0], "part": marker[1]}
                    if self.conn.execute(S.SETTLE_PART_CLAIM, keys).fetchone() is None:
                        done = self.conn.execute(S.SETTLE_PART, keys).fetchone()
                        return dict(zip(("acked", "retried", "dead_lettered", "stale"), done, strict=True))
                acked = self.conn.execute(S.ACK, ack_params).fetchone()[0] if acks else 0
                retried, dead = self._apply_failures(plans)
                failed = sum(len(v) for v in failures.values())
                stale = len(acks) - acked + failed - retried - dead
                catalog.add_group_totals(self.conn, dead_lettered={group_id: dead}, stale={group_id: stale})
                counts = {
                    "acked": acked,
                    "retried": retried,
                    "dead_lettered": dead,
                    "stale": len(items) - acked - retried - dead,
                }
                if marker is not None:
                    self.conn.execute(S.SETTLE_PART_RECORD, {**keys, **counts})
                return counts

        return db.retry_lock_conflicts(apply)

    def check_outcomes(self, group: str, outcomes: Iterable[Outcome]) -> None:
        """Check ``outcomes`` as ``settle`` does before it changes anything, changing nothing (a
        Spark settle checks every partition this way before any of them settles). Raises
        ``ForeignReceiptError`` (a receipt of another group, or naming another topic than its
        message's), ``UnknownTopicError`` / ``NotSubscribedError`` (a receipt's topic),
        ``ValueError``, ``InvalidDelayError``, ``InvalidLevelError`` (``plan_outcome``; a level the
        group's policy refuses on that topic), each naming the message."""
        self._sort_outcomes(group, list(outcomes))

    def _sort_outcomes(self, group: str, items: list[Outcome]) -> tuple[list, dict]:
        """(the receipts to ack, {(mode, delay, level): outcomes} of the failures), every item
        checked (``check_outcomes``)."""
        group_id, _ = self._group(group)
        acks, failures, levels_ok = [], {}, set()
        for item in items:
            receipt = item.receipt
            if receipt.group != group:
                raise ForeignReceiptError(
                    f"message {receipt.message_id} was received by group {receipt.group!r}: "
                    f"group {group!r} cannot answer for it"
                )
            mode, delay, level = plan_outcome(item)
            if mode == "ack":
                acks.append(receipt)
                continue
            if mode == "level" and (receipt.topic, level) not in levels_ok:
                policy = self._effective_policy(self._topic(receipt.topic), group_id, receipt.topic, group)
                try:
                    policy.explicit_delay(level, self.levels)
                except InvalidLevelError as exc:
                    raise InvalidLevelError(f"message {receipt.message_id}: {exc}") from None
                levels_ok.add((receipt.topic, level))
            failures.setdefault((mode, delay, level), []).append(item)
        self._check_receipt_topics([item.receipt for item in items])
        return acks, failures

    def _check_receipt_topics(self, receipts: Sequence) -> None:
        """``ForeignReceiptError`` unless each receipt names the topic of its message: an answer
        on the wrong topic would otherwise be applied in part and counted stale in part."""
        if not receipts:
            return
        params = {
            "ids": [r.message_id for r in receipts],
            "topic_ids": [self._topic(r.topic) for r in receipts],
        }
        row = self.conn.execute(S.RECEIPT_OF_ANOTHER_TOPIC, params).fetchone()
        if row is not None:
            raise ForeignReceiptError(
                f"message {row[0]} is a message of topic {row[1]!r}: a receipt naming another topic "
                "cannot answer for it"
            )

    def _ensure_dlq_table(self, params: dict) -> None:
        """Create the DLQ table before the first message is dead-lettered into it (not earlier)."""
        dlq_id = params["p_dlq"][0]
        if self.conn.execute(S.DLQ_TABLE_STATE, {"dlq_id": dlq_id}).fetchone()[1]:
            return
        if self.conn.execute(S.FAIL_WOULD_DEAD_LETTER, params).fetchone():
            catalog.ensure_dlq_tables(self.conn, {dlq_id})

    # ---- views --------------------------------------------------------------------------------

    def stats(self) -> dict:
        """Counts per topic, group and state: ``{topic: {group: {"READY": n, "INFLIGHT": n,
        "WAITING_RETRY": n, "COMMITTED": n, "DLQ": n}}}`` for every subscription."""
        out: dict = {}
        for topic, group in self.conn.execute(S.SUBSCRIPTION_NAMES):
            out.setdefault(topic, {})[group] = dict.fromkeys(STATES, 0)
        for topic, group, state, n in self.conn.execute(S.STATE_COUNTS):
            out.setdefault(topic, {}).setdefault(group, dict.fromkeys(STATES, 0))[state] = n
        return out

    def stale_receipts(self, group: str) -> int:
        """How many receipts of ``group`` changed nothing (late or repeated answers)."""
        return self.conn.execute(S.GROUP_STALE_RECEIPTS, {"g": self._group(group)[0]}).fetchone()[0]

    def dlq_list(self, group: str, limit: int = 100) -> list[dict]:
        """The oldest ``limit`` (1..10000) dead letters of ``group`` as dicts (body decoded,
        properties, attempt history, DLQ name, redrive count). Raises ``UnknownGroupError``,
        ``ValueError``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}, got {limit!r}")
        return select(self.conn, DlqFilter(group=group), limit=limit, with_body=True)


def check_same_batch(conn: psycopg.Connection, batch_id: str, topic_id: int, content: str) -> None:
    """Raise ``BatchConflictError`` unless batch ``batch_id`` was published to ``topic_id`` with the
    fingerprint ``content``: a batch id means one batch."""
    topic, _, published = conn.execute(S.PUBLISHED_BATCH, {"batch": batch_id}).fetchone()
    if topic != topic_id:
        raise BatchConflictError(f"batch id {batch_id!r} was published to another topic (id {topic})")
    if published is not None and published != content:
        raise BatchConflictError(
            f"batch id {batch_id!r} was published with other content ({published.split(':')[0]} messages, "
            f"fingerprint {published}; this batch: {content}): a batch id means one batch"
        )


__all__ = ["Client", "Message", "ReceivedMessage"]
