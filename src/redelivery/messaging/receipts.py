"""Receipts and outcomes, the checks every answer to a delivery shares (``ack``, ``nack`` /
``reconsume_later``, ``reject``, ``settle``, ``extend_lease``): which receipts, which error texts,
which retry; pure functions, nothing is read or written here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from redelivery.errors import ForeignReceiptError, InvalidLevelError
from redelivery.messaging.codec import ReceivedMessage
from redelivery.rules.levels import check_delay


@dataclass(frozen=True)
class Outcome:
    """How to answer one receipt in ``Client.settle``: ``"ack"``, ``"retry"`` (``delay`` in
    seconds or ``level``, else the next level) or ``"reject"``, with an optional error text."""

    receipt: Any
    outcome: str
    error: str | None = None
    delay: int | None = None
    level: int | None = None


_RECEIPT_ORDER = attrgetter("message_id", "delivery_count")


def receipts_of(group: str, messages, also: type | None = None) -> list:
    """The receipts, checked (``TypeError``, ``ForeignReceiptError``) and in message-id order: every
    statement then locks rows in the order the tier job's range scans do. ``ReceivedMessage``
    objects, or ``also`` instances (``Receipt`` tuples, for a lease extension)."""
    kinds = (ReceivedMessage,) if also is None else (ReceivedMessage, also)
    items = [messages] if isinstance(messages, kinds) and not isinstance(messages, list) else list(messages)
    for item in items:
        if not isinstance(item, kinds):
            raise TypeError(f"expected ReceivedMessage objects (from receive), got {type(item).__name__}")
        if item.group != group:
            raise ForeignReceiptError(
                f"message {item.message_id} was received by group {item.group!r}: "
                f"group {group!r} cannot answer for it"
            )
    return sorted(items, key=_RECEIPT_ORDER)


def int_array(values: Iterable[int]) -> str:
    """Integers as PostgreSQL's array text (``{1,2,3}``), for a ``%(x)s::bigint[]`` parameter: the
    server parses it in C, where psycopg would dump a Python list element by element (about a
    third of an ack's client time for 500 receipts)."""
    return "{" + ",".join(map(str, values)) + "}"


def check_error(error: object) -> str | None:
    """An error text as PostgreSQL can store it (``ValueError`` otherwise)."""
    if error is not None and (not isinstance(error, str) or "\x00" in error):
        raise ValueError(
            f"an error text must be a str without a NUL character (PostgreSQL cannot store it), got {error!r}"
        )
    return error


def error_texts(error: str | Sequence[str] | None, count: int) -> list[str | None]:
    if error is None or isinstance(error, str):
        return [check_error(error)] * count
    errors = [check_error(e) for e in error]
    if len(errors) != count:
        raise ValueError(f"got {len(errors)} errors for {count} messages")
    return errors


def retry_mode(delay: object = None, level: object = None) -> tuple[str, int, int]:
    """``(mode, delay seconds, level)`` of a retry after ``delay`` whole seconds or at delay
    ``level`` (Pulsar ``reconsumeLater`` / RocketMQ delay levels, seeds/000, seeds/003): mode
    ``"delay"``, ``"level"`` (n >= 1), ``"negative"`` (a negative level: dead-letter at once) or
    ``"next"`` (neither, or level 0: the policy's wait for the next retry). The one rule of
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
    ``InvalidDelayError`` (not 1..864000 whole seconds, Pulsar reconsumeLater, seeds/000),
    ``InvalidLevelError`` (not an int), each naming the message."""
    where = f"message {getattr(item.receipt, 'message_id', '?')}"
    try:
        check_error(item.error)
        if item.outcome == "ack":
            return ("ack", 0, 0)
        if item.outcome == "reject":
            return ("reject", 0, 0)
        if item.outcome != "retry":
            raise ValueError(f"unknown outcome {item.outcome!r}: use 'ack', 'retry' or 'reject'")
        return retry_mode(item.delay, item.level)
    except ValueError as exc:  # the same error, naming the message
        raise type(exc)(f"{where}: {exc}") from None
