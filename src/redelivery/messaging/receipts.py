"""Receipts and outcomes, the checks every answer to a delivery shares (``ack``, ``nack`` /
``reconsume_later``, ``reject``, ``settle``, ``extend_lease``): which receipts, which error texts,
which retry; and the check of the ``at`` every timed client call takes (``check_at``). Pure
functions, nothing is read or written here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

import orjson
import psycopg

from redelivery.errors import ForeignReceiptError, InvalidLevelError
from redelivery.messaging.codec import ReceivedMessage
from redelivery.rules.failures import Failure, describe
from redelivery.rules.levels import check_delay

#: The SQLSTATE of an answering statement that refused a receipt of another topic (migration 0024).
FOREIGN_RECEIPT_STATE = "RD001"


def foreign_receipt(message_id: int | str, topic: str) -> str:
    """The text of ``ForeignReceiptError`` for a receipt naming ``topic`` for message ``message_id``,
    which is not a message of that topic."""
    return (
        f"message {message_id} is not a message of topic {topic!r} (another topic's, or never "
        "handed to the group): a receipt naming another topic cannot answer for it"
    )


@contextmanager
def refusing_foreign_receipts() -> Iterator[None]:
    """Turn an answering statement's refusal of a receipt of another topic (SQLSTATE
    ``FOREIGN_RECEIPT_STATE``, its DETAIL the message id and the topic, tab-separated; the
    statement was undone) into ``ForeignReceiptError``."""
    try:
        yield
    except psycopg.Error as error:
        if error.sqlstate != FOREIGN_RECEIPT_STATE:
            raise
        message_id, topic = (error.diag.message_detail or "?\t?").split("\t", 1)
        raise ForeignReceiptError(foreign_receipt(message_id, topic)) from None


@dataclass(frozen=True)
class Outcome:
    """How to answer one receipt in ``Client.settle``: ``"ack"``, ``"retry"`` (``delay`` in
    seconds or ``level``, else the next level) or ``"reject"``, with an optional error: a text or
    the exception itself (its class, top frame and stack are kept: ``rules.failures``)."""

    receipt: Any
    outcome: str
    error: str | BaseException | None = None
    delay: int | None = None
    level: int | None = None


_RECEIPT_ORDER = attrgetter("message_id", "delivery_count")
#: A receipt's numbers: a message id is a bigint from ``message_ids`` (which starts at 1), a
#: delivery count an int4 of at least 1 (the first delivery's).
MAX_MESSAGE_ID, MAX_DELIVERY_COUNT = 2**63 - 1, 2**31 - 1
#: The times ``at`` may give (``check_at``): from the Unix epoch (nothing redelivery keeps is
#: older) to the end of year 9000, so that every time computed from one (a lease end, a retry's due
#: time, up to 10 days later; a partition's end) stays far inside Python's datetime (year 9999) and
#: PostgreSQL's timestamptz when it is read back.
MIN_AT, MAX_AT = datetime(1970, 1, 1, tzinfo=UTC), datetime(9001, 1, 1, tzinfo=UTC)


def _is_int(value: object) -> bool:
    """An int, not a bool (nor another subclass: a receipt's numbers are plain ints). Run for every
    receipt of every answer: ``type() is`` is the cheapest test."""
    return type(value) is int


def _shown(value: object) -> str:
    """``value``'s repr on one line, at most 60 characters."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def check_at(at: object) -> datetime | None:
    """Return ``at`` (``None``: the database's clock) if it is a timezone-aware ``datetime`` of
    years 1970 to 9000 (``MIN_AT`` <= at < ``MAX_AT``, in any timezone); else raise ``TypeError``
    (not a datetime: a ``date``, a string, a number) or ``ValueError`` (naive, or out of those
    years), one line naming the argument. The check of every client call taking ``at``."""
    if at is None:
        return None
    if not isinstance(at, datetime):
        raise TypeError(f"at must be a timezone-aware datetime or None, got {_shown(at)}")
    if at.utcoffset() is None:
        raise ValueError(
            f"at must be a timezone-aware datetime (a naive one has no time zone), got {_shown(at)}"
        )
    if not MIN_AT <= at < MAX_AT:
        raise ValueError(f"at must be a datetime from 1970 to 9000, got {_shown(at)}")
    return at


def check_receipt(receipt: Any) -> None:
    """Raise unless ``receipt``'s ``message_id`` is an int (not a bool) of 1..2**63-1 (bigint) and
    its ``delivery_count`` one of 1..2**31-1 (int4): ``TypeError`` for another type, ``ValueError``
    out of range, one line naming the field (and the message, when its id is good)."""
    message_id, count = receipt.message_id, receipt.delivery_count
    if not _is_int(message_id) or not 1 <= message_id <= MAX_MESSAGE_ID:
        error = ValueError if _is_int(message_id) else TypeError
        raise error(
            f"a receipt's message_id must be an int from 1 to {MAX_MESSAGE_ID}, got {_shown(message_id)}"
        )
    if not _is_int(count) or not 1 <= count <= MAX_DELIVERY_COUNT:
        error = ValueError if _is_int(count) else TypeError
        raise error(
            f"message {message_id}: a receipt's delivery_count must be an int from 1 to "
            f"{MAX_DELIVERY_COUNT}, got {_shown(count)}"
        )


def receipts_of(group: str, messages, also: type | None = None) -> list:
    """The receipts, checked (``TypeError``, ``ValueError``: ``check_receipt``;
    ``ForeignReceiptError``) and in message-id order: every statement then locks rows in the order
    the tier job's range scans do. ``ReceivedMessage`` objects, or ``also`` instances (``Receipt``
    tuples, for a lease extension)."""
    kinds = (ReceivedMessage,) if also is None else (ReceivedMessage, also)
    items = [messages] if isinstance(messages, kinds) and not isinstance(messages, list) else list(messages)
    for item in items:
        if not isinstance(item, kinds):
            raise TypeError(f"expected ReceivedMessage objects (from receive), got {type(item).__name__}")
        check_receipt(item)
        if item.group != group:
            raise ForeignReceiptError(
                f"message {item.message_id} was received by group {item.group!r}: "
                f"group {group!r} cannot answer for it"
            )
    return sorted(items, key=_RECEIPT_ORDER)


def int_array(values: Iterable[int]) -> str:
    """Integers as PostgreSQL's array text (``{1,2,3}``), for a ``%(x)s::bigint[]`` parameter: the
    server parses it in C, where psycopg would dump a Python list element by element (about a
    third of an ack's client time for 500 receipts). Only ints (not bools) make array text:
    ``TypeError`` for anything else (a str ``"5,6"`` would be two elements)."""
    items = list(values)
    if not all(type(value) is int for value in items):
        wrong = next(value for value in items if type(value) is not int)
        raise TypeError(f"array text is made of ints only: {_shown(wrong)} is not an int")
    return "{" + ",".join(map(int.__repr__, items)) + "}"


def receipt_lookup(receipts: Iterable[tuple[int, int, int]]) -> str:
    """Receipts ``(message id, delivery count, topic id)`` as the JSON object the answering
    statements look each delivery row up in: ``{"<message id>": ["<delivery count>:<topic id>",
    ...]}`` (a message named twice keeps both). A lookup, not a relation to join: see
    ``statements._shared._ANSWERS_RECEIPT``."""
    lookup: dict[int, list] = {}
    for message_id, count, topic_id in receipts:
        answer = f"{count}:{topic_id}"
        if message_id in lookup:
            lookup[message_id].append(answer)
        else:
            lookup[message_id] = [answer]
    return orjson.dumps(lookup, option=orjson.OPT_NON_STR_KEYS).decode()  # int keys as "<id>"


def error_lookup(message_ids: Iterable[int], failures: Iterable[Failure | None]) -> str:
    """The failure of each message id as a JSON object (``{"<message id>": {"error", "class",
    "frame", "stack"} or null}``), the answering statements' ``errors``."""
    return orjson.dumps(
        {i: f.as_json() if f is not None else None for i, f in zip(message_ids, failures, strict=True)},
        option=orjson.OPT_NON_STR_KEYS,
    ).decode()


def failures_of(error: object, count: int) -> list[Failure | None]:
    """The ``Failure`` of each of ``count`` messages from a call's ``error``: one text or exception
    (or None) for all, or a sequence of them, one per message. Raises ``ValueError`` (what
    ``failures.describe`` refuses, or not one per message)."""
    if error is None or isinstance(error, str | BaseException):
        return [describe(error)] * count
    found = [describe(e) for e in error]
    if len(found) != count:
        raise ValueError(f"got {len(found)} errors for {count} messages")
    return found


def retry_mode(delay: object = None, level: object = None) -> tuple[str, int, int]:
    """``(mode, delay seconds, level)`` of a retry after ``delay`` whole seconds or at delay
    ``level``, Pulsar's ``reconsumeLater`` / RocketMQ's delay levels (TDMQ Pulsar, "Message retry
    and dead-letter mechanism"; RocketMQ broker, "RocketMQ message retry"): mode ``"delay"``,
    ``"level"`` (n >= 1), ``"negative"`` (a negative level: dead-letter at once) or ``"next"``
    (neither, or level 0: the policy's wait for the next retry). The one rule of
    ``reconsume_later`` and of a ``settle`` retry. Raises ``ValueError`` (both given),
    ``InvalidDelayError`` (not 1..864000 whole seconds), ``InvalidLevelError`` (not an int)."""
    if delay is not None and level is not None:
        raise ValueError("give a delay or a level, not both")
    if delay is not None:
        return ("delay", check_delay(delay), 0)
    if level is None:
        return ("next", 0, 0)
    if not isinstance(level, int) or isinstance(level, bool):
        raise InvalidLevelError(f"delay level {level!r} is not an integer")
    if level < 0:
        return ("negative", 0, 0)
    return ("level", 0, level) if level > 0 else ("next", 0, 0)


def plan_outcome(item: Outcome) -> tuple[str, int, int]:
    """``(mode, delay seconds, level)`` of one ``settle`` outcome, mode being ``"ack"`` or a failure
    mode of ``Client._fail`` (``"reject"``, ``"delay"``, ``"level"``, ``"negative"``, ``"next"``).
    Raises ``ValueError`` (an unknown outcome, both a delay and a level, a bad error text),
    ``InvalidDelayError`` (not 1..864000 whole seconds, Pulsar's reconsumeLater range),
    ``InvalidLevelError`` (not an int), each naming the message."""
    where = f"message {getattr(item.receipt, 'message_id', '?')}"
    try:
        describe(item.error)
        if item.outcome == "ack":
            return ("ack", 0, 0)
        if item.outcome == "reject":
            return ("reject", 0, 0)
        if item.outcome != "retry":
            raise ValueError(f"unknown outcome {item.outcome!r}: use 'ack', 'retry' or 'reject'")
        return retry_mode(item.delay, item.level)
    except ValueError as exc:  # the same error, naming the message
        raise type(exc)(f"{where}: {exc}") from None
