"""Publishing of the client: ``publish`` (COPY, batch ids that publish a batch once, the
producer retry and flow control of RocketMQ cloud's "Send retry and flow control", the
ready-backlog cap)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg import pq, sql

from redelivery.errors import (
    BatchConflictError,
    BatchExpiredError,
    BatchTooLargeError,
    InvalidBatchIdError,
    MalformedMessageError,
    PublishError,
    TooManyRequestsError,
    UnknownTopicError,
)
from redelivery.messaging.codec import JSON, Message, check_json_body, check_json_text, encode
from redelivery.messaging.context import Role
from redelivery.messaging.producer import MIN_CONNECT_TIMEOUT, retrying
from redelivery.messaging.receipts import check_at
from redelivery.messaging.waiting import wake
from redelivery.rules.policies import EffectivePolicy
from redelivery.store import catalog, db, log
from redelivery.store import statements as S
from redelivery.store.log import LOG_SCHEMA

#: The errors PostgreSQL raises for a row a COPY refuses (an encoding, a bad JSON text or object, a
#: check constraint): the message is malformed, nothing was written.
ROW_REFUSALS = (psycopg.errors.DataError, psycopg.errors.CheckViolation)
logger = logging.getLogger(__name__)


class NeedPartition(Exception):
    """No partition of the log holds publish time ``at``: the publishing transaction rolls back,
    ``log.ensure_partition`` makes one, and the publish runs again."""

    def __init__(self, at: datetime):
        super().__init__(f"no partition of the log holds {at.isoformat()}")
        self.at = at


class UseCopy(Exception):
    """A small batch's publish wrote nothing, for the COPY path to answer: its batch id was
    published before (the COPY path compares the repeat), PostgreSQL refused a row (the COPY's
    error names the row), or no partition of the log holds its publish time yet."""


MAX_BATCH_ID_LENGTH = 200
#: A publish of at most this many messages, and bytes of bodies, is one statement
#: (PUBLISH_SMALL_BATCH: one or two round trips, no Arrow) rather than a COPY (twelve round trips, and
#: Arrow's encoding): a one-message publish took 5.8 ms through the COPY, most of a waiting
#: consumer's publish-to-handler latency (issue 42, docs/performance.md). Its columns go as array
#: parameters (the bodies in binary), held in memory at once: larger batches are the COPY's.
SMALL_BATCH_MESSAGES = 100
SMALL_BATCH_BYTES = 64 * 1024


def check_batch_id(batch_id: object) -> str:
    """Return ``batch_id`` if it is a non-empty str of at most 200 characters; else raise
    ``InvalidBatchIdError``."""
    if not isinstance(batch_id, str) or not 0 < len(batch_id) <= MAX_BATCH_ID_LENGTH or "\x00" in batch_id:
        raise InvalidBatchIdError(
            f"batch id {batch_id!r} is invalid: use a str of 1 to {MAX_BATCH_ID_LENGTH} characters"
        )
    return batch_id


def write_copy(conn: psycopg.Connection, statement: str, rows: Iterable[bytes]) -> None:
    """COPY ``rows`` (chunks of rows in the binary COPY format, ``copy_rows.encode_rows``) with
    ``statement``, between the format's header and trailer."""
    from redelivery.messaging.copy_rows import COPY_HEADER, COPY_TRAILER

    chunks = iter(rows)
    try:
        with conn.cursor().copy(statement) as copy:
            copy.write(COPY_HEADER)
            for chunk in chunks:
                copy.write(chunk)
            copy.write(COPY_TRAILER)
    finally:  # a generator of chunks read from another connection lets it go now, not at its GC
        getattr(chunks, "close", lambda: None)()


def check_repeated_batch(
    conn: psycopg.Connection, batch_id: str, topic_id: int, count: int, rows: Iterable[bytes]
) -> int:
    """Return the message count of batch ``batch_id``, published before, if it was published to
    ``topic_id`` with the content ``rows`` (``count`` messages in the binary COPY format); raise
    ``BatchConflictError`` if not: a batch id means one batch. The content goes into a temporary
    table, never into the log, for PostgreSQL to fingerprint it as it fingerprinted the batch."""
    topic, published_count, published, *_ = conn.execute(S.PUBLISHED_BATCH, {"batch": batch_id}).fetchone()
    if topic != topic_id:
        raise BatchConflictError(f"batch id {batch_id!r} was published to another topic (id {topic})")
    conn.execute(S.CREATE_REPEATED_CONTENT)
    if published is None:  # recorded before 0013 and its messages gone: its count is what is known
        content = f"{count}:(not compared)"
        same = published_count == count
    else:
        write_copy(conn, S.COPY_REPEATED_CONTENT, rows)
        content = conn.execute(S.REPEATED_FINGERPRINT).fetchone()[0]
        same = content == published
    if not same:
        raise BatchConflictError(
            f"batch id {batch_id!r} was published with other content ({published_count} messages, "
            f"fingerprint {published}; this batch: {content}): a batch id means one batch"
        )
    return published_count


def repeated_ids(conn: psycopg.Connection, batch_id: str, count: int) -> list[int]:
    """The ids of batch ``batch_id`` published again with the same content (``check_repeated_batch``
    passed, in this transaction), in the order of the repeat's messages. Raises
    ``BatchExpiredError`` when retention dropped its messages from the log."""
    ids = [r[0] for r in conn.execute(S.REPEATED_IDS, {"batch": batch_id})]
    if len(ids) == count:
        return ids
    _, _, _, first, last = conn.execute(S.PUBLISHED_BATCH, {"batch": batch_id}).fetchone()
    where = f"ids {first}..{last}, " if first is not None else ""
    raise BatchExpiredError(
        f"batch id {batch_id!r} was published before ({where}{count} messages) and its messages have "
        "left the log (retention.messages): nothing was published again, and its ids cannot be given again"
    )


def record_published_batch(
    conn: psycopg.Connection, topic_id: int, batch_id: str, floor: int, count: int, partition: str
) -> tuple[list[int], bool]:
    """Record the range and fingerprint of batch ``batch_id`` right after its COPY (its messages are
    the topic's past ``floor`` in ``partition``, the log's partition of their publish time); return
    (their ids, ascending; whether a consumer waits on the topic: ``messaging.waiting.wake`` it once
    this commits). ``PublishError`` (the transaction rolls back) unless ``count`` messages were
    written and the batch had no record of them yet."""
    statement = S.RECORD_PUBLISHED_BATCH.format(partition=sql.Identifier(LOG_SCHEMA, partition))
    recorded = conn.execute(statement, {"topic_id": topic_id, "batch": batch_id, "floor": floor}).fetchone()
    if recorded is None:
        raise PublishError(f"batch {batch_id!r}: its messages were recorded already; nothing was published")
    if recorded[0] != count:
        raise PublishError(f"batch {batch_id!r}: {count} messages to publish but {recorded[0]} written")
    return recorded[1], recorded[2]


@contextmanager
def refused_rows(describe: Callable[[int, str | None, psycopg.Error], str]) -> Iterator[None]:
    """Turn PostgreSQL's refusal of a row of a COPY (``ROW_REFUSALS``, naming the row in its
    context) into ``MalformedMessageError``: ``describe(row index, column or None, error)`` says
    which message and why. Raised inside the publishing transaction, which then rolls back."""
    from redelivery.messaging import copy_rows

    try:
        yield
    except ROW_REFUSALS as error:
        if isinstance(error, psycopg.errors.CheckViolation) and not error.diag.constraint_name:
            # no partition of the log takes the row: the one of its publish time is being detached
            # (older than retention.messages), which is not the message's fault
            raise PublishError(
                "no partition of the log takes this publish time: retention is dropping the partition "
                "that held it (older than retention.messages); publish at a later time "
                f"({error.diag.message_primary})"
            ) from None
        where = copy_rows.refused_row(error)
        if where is None:
            raise
        raise MalformedMessageError(describe(*where, error)) from None


def encoded_columns(messages: Iterable[Message | Any]) -> tuple[list, list, list, list]:
    """(keys, body bytes, content types, properties as JSON text) of messages to publish, each
    one checked (``codec.encode``: ``MalformedMessageError`` names its index)."""
    rows = [encode(m, i) for i, m in enumerate(messages)]
    return (
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [orjson.dumps(r[3]).decode() if r[3] else "{}" for r in rows],
    )


def _describe_refusal(columns: tuple) -> Callable[[int, str | None, psycopg.Error], str]:
    """What the API says of a row PostgreSQL refused: the message's index in the call, and for a
    JSON body that is not JSON, Python's reason (PostgreSQL's names no place in the text)."""
    from redelivery.messaging import copy_rows

    def describe(index: int, column: str | None, error: psycopg.Error) -> str:
        reason = copy_rows.refusal(error, column)
        if column is None and columns[2][index] == JSON:
            try:
                check_json_text(columns[1][index].decode())
            except (ValueError, RecursionError) as exc:
                reason = f"body is not valid {JSON}: {exc}"
        return f"message {index}: {reason}"

    return describe


def _committed(cursor: psycopg.Cursor | None) -> bool:
    """Whether the ``COMMIT`` that ``cursor`` sent in a pipeline was answered as a commit (a result
    is set on a cursor only when it succeeded; a COMMIT of a failed transaction answers ROLLBACK)."""
    result = cursor.pgresult if cursor is not None else None
    return result is not None and result.command_status == b"COMMIT"


def _rolled_back(conn: psycopg.Connection, error: BaseException) -> UseCopy | None:
    """After ``error`` in a small publish's pipeline: its transaction rolled back (unless the
    connection broke or is idle), and the ``UseCopy`` to raise when PostgreSQL refused a row
    (``ROW_REFUSALS``: the COPY's error names the message), else None (the caller re-raises)."""
    if not conn.broken and conn.info.transaction_status != pq.TransactionStatus.IDLE:
        conn.execute("ROLLBACK")
    if isinstance(error, ROW_REFUSALS):
        return UseCopy(f"PostgreSQL refused a message: {error.diag.message_primary}")
    return None


class Publisher(Role):
    """The publisher of a client (``Client.publisher``; ``Client.publish`` is its ``publish``).
    ``publish_waits``: the waits of the last publish's retries, seconds."""

    def __init__(self, context):
        super().__init__(context)
        self._sleep = time.sleep  # the producer retry's sleep (tests replace it)
        self.publish_waits: list[float] = []
        #: The log's partition the last publish at the database's time went into: the guess that
        #: lets the next small publish take one round trip (``_publish_in_one_trip``).
        self._partition: str | None = None
        #: {topic id: whether a consumer waited on it at the last publish}: the one round trip
        #: wakes them in its pipeline then (a statement that costs a publish with nobody waiting).
        self._waited: dict[int, bool] = {}

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

        Each item is a ``Message`` or a bare body. The rows go to PostgreSQL with one binary COPY.
        A batch id means one batch, published once: publishing it again with the same content
        returns the first publish's ids and adds nothing. With ``retry`` (the default), transient
        failures (lost connection, deadlock, flow control) are retried with the producer backoff
        of the config file (RocketMQ cloud, "Send retry and flow control") under a batch id made
        up for the call if none is given, so a retry after a commit whose answer was lost publishes
        nothing twice.

        Raises, with nothing written: ``UnknownTopicError``; ``MalformedMessageError`` (naming the
        message index: what the client checks, and what PostgreSQL refuses as the row is written,
        a JSON body that is not JSON among them); ``InvalidBatchIdError``; ``BatchConflictError``
        when the batch id was published to another topic or with other content;
        ``BatchTooLargeError`` when the batch is larger than a subscribed group's
        ``max_ready_backlog``. ``TooManyRequestsError`` (530) when a group's ready backlog would
        pass its cap, after the retries; the last transient ``psycopg.OperationalError`` when the
        attempts are used up. ``TypeError`` / ``ValueError`` for an ``at`` that is not a
        timezone-aware datetime of years 1970..9000 (``check_at``)."""
        check_at(at)
        self.context.topic_id(topic)  # UnknownTopicError before anything is encoded
        if batch_id is not None:
            check_batch_id(batch_id)
        columns = encoded_columns(messages)
        if not retry:
            return self._publish_once(topic, columns, batch_id, at)
        batch_id = batch_id or f"auto-{uuid.uuid4()}"
        self.publish_waits = []
        for attempt_ in retrying(
            self.config.producer, before_retry=self._before_publish_retry, sleep=self._sleep
        ):
            with attempt_:
                return self._publish_once(topic, columns, batch_id, at)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _before_publish_retry(self, retry_state) -> None:
        self.publish_waits.append(retry_state.upcoming_sleep)
        if self.conn.closed or self.conn.broken:
            self.context.conn = db.connect(self.url, autocommit=True, connect_timeout=MIN_CONNECT_TIMEOUT)

    def _publish_once(self, topic: str, columns: tuple, batch_id: str | None, at) -> list[int]:
        """One publish of the encoded ``columns``; a topic id this client keeps that no longer names
        ``topic`` (another process deleted it and made it again) is looked up again, once."""
        try:
            return self._publish_to(self.context.topic_id(topic), columns, batch_id, at)
        except UnknownTopicError:  # rolled back: nothing was written
            if not self.context.topic_renamed(topic):
                raise
            return self._publish_to(self.context.topic_id(topic), columns, batch_id, at)

    def _publish_to(self, topic_id: int, columns: tuple, batch_id: str | None, at) -> list[int]:
        count = len(columns[1])
        self._check_fits(topic_id, count)  # not transient: the retry loop lets it through at once
        batch_id = batch_id or f"auto-{uuid.uuid4()}"  # a repeat's rows are found by it
        for _ in range(3):  # a partition made for the publish time, then the publish again
            try:
                return self._publish_transaction(topic_id, columns, batch_id, at)
            except NeedPartition as need:  # rolled back: nothing was written
                log.ensure_partition(self.conn, need.at, self.config.retention.seconds("partition"))
            except log.PartitionChanged:  # retention dropped it while we waited: rolled back, again
                continue
        raise AssertionError("a partition of the log was made three times and is still missing")

    def _publish_transaction(self, topic_id: int, columns: tuple, batch_id: str, at) -> list[int]:
        """One try of a publish, in one transaction under the topic's publish lock: the batch
        claimed, the ready-backlog cap checked, the rows COPYed into the log, the batch's range and
        fingerprint recorded. Raises ``NeedPartition`` (rolled back) when no partition of the log
        holds the publish time, ``MalformedMessageError`` (rolled back) for a row PostgreSQL
        refuses."""
        from redelivery.messaging import (
            copy_rows,  # pyarrow: loaded by the first publish, not by every import
        )

        count = len(columns[1])
        if (
            0 < count <= SMALL_BATCH_MESSAGES
            and sum(map(len, columns[1])) <= SMALL_BATCH_BYTES
            and self.conn.info.transaction_status == pq.TransactionStatus.IDLE  # not in the caller's
        ):
            try:
                return self._publish_small(topic_id, columns, batch_id, at)
            except UseCopy:  # nothing was written: the COPY's way answers
                pass
        with self.conn.transaction():
            catalog.lock_topic_for_publish(self.conn, topic_id)
            claim = {"batch": batch_id, "topic_id": topic_id, "count": count, "at": at}
            published_at, partition = log.lock_partition_for_publish(self.conn, at)
            data = copy_rows.chunks(topic_id, published_at, columns)
            if self.conn.execute(S.CLAIM_PUBLISH_BATCH, claim).fetchone() is None:
                with refused_rows(_describe_refusal(columns)):
                    check_repeated_batch(self.conn, batch_id, topic_id, count, data)
                return repeated_ids(self.conn, batch_id, count)
            self._check_backlog(topic_id, count)
            if partition is None:
                raise NeedPartition(published_at)
            floor = self.conn.execute(S.ID_FLOOR).fetchone()[0]
            with refused_rows(_describe_refusal(columns)):  # each chunk encoded as the last one goes in
                write_copy(self.conn, S.COPY_MESSAGES, data)
            ids, waited = record_published_batch(self.conn, topic_id, batch_id, floor, count, partition)
        if waited:  # committed: the waiting consumers may receive them now
            wake(self.conn, [(topic_id, None, len(ids))])
        return ids

    def _publish_small(self, topic_id: int, columns: tuple, batch_id: str, at) -> list[int]:
        """One try of a small batch's publish: its messages and record written by one statement
        (PUBLISH_SMALL_BATCH) under the locks of the COPY path, in a pipeline of two round trips
        (the begin, the locks and the publish time; the statement and the commit). Raises as
        ``_publish_transaction``, and ``UseCopy`` (nothing written) when the COPY path must answer.
        Outside a transaction only: inside the caller's, the COPY path's savepoint joins it."""
        for index, (body, content_type) in enumerate(zip(columns[1], columns[2], strict=True)):
            if content_type == JSON:
                check_json_body(body, index)
        keys, bodies, content_types, properties = columns
        statement = {"topic_id": topic_id, "batch": batch_id, "at": at, "keys": keys, "bodies": bodies,
                     "content_types": content_types, "properties": properties}  # fmt: skip
        if at is None and self._partition is not None and not self._backlog_caps(topic_id):
            ids = self._publish_in_one_trip(topic_id, {**statement, "partition_name": self._partition})
            if ids is not None:
                return ids
            self._partition = None  # a new partition holds the time now: learnt below
        conn = self.conn
        # BEGIN and COMMIT by hand: psycopg's transaction() syncs the pipeline at each of its edges
        try:
            with conn.pipeline():
                conn.execute("BEGIN")
                topic = conn.execute(S.LOCK_TOPIC_FOR_PUBLISH, {"topic_id": topic_id})
                published_at, partition = log.lock_partition_for_publish(conn, at)  # the first round trip
                if topic.fetchone() is None:
                    raise UnknownTopicError(f"the topic (id {topic_id}) was deleted")
                try:
                    self._check_backlog(topic_id, len(bodies))  # a round trip per capped group
                except TooManyRequestsError:  # or a repeat, answered before the cap on the COPY's way
                    raise UseCopy("a ready-backlog cap would be passed") from None
                if partition is None:  # the COPY path claims the batch id before it makes one
                    raise UseCopy(f"no partition of the log holds {published_at.isoformat()} yet")
                published = conn.execute(S.PUBLISH_SMALL_BATCH, {**statement, "partition_name": partition})
                conn.execute("COMMIT")  # skipped after an error in the pipeline
                written, ids, waited, _ = published.fetchone()  # the second round trip
        except BaseException as error:
            if (use_copy := _rolled_back(conn, error)) is not None:
                raise use_copy from None
            raise
        if not written:  # nothing was written: the batch id was published before
            raise UseCopy(f"batch {batch_id!r} was published before")
        if at is None:
            self._partition = partition
        self._waited[topic_id] = waited
        if waited:  # committed: the waiting consumers may receive them now
            wake(conn, [(topic_id, None, len(ids))])
        return ids

    def _publish_in_one_trip(self, topic_id: int, statement: dict) -> list[int] | None:
        """A small batch at the database's time in one round trip, when the publish before went into
        ``statement["partition_name"]`` (a pipeline: the begin, the topic's publish lock, that
        partition's retirement lock, PUBLISH_SMALL_BATCH, the commit, and, when a consumer waited on
        the topic at the last publish, the wake of its waiting consumers in a transaction of its own
        after the commit; otherwise the wake is a round trip after it, only if one waits now). The
        ids; None, with nothing written, when that partition no longer holds the publish time.
        Raises ``UnknownTopicError`` (nothing written), ``UseCopy`` (nothing written: the batch id
        was published before, or PostgreSQL refused a message), and what the connection raises."""
        conn = self.conn
        count = len(statement["bodies"])
        lock = {"namespace": log.RETIRE_LOCK, "partition_name": statement["partition_name"]}
        wanted = {"topic_ids": [topic_id], "group_ids": [None], "counts": [count]}
        woken = self._waited.get(topic_id, False)
        committed = None
        try:
            with conn.pipeline():
                conn.execute("BEGIN")
                topic = conn.execute(S.LOCK_TOPIC_FOR_PUBLISH, {"topic_id": topic_id})
                conn.execute(S.LOCK_LOG_PARTITION_NAMED, lock)
                published = conn.execute(S.PUBLISH_SMALL_BATCH, statement)
                committed = conn.execute("COMMIT")  # skipped, as the wake is, after an error before it
                if woken:
                    conn.execute(S.NOTIFY_WAITERS, wanted)
        except BaseException as error:
            use_copy = _rolled_back(conn, error)
            if _committed(committed) and isinstance(error, psycopg.Error):  # the wake's, after the commit
                logger.warning("waiting consumers not woken (%s): they receive again within a second", error)
            elif use_copy is not None:
                raise use_copy from None
            else:
                raise
        written, ids, waited, placed = published.fetchone()
        if topic.fetchone() is None:
            raise UnknownTopicError(f"the topic (id {topic_id}) was deleted")
        if not placed:
            return None
        if not written:  # the batch id was published before
            raise UseCopy(f"batch {statement['batch']!r} was published before")
        self._waited[topic_id] = waited
        if waited and not woken:  # committed: the waiting consumers may receive them now
            wake(conn, [(topic_id, None, count)])
        return ids

    def _backlog_caps(self, topic_id: int) -> dict[int, EffectivePolicy]:
        """{group id: policy} of the topic's subscriptions with a ready-backlog cap, resolved once
        per topic. A subscription whose policy cannot be resolved has no known cap: it never blocks
        a publish (the tier runs report it)."""
        if topic_id not in self.context.caps:
            pairs = [(topic_id, g) for g in catalog.subscribed_groups(self.conn, topic_id)]
            policies = catalog.effective_policies(self.conn, self.config, pairs, problems={})
            self.context.caps[topic_id] = {
                g: p for (_, g), p in policies.items() if p.max_ready_backlog is not None
            }
        return self.context.caps[topic_id]

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
                    f"530 TOO_MANY_REQUESTS: topic {policy.topic!r} has {ready} messages waiting for group "
                    f"{policy.group!r}; {adding} more would pass its max_ready_backlog of "
                    f"{policy.max_ready_backlog}"
                )
