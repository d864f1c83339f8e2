"""Leasing of the client (issue 39): ``receive`` and ``lease_rows``, the ordered receive's way
in, the lease's checks, and the undecodable path. Every delivery count is persisted before any
message is returned (Artemis, "Message redelivery and undelivered messages"); the answers to a
receipt are ``messaging.consuming``'s. A leased row is declared once, with ``ReceivedMessage``
(``rules.leased_row``)."""

from __future__ import annotations

import logging
from datetime import datetime

import psycopg

from redelivery.messaging.codec import BINARY, decode, received_properties
from redelivery.messaging.context import Role
from redelivery.messaging.ordered import lease_ordered
from redelivery.messaging.receipts import check_at, error_lookup, int_array, receipt_lookup
from redelivery.messaging.waiting import check_wait, release_left_behind, wait_for, waits_first
from redelivery.rules.failures import UNDECODABLE_CLASS, Failure
from redelivery.rules.leased_row import RECEIVE_COLUMNS, ReceivedMessage, row_values
from redelivery.rules.policies import MAX_INT
from redelivery.store import catalog, db
from redelivery.store import statements as S

#: Lease bounds in seconds (ours; RocketMQ's SimpleConsumer takes an invisible duration per receive).
MIN_INVISIBLE_SECONDS, MAX_INVISIBLE_SECONDS = 1, 43_200
#: The attempt history's outcome of a delivery whose body did not decode.
UNDECODABLE_OUTCOME = "undecodable"
__all__ = ["Receiver", "RECEIVE_COLUMNS", "check_lease", "MIN_INVISIBLE_SECONDS", "MAX_INVISIBLE_SECONDS"]
log = logging.getLogger(__name__)


def check_lease(max_messages, invisible_duration) -> None:
    """Raise ``ValueError`` unless ``max_messages`` is an int of 1..2**31-1 and
    ``invisible_duration`` a number of seconds in ``MIN_INVISIBLE_SECONDS``..``MAX_INVISIBLE_SECONDS``
    (bools refused)."""
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


class Receiver(Role):
    """The leasing role of a client (``Client.receiver``; ``Client`` offers ``receive`` and
    ``lease_rows`` as its own)."""

    def receive(
        self,
        group: str,
        topic: str,
        max_messages: int = 32,
        invisible_duration: float = 60,
        at: datetime | None = None,
        wait_seconds: float = 0,
    ) -> list[ReceivedMessage]:
        """Claim up to ``max_messages`` READY messages of ``topic`` for ``group``, oldest first.

        :param group: the consumer group.
        :param topic: the topic it subscribes.
        :param max_messages: at most this many messages (1..2**31-1).
        :param invisible_duration: the lease in seconds (1..43200); unacknowledged past it, a
            message counts as a failed delivery.
        :param at: the call's time instead of now (tests, backfills).
        :param wait_seconds: with nothing to receive, wait up to this many seconds (0..20, SQS's
            ``WaitTimeSeconds``) for a message to become receivable, and return it as soon as it
            is (``messaging.waiting``: woken by the publish, tier run or redrive that made it so,
            and receiving again at least every second); 0 returns at once.

        The incremented delivery count is committed before this returns. A message whose body
        cannot be decoded (JSON that PostgreSQL stores but Python refuses: nesting deeper than the
        interpreter allows, integers over 4300 digits) is dead-lettered with reason UNDECODABLE
        before this returns, so that nothing is left in flight for a message the caller does not
        get (a crash in between leaves it in flight until its lease ends). Raises
        ``UnknownGroupError``, ``UnknownTopicError``, ``NotSubscribedError``, ``ValueError``
        (max_messages < 1, a lease or a wait out of range), what ``check_at`` raises for a bad
        ``at``."""
        wait = check_wait(wait_seconds, self.conn)  # a wait asks at its first re-check
        return self._receive(group, topic, max_messages, invisible_duration, at, wait, recheck=not wait)

    def _receive(
        self, group: str, topic: str, max_messages, invisible_duration, at, wait: float, recheck: bool
    ) -> list[ReceivedMessage]:
        """``receive`` of checked arguments. ``recheck``: when nothing was leased, ask whether the
        topic was made again elsewhere or the subscription with the other ordering (two statements
        an empty receive costs): a receive that waits asks at each re-check of its wait (at least
        every ``waiting.RECHECK_SECONDS``), not before it waits nor when woken (a notification is
        sent for the topic and subscription it waits on)."""
        group_id, topic_id, params = self._lease_params(group, topic, max_messages, invisible_duration, at)
        policy, table = self.context.policy(topic_id, group_id, topic, group)  # NotSubscribedError
        wait_now = lambda again: self._receive(  # noqa: E731
            group, topic, max_messages, invisible_duration, at, 0, again
        )
        if (first := self._wait_first(topic_id, group_id, wait, wait_now)) is not None:
            return first

        while True:
            rows = self._leased(params, recheck)
            if not rows and recheck and self.context.topic_renamed(topic):  # made again elsewhere
                return self._receive(group, topic, max_messages, invisible_duration, at, wait, recheck)
            out, bad = _decode_received(rows, group, topic, policy.retry_name)
            dead = bool(bad) and self._undecodable(bad, group, group_id, table, at)
            # a batch of undecodable messages only, dead letters now: the next ones may not be (when
            # they could not be dead-lettered, the receive ends: they stay in flight)
            if out or not dead:
                break
        if not out and wait:  # nothing: wait for the next
            return wait_for(self.context, topic_id, group_id, wait, wait_now)
        return out

    def _wait_first(self, topic_id: int, group_id: int, wait: float, wait_now) -> list | None:
        """Before a lease: what a cut-short wait left held released; then, when the lease may wait
        and the subscription's last one found nothing at once, its wait (which receives once it
        said it waits: ``waiting.waits_first``); None when the lease receives first."""
        release_left_behind(self.context)
        if wait and waits_first(self.context, topic_id, group_id):
            return wait_for(self.context, topic_id, group_id, wait, wait_now)
        return None

    def _undecodable(self, bad: list[tuple], group: str, group_id: int, table: dict, at) -> bool:
        """Dead-letter the undecodable deliveries ``bad`` of a receive (True); when that fails, they
        stay in flight until their lease ends (the lease is committed: the receive hands out the
        rest), and False."""
        try:
            self._dead_letter_undecodable(bad, group_id, table, at)
        except psycopg.Error as exc:
            log.warning(
                "%d undecodable messages of group %r stay in flight until their lease ends (%s)",
                len(bad), group, exc,
            )  # fmt: skip
            return False
        return True

    def lease_rows(
        self,
        group: str,
        topic: str,
        max_messages: int,
        invisible_duration: float,
        at: datetime | None = None,
        wait_seconds: float = 0,
    ) -> list[dict]:
        """``receive`` for DataFrames: the leased messages as dicts of plain values keyed by the
        leased row's fields (``rules.leased_row``: the leased DataFrame's columns, ``delay_level``
        and ``invisible_until`` besides), bodies not decoded (``body``: the text of a JSON or text
        body; ``body_binary``: the bytes of a binary one), ``properties`` a list of (name, value).
        Committed before this returns; same arguments and errors as ``receive``."""
        wait = check_wait(wait_seconds, self.conn)  # a wait asks at its first re-check
        return self._lease_rows(group, topic, max_messages, invisible_duration, at, wait, recheck=not wait)

    def _lease_rows(
        self, group: str, topic: str, max_messages, invisible_duration, at, wait: float, recheck: bool
    ) -> list[dict]:
        """``lease_rows`` of checked arguments; ``recheck`` as ``_receive``'s."""
        group_id, topic_id, params = self._lease_params(group, topic, max_messages, invisible_duration, at)
        policy = self.context.effective_policy(topic_id, group_id, topic, group)
        wait_now = lambda again: self._lease_rows(  # noqa: E731
            group, topic, max_messages, invisible_duration, at, 0, again
        )
        if (first := self._wait_first(topic_id, group_id, wait, wait_now)) is not None:
            return first

        rows = self._leased(params, recheck)
        if not rows and recheck and self.context.topic_renamed(topic):  # made again elsewhere: its new id
            return self._lease_rows(group, topic, max_messages, invisible_duration, at, wait, recheck)
        if not rows and wait:
            return wait_for(self.context, topic_id, group_id, wait, wait_now)
        leased = []
        for row in rows:
            values = row_values(row, group, topic)
            body, binary = bytes(values["body"]), values["content_type"] == BINARY
            properties = received_properties(
                values["properties"], values["reconsume_times"], values["origin_message_id"], topic,
                policy.retry_name,
            )  # fmt: skip
            values.update(
                properties=list(properties.items()),
                body=None if binary else body.decode("utf-8", errors="replace"),
                body_binary=body if binary else None,
            )  # fmt: skip
            leased.append(values)
        return leased

    def _lease_params(
        self, group: str, topic: str, max_messages, invisible_duration, at
    ) -> tuple[int, int, dict]:
        """(group id, topic id, the parameters of ``RECEIVE``) of a lease, every argument checked
        (``receive`` and ``lease_rows`` alike)."""
        group_id, _ = self.context.group(group)
        topic_id = self.context.topic_id(topic)
        check_lease(max_messages, invisible_duration)
        check_at(at)
        params = {
            "group_id": group_id,
            "topic_id": topic_id,
            "max_messages": max_messages,
            "invisible_duration": float(invisible_duration),
            "at": at,
        }
        return group_id, topic_id, params

    def _leased(self, params: dict, recheck: bool = True) -> list[tuple]:
        """The rows ``RECEIVE`` leased, as tuples of ``RECEIVE_COLUMNS``. One statement outside any
        transaction of ours: it commits before its answer arrives (psycopg returns once PostgreSQL
        reported the statement's transaction ended), so the delivery counts are persisted before a
        caller sees a message, and the subscription row is locked only while it runs, not while
        the rows travel and are decoded. Results in PostgreSQL's binary format: bodies arrive as
        their bytes, not as hex text. A deadlock victim (a topic being deleted) runs again. An
        ordered subscription's: ``messaging.ordered.lease_ordered``, committed before the rows
        return too. Nothing leased and ``recheck``: the subscription's ordering is asked again by
        the next lease (it may have been made again with the other)."""
        key = (params["topic_id"], params["group_id"])

        def lease() -> list[tuple]:
            with self.conn.cursor(binary=True) as cursor:
                return cursor.execute(S.RECEIVE, params).fetchall()

        if self.context.is_ordered(*key):
            rows, self.context.free_shares[key] = lease_ordered(
                self.conn, params, self.context.free_shares.get(key, 1.0)
            )
        else:
            rows = db.retry_lock_conflicts(lease)
        if not rows and recheck:  # the subscription may have been made again with the other ordering
            self.context.ordered.pop(key, None)
        return rows

    def _dead_letter_undecodable(self, bad: list[tuple], group_id: int, table: dict, at) -> None:
        """Dead-letter the deliveries ``bad`` (message id, delivery count, error) just leased, reason
        UNDECODABLE, before ``receive`` returns: one transaction after the lease's, guarded by the
        receipts as any answer is. A crash between the two leaves them in flight until their lease
        ends, as a consumer's crash would."""
        catalog.ensure_dlq_tables(self.conn, {table["p_dlq"][0]})
        params = {
            **table,
            "group_id": group_id,
            "topic_id": table["p_topic"][0],
            "at": at,
            "dead_lettered_at": at,
            "outcome": UNDECODABLE_OUTCOME,
        }
        params.update(reason="UNDECODABLE", force_dead_letter=True, level=None, delay=None)
        params.update(
            ids=int_array(b[0] for b in bad),
            receipts=receipt_lookup((b[0], b[1], params["topic_id"]) for b in bad),
            errors=error_lookup((b[0] for b in bad), (Failure(b[2], UNDECODABLE_CLASS) for b in bad)),
        )

        def dead_letter() -> None:
            with self.conn.transaction():
                dead = sum(row[2] for row in self.conn.execute(S.FAIL_DEAD_LETTER, params, prepare=False))
                catalog.add_group_totals(self.conn, dead_lettered={group_id: dead})

        db.retry_lock_conflicts(dead_letter)


def _decode_received(rows, group, topic, retry_topic) -> tuple[list[ReceivedMessage], list[tuple]]:
    """ReceivedMessages of the leased rows (tuples of ``RECEIVE_COLUMNS``) whose body decodes, and
    (id, delivery count, error) of those whose body does not."""
    out, bad = [], []
    for row in rows:
        values = row_values(row, group, topic)
        try:
            values["body"] = decode(values["body"], values["content_type"])
        except (ValueError, RecursionError) as exc:
            error = f"body is not decodable as {values['content_type']}: {type(exc).__name__}: {exc}"
            bad.append((values["message_id"], values["delivery_count"], error[:1000]))
            continue
        values["properties"] = received_properties(
            values["properties"], values["reconsume_times"], values["origin_message_id"], topic, retry_topic
        )
        out.append(ReceivedMessage.of(values))
    return out, bad
