"""Messages as callers see them: what a producer publishes (``Message``), what a consumer receives
(``ReceivedMessage``, declared with the leased row in ``rules.leased_row``), and how bodies and
properties are stored (``encode``) and read back (``decode``). Also the reserved retry property
names."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from redelivery.errors import MalformedMessageError
from redelivery.rules.leased_row import ReceivedMessage  # noqa: F401  (declared with the leased row)
from redelivery.rules.words import COUNTED_STATES

JSON = "application/json"
BINARY = "application/octet-stream"
TEXT = "text/plain"
CONTENT_TYPES = (JSON, BINARY, TEXT)
#: The states a subscription's messages are counted in (``redelivery.rules.words``, where every
#: state is declared).
STATES = COUNTED_STATES
#: Properties set on a redelivered message, Pulsar's retry letter (TDMQ Pulsar, "Message retry and
#: dead-letter mechanism"); publishers may not set them.
RETRY_PROPERTIES = ("REAL_TOPIC", "ORIGIN_MESSAGE_ID", "RETRY_TOPIC", "RECONSUMETIMES")
# A \u0000 escape (preceded by an even number of backslashes): PostgreSQL's jsonb cannot store it.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


#: PostgreSQL's numeric (which jsonb numbers are): at most 131,072 digits before the decimal point
#: and 16,383 after it.
PG_NUMERIC_MAX_INTEGER_DIGITS, PG_NUMERIC_MAX_SCALE = 131_072, 16_383


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON (PostgreSQL refuses it)")


def _pg_number(text: str) -> Decimal:
    number = Decimal(text)
    scale = -number.as_tuple().exponent
    if scale > PG_NUMERIC_MAX_SCALE or number.adjusted() + 1 > PG_NUMERIC_MAX_INTEGER_DIGITS:
        raise ValueError(f"the number {text[:40]}... is outside PostgreSQL's numeric range")
    return number


def _check_strings(value: Any) -> None:
    """Raise ``ValueError`` for a string holding a lone surrogate (an unpaired \\ud800-\\udfff
    escape: not UTF-8, PostgreSQL refuses it)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            item.encode()  # UnicodeEncodeError (a ValueError) for a lone surrogate
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def check_json_text(text: str) -> None:
    """Raise ``ValueError`` unless PostgreSQL's jsonb would take ``text`` as Python reads it: valid
    JSON, no NaN or Infinity, no lone surrogate, no \\u0000 escape, numbers within numeric's range.
    (Nesting deeper than Python's recursion limit is refused too, where PostgreSQL may take it.)"""
    try:  # orjson: strict JSON, several times faster. What it takes, jsonb takes too, except the
        # \u0000 escape and numbers past numeric's range: a literal longer than 16,383 characters,
        # or a negative exponent (orjson reads 1e-20000 as 0.0; a positive one past 308 fails it)
        orjson.loads(text)
        strict = len(text) <= PG_NUMERIC_MAX_SCALE and "e-" not in text and "E-" not in text
    except orjson.JSONDecodeError:  # big numbers, lone surrogates, deep nesting: look closer
        strict = False
    if not strict:
        value = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_pg_number, parse_int=_pg_number
        )
        _check_strings(value)
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise ValueError("a \\u0000 character cannot be stored in PostgreSQL's jsonb")


#: What only jsonb refuses in a JSON text that PostgreSQL's ``IS JSON`` takes (a publish looks for it
#: a chunk of bodies at a time: ``copy_rows.check_json_bodies``): a \u0000 escape, an escape of half
#: a surrogate pair (\ud800-\udfff, paired or not), and a number past numeric's range, which needs
#: an exponent of four digits or more or a text of more than 15,000 characters (with an exponent
#: under 1,000, a number needs over 15,000 digits to pass numeric's 16,383 after the point).
JSONB_HAZARD = re.compile(r"\\u(?:0000|[dD][89a-fA-F])|[eE][-+]?[0-9]{4}")
JSONB_SAFE_LENGTH = 15_000
#: Brackets a text may hold before it could nest deeper than Python decodes (orjson stops at 1,024
#: levels, the json module at the interpreter's recursion limit): a body a consumer could not read.
SAFE_BRACKETS = 500
_JSONB_HAZARD_BYTES = re.compile(JSONB_HAZARD.pattern.encode())


def check_json_body(body: bytes, index: int) -> None:
    """Raise ``MalformedMessageError`` naming message ``index`` for a JSON body that holds what only
    jsonb refuses or nests deeper than Python decodes: ``copy_rows.check_json_bodies`` for one body,
    for a batch too small to be worth Arrow. Only a body that may (``JSONB_HAZARD``, its length, its
    brackets) is decoded."""
    suspect = (
        len(body) > JSONB_SAFE_LENGTH
        or _JSONB_HAZARD_BYTES.search(body) is not None
        or (len(body) > SAFE_BRACKETS and body.count(b"[") + body.count(b"{") > SAFE_BRACKETS)
    )
    if not suspect:
        return
    try:
        check_json_text(body.decode())
    except (ValueError, RecursionError) as exc:
        raise MalformedMessageError(f"message {index}: body is not valid {JSON}: {exc}") from None


#: The properties of a message published without any (shared: it cannot change).
NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})
_set_field = object.__setattr__


@dataclass(frozen=True, init=False, slots=True)
class Message:
    """A message to publish. ``body``: ``bytes`` (stored as application/octet-stream), or any
    JSON-serialisable value (application/json); with ``content_type="application/json"`` a ``str``
    body is taken as JSON text and must parse; with ``"text/plain"`` a ``str`` is stored as text.
    ``key``: a ``str``; ``properties``: string keys and string values. PostgreSQL stores neither a
    NUL character nor a lone surrogate (not UTF-8) in any of them."""

    body: Any
    key: str | None = None
    properties: Mapping[str, str] = field(default_factory=lambda: NO_PROPERTIES)
    content_type: str | None = None

    # A producer makes one per message (336,776 for the demo's flights): slots and no dict of its
    # own when it has no properties make it a third of a frozen dataclass's cost, mostly in the
    # garbage collector's passes over every object a batch holds.
    def __init__(
        self,
        body: Any,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        content_type: str | None = None,
    ):
        _set_field(self, "body", body)
        _set_field(self, "key", key)
        _set_field(self, "properties", NO_PROPERTIES if properties is None else properties)
        _set_field(self, "content_type", content_type)

    def __reduce__(self):  # pickle and deepcopy through the constructor (a mappingproxy pickles not)
        properties = None if self.properties is NO_PROPERTIES else self.properties
        return Message, (self.body, self.key, properties, self.content_type)


class Receipt(NamedTuple):
    """A receipt without the message: the delivery ``delivery_count`` of ``message_id`` to
    ``group`` (``Client.settle``, ``Client.extend_lease``, ``spark.dataframes.settle``).
    ``message_id``: an int of 1..2**63-1 (bigint); ``delivery_count``: an int of 1..2**31-1
    (int4); not bools. A tuple checks nothing itself: the calls taking receipts refuse any other
    value before anything changes (``messaging.receipts.check_receipt``: ``TypeError`` /
    ``ValueError``)."""

    message_id: int
    delivery_count: int
    topic: str
    group: str


_BYTES_LIKE = (bytes, bytearray, memoryview)


def encode(message: Message | Any, index: int = 0) -> tuple[str | None, bytes, str, dict]:
    """``(key, body bytes, content type, properties)`` of a message to publish (a ``Message`` or a
    bare body). Raises ``MalformedMessageError`` naming the message ``index`` and the field (body,
    key, a property) when PostgreSQL could not store it as given."""
    # Run once per published message (336,776 times for the demo's flights): the common shapes (a
    # JSON text body, no properties, an ASCII key) take the shortest path; properties are only
    # copied and checked when there are some, and a text is encoded to find a lone surrogate only
    # when it is not ASCII.
    if isinstance(message, Message):
        body, key, properties, ctype = message.body, message.key, message.properties, message.content_type
    else:
        body, key, properties, ctype = message, None, None, None
    if ctype is None:
        ctype = BINARY if isinstance(body, _BYTES_LIKE) else JSON
    try:
        raw = _encode_body(body, ctype, index)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
        if isinstance(exc, MalformedMessageError):
            raise
        raise MalformedMessageError(f"message {index}: body is not valid {ctype}: {exc}") from exc
    if properties is None or properties is NO_PROPERTIES or (type(properties) is dict and not properties):
        props = {}
    else:
        props = _checked_properties(properties, index)
    if key is not None:
        if not isinstance(key, str):
            raise MalformedMessageError(f"message {index}: key must be a str, got {type(key).__name__}")
        if not key.isascii() or "\x00" in key:  # the common key (ASCII, no NUL) is one C scan
            _check_text(key, f"message {index}: key")
    return key, raw, ctype, props


def _check_text(text: str, what: str) -> None:
    """``MalformedMessageError`` naming ``what`` unless PostgreSQL's text (and jsonb) can hold
    ``text``: no NUL, no lone surrogate (\\ud800-\\udfff unpaired: not UTF-8). The message
    shows the character escaped, so it prints anywhere."""
    if "\x00" in text:
        raise MalformedMessageError(
            f"{what} has a \\u0000 character at character {text.index(chr(0))}, which PostgreSQL cannot store"
        )
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise MalformedMessageError(
            f"{what} has a lone surrogate ({text[exc.start]!r}) at character {exc.start}: "
            "not UTF-8, which PostgreSQL cannot store"
        ) from None


def _encode_body(body: Any, ctype: str, index: int) -> bytes:
    """The stored bytes of a body of content type ``ctype``; see ``Message``. A JSON text is taken
    as it is: a publish checks a chunk's texts at once for what only jsonb refuses
    (``copy_rows.check_json_bodies``), and PostgreSQL that they are JSON as it writes them."""
    if ctype == JSON:
        if isinstance(body, str):
            return body.encode()  # UnicodeEncodeError (a ValueError) for a lone surrogate
        if isinstance(body, bytes):
            body.decode()  # UTF-8, or a ValueError
            return body
        text = json.dumps(body, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
        if "\\u0000" in text:
            check_json_text(text)
        return text.encode()
    if ctype == BINARY:
        if not isinstance(body, _BYTES_LIKE):
            raise MalformedMessageError(
                f"message {index}: an {BINARY} body must be bytes, got {type(body).__name__}"
            )
        return bytes(body)
    if ctype == TEXT:
        if not isinstance(body, str):
            raise MalformedMessageError(
                f"message {index}: a {TEXT} body must be str, got {type(body).__name__}"
            )
        return body.encode()
    raise MalformedMessageError(
        f"message {index}: unknown content type {ctype!r}; use {JSON}, {BINARY} or {TEXT}"
    )


def _checked_properties(properties: Any, index: int) -> dict:
    """A copy of a message's properties; ``MalformedMessageError`` unless they map str to str with
    no \\u0000 and no lone surrogate (jsonb cannot store either) and no reserved retry property."""
    where = f"message {index}"
    if not isinstance(properties, Mapping):
        raise MalformedMessageError(
            f"{where}: properties must be a mapping of str to str, got {type(properties).__name__}"
        )
    props = dict(properties)
    for name, value in props.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise MalformedMessageError(f"{where}: properties must map str to str, got {name!r}: {value!r}")
        if "\x00" in name or "\x00" in value:
            raise MalformedMessageError(
                f"{where}: property {name!r} has a \\u0000 character, which PostgreSQL's jsonb cannot store"
            )
        if not name.isascii():
            _check_text(name, f"{where}: property name {name!r}")
        if not value.isascii():
            _check_text(value, f"{where}: property {name!r}")
        if name in RETRY_PROPERTIES:
            raise MalformedMessageError(f"{where}: property {name!r} is reserved for redelivered messages")
    return props


#: What an integer orjson reads as a float (outside [-2**63, 2**64 - 1]) must be: 20 digits or more,
#: or a minus and 19 digits, that is 20 bytes in a row of "-" and digits; found in the body with
#: each of those made "0" and every other byte a space: two C passes, 0.5 µs for a flight (314
#: bytes; orjson decodes it in 1.0 µs), where a regular expression ([-0-9]{20}) takes 2.6 µs.
#: Positive 19-digit ids (Snowflake ids, nanosecond times) stay on orjson: they fit in 64 bits.
#: Runs in a string or after a decimal point count too, harmlessly: the standard decoder is exact as
#: well, only slower.
_DIGITS_AS_ZEROS = bytes(0x30 if byte == 0x2D or 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_INTEGER = b"0" * 20


def _exact_float(text: str) -> float | Decimal:
    """A JSON number with a fraction or an exponent as a float, or, past float's range (1e400,
    which PostgreSQL's JSON takes), as the exact ``Decimal``: ``inf`` is no JSON value."""
    number = float(text)
    return number if math.isfinite(number) else Decimal(text)


def decode(body: bytes, content_type: str) -> Any:
    """A stored body as its content type says: a JSON value, ``str`` or ``bytes``. JSON numbers
    come value for value: an integer as an ``int`` of any size, a number with a fraction or an
    exponent as a ``float``, or as a ``Decimal`` past float's range (1e400). Raises ``ValueError``
    or ``RecursionError`` for JSON that Python cannot take (nesting deeper than the interpreter
    allows, an integer over 4300 digits)."""
    if content_type == JSON:
        # Run for every received message: orjson is several times faster than json, but reads an
        # integer past 64 bits as a float (not exact) and fails a number past float's range.
        if _LONG_INTEGER not in body.translate(_DIGITS_AS_ZEROS):
            try:
                return orjson.loads(body)
            except orjson.JSONDecodeError:  # past float's range, deep nesting: the standard decoder
                pass
        return json.loads(body, parse_float=_exact_float)
    if content_type == TEXT:
        return bytes(body).decode()
    return bytes(body)


def retry_properties(
    properties: dict, *, topic: str, origin_message_id: int, retry_topic: str, reconsume_times: int
) -> dict:
    """A message's properties as a consumer sees them: a redelivered one (reconsume times > 0)
    also carries REAL_TOPIC, ORIGIN_MESSAGE_ID, RETRY_TOPIC and RECONSUMETIMES (TDMQ Pulsar,
    "Message retry and dead-letter mechanism")."""
    if reconsume_times <= 0:
        return properties
    return {
        **properties,
        "REAL_TOPIC": topic,
        "ORIGIN_MESSAGE_ID": str(origin_message_id),
        "RETRY_TOPIC": retry_topic,
        "RECONSUMETIMES": str(reconsume_times),
    }


def received_properties(
    properties: str, reconsume_times: int, origin_message_id: int, topic: str, retry_topic: str
) -> dict:
    """A leased row's properties (jsonb as text) with Pulsar's retry properties, REAL_TOPIC...
    (TDMQ Pulsar, "Message retry and dead-letter mechanism")."""
    loaded = json.loads(properties) if properties != "{}" else {}  # most messages carry none
    if reconsume_times <= 0:
        return loaded
    return retry_properties(
        loaded,
        topic=topic,
        origin_message_id=origin_message_id,
        retry_topic=retry_topic,
        reconsume_times=reconsume_times,
    )
