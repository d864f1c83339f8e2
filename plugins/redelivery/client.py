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
A ``Client`` holds one connection: use one client per thread. The statements are in
``redelivery.statements``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from . import catalog, db
from . import statements as S
from .codec import STATES, Message, ReceivedMessage, decode, encode, retry_properties
from .config import RedeliveryConfig, cached_config
from .dead_letters import DlqFilter, select
from .errors import InvalidLevelError, NotSubscribedError, TooManyRequestsError
from .levels import check_delay
from .names import check_name
from .policies import EffectivePolicy
from .producer import MIN_CONNECT_TIMEOUT, retrying

#: Lease bounds in seconds (RocketMQ SimpleConsumer invisible duration: 10 s .. 12 h).
MIN_INVISIBLE_SECONDS, MAX_INVISIBLE_SECONDS = 1, 43_200
#: Column types of a binary COPY into publish_staging (statements.COPY_STAGING).
STAGING_TYPES = ["text", "int8", "text", "bytea", "text", "jsonb"]


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

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- topology -----------------------------------------------------------------------------

    def create_topic(self, name: str) -> int:
        """Create topic ``name`` if it does not exist; return its id. ``InvalidNameError`` on a bad name."""
        check_name("topic", name)
        return self.conn.execute(S.CREATE_TOPIC, {"name": name}).fetchone()[0]

    def create_group(self, name: str, max_reconsume_times: int | None = None) -> int:
        """Create consumer group ``name`` if it does not exist; return its id.

        ``max_reconsume_times``: the group's own limit (RocketMQ group metadata), which wins over
        the policies; -1 = unlimited; ``None`` = the matching policy decides (RocketMQ default 16).
        On an existing group it replaces the limit. Raises ``InvalidNameError``, ``ValueError``."""
        check_name("group", name)
        limit = max_reconsume_times
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < -1):
            raise ValueError(f"max_reconsume_times must be an integer >= -1 or None, got {limit!r}")
        group_id = self.conn.execute(S.CREATE_GROUP, {"name": name, "max_reconsume_times": limit}).fetchone()[
            0
        ]
        self._groups.pop(name, None)
        self._policies.clear()
        self._caps.clear()
        return group_id

    def policy(self, topic: str, group: str) -> EffectivePolicy:
        """The effective retry and dead-letter policy of ``group`` on ``topic``. Raises
        ``UnknownGroupError``, ``UnknownTopicError``, ``NotSubscribedError``."""
        return self._policy(self._topic(topic), self._group(group)[0], topic, group)[0]

    def _policy(self, topic_id: int, group_id: int, topic: str, group: str) -> tuple[EffectivePolicy, dict]:
        """(policy, SQL parameters of the policy table) of one subscription, cached."""
        key = (topic_id, group_id)
        if key not in self._policies:
            found = catalog.effective_policies(self.conn, self.config, [key])
            if key not in found:
                raise NotSubscribedError(f"group {group!r} is not subscribed to topic {topic!r}")
            self._policies[key] = (found[key], catalog.policy_table(self.conn, self.config, found))
        return self._policies[key]

    def subscribe(self, group: str, topic: str) -> None:
        """Subscribe ``group`` to ``topic`` (idempotent). Messages published from now on are
        delivered to the group. Raises ``UnknownGroupError`` / ``UnknownTopicError``."""
        group_id, _ = self._group(group)
        topic_id = self._topic(topic)
        self.conn.execute(S.SUBSCRIBE, {"topic_id": topic_id, "g": group_id})
        self._policies.pop((topic_id, group_id), None)
        self._caps.pop(topic_id, None)

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` with its messages, deliveries, subscriptions and dead letters, in one
        transaction. Raises ``UnknownTopicError``."""
        topic_id = self._topic(name)
        with self.conn.transaction():
            self.conn.execute(S.DELETE_TOPIC_DEAD_LETTERS, {"topic_id": topic_id})
            self.conn.execute(S.DELETE_TOPIC, {"topic_id": topic_id})
        self._topics.pop(name, None)

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
        batch id publishes once: publishing the same ``batch_id`` again returns the first publish's
        ids and adds nothing. With ``retry`` (the default), transient failures (lost connection,
        deadlock, flow control) are retried with the producer backoff of the config file (seeds/002)
        under a batch id made up for the call if none is given, so a retry after a commit whose
        answer was lost publishes nothing twice.

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
        for attempt_ in retrying(
            self.config.producer, before_retry=self._before_publish_retry, sleep=self._sleep
        ):
            with attempt_:
                return self._publish_once(topic_id, topic, rows, batch_id, at)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _before_publish_retry(self, retry_state) -> None:
        self.publish_waits.append(retry_state.upcoming_sleep)
        if self.conn.closed or self.conn.broken:
            self.conn = db.connect(self.url, autocommit=True, connect_timeout=MIN_CONNECT_TIMEOUT)

    def _publish_once(self, topic_id: int, topic: str, rows: list, batch_id: str | None, at) -> list[int]:
        staging = batch_id or f"call-{uuid.uuid4()}"
        with self.conn.transaction():
            if batch_id is not None:
                fresh = self.conn.execute(
                    S.CLAIM_PUBLISH_BATCH, {"batch": batch_id, "topic_id": topic_id, "count": len(rows)}
                ).fetchone()
                if fresh is None:
                    return [r[0] for r in self.conn.execute(S.PUBLISHED_IDS, {"batch": batch_id})]
            self._check_backlog(topic_id, topic, len(rows))
            with self.conn.cursor().copy(S.COPY_STAGING) as copy:
                copy.set_types(STAGING_TYPES)
                for seq, (key, body, ctype, props) in enumerate(rows):
                    copy.write_row((staging, seq, key, body, ctype, props))
            ids = [
                r[0]
                for r in self.conn.execute(
                    S.FAN_OUT, {"topic_id": topic_id, "batch": batch_id, "staging": staging, "at": at}
                )
            ]
            self.conn.execute(S.DELETE_STAGED, {"staging": staging})
        return ids

    def _check_backlog(self, topic_id: int, topic: str, adding: int) -> None:
        """Flow control inside the publishing transaction: raise ``TooManyRequestsError`` if a
        subscribed group's READY backlog would pass its cap. Serialised per topic with other
        publishers and with tier runs by an advisory lock."""
        if topic_id not in self._caps:  # resolved once per topic, like the other policy lookups
            pairs = [(topic_id, g) for g in catalog.subscribed_groups(self.conn, topic_id)]
            self._caps[topic_id] = {
                k: p.max_ready_backlog
                for k, p in catalog.effective_policies(self.conn, self.config, pairs).items()
                if p.max_ready_backlog is not None
            }
        capped = self._caps[topic_id]
        if not capped:
            return
        catalog.lock_backlog(self.conn, topic_id)
        for (_, group_id), cap in capped.items():
            ready = catalog.ready_count(self.conn, group_id, topic_id)
            if ready + adding > cap:
                raise TooManyRequestsError(
                    f"530 TOO_MANY_REQUESTS: topic {topic!r} has {ready} ready messages "
                    f"for group id {group_id}; "
                    f"{adding} more would pass its max_ready_backlog of {cap}"
                )

    # ---- consumer -----------------------------------------------------------------------------

    def receive(
        self,
        group: str,
        topic: str,
        max_messages: int = 32,
        invisible_duration: int = 60,
        at: datetime | None = None,
    ) -> list[ReceivedMessage]:
        """Claim up to ``max_messages`` READY messages of ``topic`` for ``group``, oldest first.

        ``invisible_duration``: the lease in seconds (1..43200); unacknowledged past it, a message
        counts as a failed delivery. The incremented delivery count is committed before this
        returns. Raises ``UnknownGroupError``, ``UnknownTopicError``, ``NotSubscribedError``,
        ``ValueError`` (max_messages < 1 or a lease out of range)."""
        group_id, _ = self._group(group)
        topic_id = self._topic(topic)
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise ValueError(f"max_messages must be a positive integer, got {max_messages!r}")
        if not (
            isinstance(invisible_duration, (int, float))
            and MIN_INVISIBLE_SECONDS <= invisible_duration <= MAX_INVISIBLE_SECONDS
        ):
            raise ValueError(
                f"invisible_duration must be {MIN_INVISIBLE_SECONDS}..{MAX_INVISIBLE_SECONDS} seconds, "
                f"got {invisible_duration!r}"
            )
        retry_topic = self._policy(topic_id, group_id, topic, group)[0].retry_name  # NotSubscribedError
        with self.conn.transaction():
            rows = self.conn.execute(
                S.RECEIVE,
                {
                    "g": group_id,
                    "topic_id": topic_id,
                    "n": max_messages,
                    "lease": float(invisible_duration),
                    "at": at,
                },
            ).fetchall()
        out = []
        for mid, key, body, ctype, props, published, count, reconsumed, level, until, origin, error in rows:
            props = json.loads(props) if props != "{}" else {}  # most messages carry none
            props = retry_properties(
                props,
                topic=topic,
                origin_message_id=origin,
                retry_topic=retry_topic,
                reconsume_times=reconsumed,
            )
            out.append(
                ReceivedMessage(
                    mid,
                    group,
                    topic,
                    key,
                    decode(body, ctype),
                    ctype,
                    props,
                    published,
                    count,
                    reconsumed,
                    level,
                    until,
                    origin,
                    error,
                )
            )
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
        return self.conn.execute(
            S.ACK,
            {
                "g": group_id,
                "ids": [m.message_id for m in items],
                "counts": [m.delivery_count for m in items],
            },
        ).fetchone()[0]

    def nack(
        self,
        group: str,
        messages: ReceivedMessage | Iterable[ReceivedMessage],
        error: str | Sequence[str] | None = None,
        at: datetime | None = None,
    ) -> int:
        """Report failed deliveries; each retry waits as the group's policy says for its retry
        number (default: RocketMQ 5 table, seeds/001), and a message whose reconsume times are used
        up is dead-lettered. Returns how many were retried or dead-lettered (stale receipts are
        ignored). ``error``: one text, or one per message."""
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
        items = _receipts(messages)
        errors = _errors(error, len(items))
        outcome, reason, forced = self._MODES[mode]
        by_topic: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            by_topic.setdefault(item.topic, []).append(index)
        plans = []
        for topic, indexes in by_topic.items():  # everything is checked before anything changes
            policy, table = self._policy(self._topic(topic), group_id, topic, group)
            params = {
                **table,
                "g": group_id,
                "at": at,
                "dead_lettered_at": at,
                "outcome": outcome,
                "reason": reason,
                "force_dead_letter": forced,
                "level": None,
                "delay": None,
                "ids": [items[i].message_id for i in indexes],
                "counts": [items[i].delivery_count for i in indexes],
                "errors": [errors[i] for i in indexes],
            }
            if mode == "level":
                explicit = policy.explicit_levels(self.levels)
                try:
                    explicit.check_level(level)
                except InvalidLevelError as exc:
                    raise InvalidLevelError(f"{exc}; a negative level dead-letters (RocketMQ)") from None
                seconds = explicit.delay(level)
                params.update(delay=float(seconds), level=self.levels.level_for_delay(seconds))
            elif mode == "delay":
                params.update(delay=float(delay), level=self.levels.level_for_delay(delay))
            plans.append(params)
        for params in plans:  # DLQ tables are made before the dead-lettering transaction, when needed
            self._ensure_dlq_table(params)
        done = 0
        with self.conn.transaction():
            for params in plans:
                done += self.conn.execute(S.FAIL_RETRY, params).fetchone()[0]
                done += sum(n for _, _, n in self.conn.execute(S.FAIL_DEAD_LETTER, params))
        return done

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

    def dlq_list(self, group: str, limit: int = 100) -> list[dict]:
        """The oldest ``limit`` dead letters of ``group`` as dicts (body decoded, properties,
        attempt history, DLQ name). Raises ``UnknownGroupError``."""
        return select(self.conn, DlqFilter(group=group), limit=limit, with_body=True)


__all__ = ["Client", "Message", "ReceivedMessage"]
