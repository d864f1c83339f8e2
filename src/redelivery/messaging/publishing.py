"""Publishing of the client: ``publish`` (COPY, batch ids that publish a batch once, the
producer retry and flow control of seeds/002, the ready-backlog cap)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg.types.json import set_json_dumps

from redelivery.errors import (
    BatchConflictError,
    BatchTooLargeError,
    InvalidBatchIdError,
    TooManyRequestsError,
)
from redelivery.messaging.admin import Administration
from redelivery.messaging.codec import (
    Message,
    batch_fingerprint,
    encode,
)
from redelivery.messaging.producer import MIN_CONNECT_TIMEOUT, retrying
from redelivery.rules.policies import EffectivePolicy
from redelivery.store import catalog, db, log
from redelivery.store import statements as S

#: Column types of a binary COPY into publish_staging (statements.COPY_STAGING).
STAGING_TYPES = ["text", "text", "int4", "int8", "text", "bytea", "text", "jsonb"]


def copy_cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    """A cursor for a binary COPY of messages: their properties (jsonb) dumped by orjson, a few
    times faster than the standard json module for a value per row."""
    cursor = conn.cursor()
    set_json_dumps(orjson.dumps, context=cursor)
    return cursor


#: Column types of a binary COPY into messages (statements.COPY_MESSAGES).
MESSAGE_TYPES = ["int4", "int8", "text", "bytea", "text", "jsonb", "text", "timestamptz"]


class NeedPartition(Exception):
    """No partition of the log holds publish time ``at``: the publishing transaction rolls back,
    ``log.ensure_partition`` makes one, and the publish runs again."""

    def __init__(self, at: datetime):
        super().__init__(f"no partition of the log holds {at.isoformat()}")
        self.at = at


MAX_BATCH_ID_LENGTH = 200


def check_batch_id(batch_id: object) -> str:
    """Return ``batch_id`` if it is a non-empty str of at most 200 characters; else raise
    ``InvalidBatchIdError``."""
    if not isinstance(batch_id, str) or not 0 < len(batch_id) <= MAX_BATCH_ID_LENGTH or "\x00" in batch_id:
        raise InvalidBatchIdError(
            f"batch id {batch_id!r} is invalid: use a str of 1 to {MAX_BATCH_ID_LENGTH} characters"
        )
    return batch_id


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


class Publishing(Administration):
    """The publishing calls of ``redelivery.client.Client`` (which sets ``conn``, ``config``, ``levels``
    and the caches these use)."""

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
        batch_id = batch_id or f"auto-{uuid.uuid4()}"  # PUBLISHED_IDS finds a repeat's rows by it
        for _ in range(3):  # a partition made for the publish time, then the publish again
            try:
                return self._publish_transaction(topic_id, rows, content, batch_id, at)
            except NeedPartition as need:  # rolled back: nothing was written
                log.ensure_partition(self.conn, need.at, self.config.retention.seconds("partition"))
        raise AssertionError("a partition of the log was made three times and is still missing")

    def _publish_transaction(self, topic_id: int, rows: list, content: str, batch_id: str, at) -> list[int]:
        """One try of a publish, in one transaction under the topic's publish lock: the batch
        claimed, the ready-backlog cap checked, ids taken, the rows COPYed into the log. Raises
        ``NeedPartition`` (rolled back) when no partition of the log holds the publish time."""
        with self.conn.transaction():
            catalog.lock_topic_for_publish(self.conn, topic_id)
            claim = {
                "batch": batch_id,
                "topic_id": topic_id,
                "count": len(rows),
                "fingerprint": content,
                "at": at,
            }
            if self.conn.execute(S.CLAIM_PUBLISH_BATCH, claim).fetchone() is None:
                check_same_batch(self.conn, batch_id, topic_id, content)
                return [r[0] for r in self.conn.execute(S.PUBLISHED_IDS, {"batch": batch_id})]
            if self.conn.execute(S.BATCH_TAGGED, {"batch": batch_id}).fetchone()[0]:
                self.conn.execute(S.UNTAG_FORGOTTEN_BATCH, {"batch": batch_id})
            self._check_backlog(topic_id, len(rows))
            published_at, covered = self.conn.execute(S.PUBLISH_TIME, {"at": at}).fetchone()
            if not covered:
                raise NeedPartition(published_at)
            ids = [r[0] for r in self.conn.execute(S.NEW_MESSAGE_IDS, {"count": len(rows)})]
            with copy_cursor(self.conn).copy(S.COPY_MESSAGES) as copy:
                copy.set_types(MESSAGE_TYPES)
                for message_id, (key, body, ctype, props) in zip(ids, rows, strict=True):
                    copy.write_row((topic_id, message_id, key, body, ctype, props, batch_id, published_at))
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
