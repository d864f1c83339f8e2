"""The naming rules, in one place: topic and consumer group names, and queue names (DLQ and retry
names, which become table names).

A topic or group name is 1 to 56 letters, digits, ``_``, ``.`` or ``-``, starting with a letter
or digit: 56 so that ``%RETRY%<group>``, the longest queue name a group gets by default, fits
PostgreSQL's 63-byte identifiers. A queue name (``%DLQ%billing``, ``orders-billing-DLQ``,
``DLQ.orders``) is 1 to 63 of those characters or ``%``: it names a table in schema
``redelivery_dlq``. The schema's CHECK constraints repeat these rules (``migrations/``); a test
keeps the two equal.
"""

from __future__ import annotations

import re

from redelivery.errors import InvalidNameError

#: Topic and consumer group names (``re.fullmatch``: a trailing newline does not pass).
NAME_REGEX = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,55}"
#: DLQ and retry queue names: they name tables, so at most 63 bytes (PostgreSQL's NAMEDATALEN - 1).
QUEUE_NAME_REGEX = r"[A-Za-z0-9_.%-]{1,63}"
NAME_MAX_LENGTH = 56

_NAME = re.compile(NAME_REGEX)
_QUEUE_NAME = re.compile(QUEUE_NAME_REGEX)


def is_valid_name(name: object) -> bool:
    """Whether ``name`` is a valid topic or group name."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def check_name(kind: str, name: object) -> str:
    """Return ``name`` if it is a valid ``kind`` ("topic" or "group") name; else raise
    ``InvalidNameError`` saying the rule."""
    if not is_valid_name(name):
        raise InvalidNameError(
            f"{kind} name {name!r} is invalid: use 1 to {NAME_MAX_LENGTH} letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name  # type: ignore[return-value]


def is_valid_queue_name(name: object) -> bool:
    """Whether ``name`` can name a DLQ or retry queue (and so a table)."""
    return isinstance(name, str) and _QUEUE_NAME.fullmatch(name) is not None
