"""Reading dead letters: a filter of values (never SQL), and count, select and summary over it.
The redrive moves what such a filter selects (``redrive``); the CLI, the API and the operator page
read through here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import psycopg
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from redelivery.config import RedeliveryConfig, cached_config
from redelivery.errors import ConfigError
from redelivery.fields import Time
from redelivery.messaging.codec import BINARY, JSON, decode, retry_properties
from redelivery.rules.names import NAME_REGEX, check_name
from redelivery.rules.words import Reason
from redelivery.store import statements as S
from redelivery.store.catalog import group, topic_id

MAX_MESSAGE_ID = 2**63 - 1  # bigint
MessageId = Annotated[int, Field(ge=1, le=MAX_MESSAGE_ID)]
#: At most this many message ids in one filter; ``error_contains`` and ``key`` at most this many
#: characters.
MAX_MESSAGE_IDS, MAX_ERROR_TEXT, MAX_KEY_CHARS = 100_000, 1000, 1000


#: Any text without a NUL character (PostgreSQL's text cannot hold one); ECMA 262 and Python alike.
NO_NUL = r"^[^\u0000]*$"


def _blank_is_none(value):
    return None if value == "" else value


def _name_of(kind: str, optional: bool):
    """A validator of a ``kind`` name (``rules.names``, its message); for an ``optional`` one, a
    blank is no name."""

    def check(value):
        value = _blank_is_none(value) if optional else value
        return value if value is None else check_name(kind, value)

    return BeforeValidator(check)


#: A topic or group name: the rule of ``rules.names`` (its message), its pattern for the forms.
Name = Annotated[str, Field(pattern=f"^{NAME_REGEX}$")]
GroupName = Annotated[Name, _name_of("group", optional=False)]
TopicName = Annotated[Name | None, _name_of("topic", optional=True)]
#: Text without a NUL character, a blank being no text.
Text = Annotated[str | None, BeforeValidator(_blank_is_none)]
#: A failure's signature (``rules.failures``: 12 lower-case hex digits), a blank being none.
SignatureText = Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]
Signature = Annotated[SignatureText | None, BeforeValidator(_blank_is_none)]


class DlqFilter(BaseModel):
    """Which dead letters of ``group``: all given conditions must hold. Times are ISO 8601 text or
    ``datetime`` (never a number: ``fields.Time``), UTC when they have no zone,
    ``dead_lettered_from`` inclusive and ``dead_lettered_to`` exclusive; ``error_contains``
    matches the last error, case-insensitively, as text (never a pattern); ``signature`` the last
    failure's signature (issue 40); ``key`` the message key exactly. The one declaration of these
    fields: the CLI's options, the ``dlq_redrive`` Params, the operator page's form and address
    and the SQL parameters of ``statements.DLQ_FILTER`` are derived from it (``redelivery.fields``).
    Invalid values raise pydantic's ``ValidationError`` (a ``ValueError``) naming the field."""

    model_config = ConfigDict(extra="forbid")

    group: GroupName = Field(title="Consumer group", description="The group whose dead letters these are.")
    topic: TopicName = Field(
        default=None, title="Topic", description="Only dead letters from this topic. Empty: every topic."
    )
    dead_lettered_from: Time | None = Field(
        default=None,
        title="Dead-lettered from",
        description="ISO 8601 time, inclusive. Empty: no lower bound.",
    )
    dead_lettered_to: Time | None = Field(
        default=None,
        title="Dead-lettered before",
        description="ISO 8601 time, exclusive. Empty: no upper bound.",
    )
    reasons: Annotated[list[Reason], AfterValidator(lambda v: list(dict.fromkeys(v)))] = Field(
        default_factory=list,
        title="Reasons",
        description="Only these dead-letter reasons. Empty: all.",
        json_schema_extra={"uniqueItems": True},
    )
    error_contains: Text = Field(
        default=None,
        max_length=MAX_ERROR_TEXT,
        title="Last error contains",
        description="Case-insensitive text of the last error (never a pattern). Empty: any.",
        json_schema_extra={"pattern": NO_NUL},
    )
    signature: Signature = Field(
        default=None,
        title="Failure signature",
        description="Only dead letters whose last failure has this signature (12 hex digits, as "
        "`redelivery dlq groups` lists them). Empty: any.",
    )
    message_ids: list[MessageId] = Field(
        default_factory=list,
        max_length=MAX_MESSAGE_IDS,
        title="Message ids",
        description=f"Only these message ids (at most {MAX_MESSAGE_IDS:,}). Empty: any.",
    )
    key: Text = Field(
        default=None,
        max_length=MAX_KEY_CHARS,
        title="Message key",
        description="Only dead letters with exactly this message key. Empty: any.",
        json_schema_extra={"pattern": NO_NUL},
    )

    @field_validator("dead_lettered_from", "dead_lettered_to")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    @field_validator("error_contains", "key")
    @classmethod
    def _text(cls, value: str | None, info) -> str | None:
        if value and "\x00" in value:
            raise ValueError(f"{info.field_name} may not contain a NUL character")
        return value

    @model_validator(mode="after")
    def _range(self) -> DlqFilter:
        start, end = self.dead_lettered_from, self.dead_lettered_to
        if start is not None and end is not None and start > end:
            raise ValueError(
                f"dead_lettered_from ({start.isoformat()}) is after dead_lettered_to ({end.isoformat()})"
            )
        return self


#: The fields of the filter (``DlqFilter``'s; a ``RedriveRequest`` has more).
FILTER_FIELDS: tuple[str, ...] = tuple(DlqFilter.model_fields)


def filter_params(
    conn: psycopg.Connection, request: DlqFilter, generations: tuple[int, float] | None = None
) -> dict:
    """The parameters of ``statements.DLQ_FILTER``: the filter's fields under their own names (an
    empty list as NULL: no condition), and the ids of its group and topic; ``generations``, a
    standing redrive's ``(max_generations, generation_wait in seconds)``: only the dead letters
    redriven fewer times, dead for ``generation_wait * 2**redrive_count`` (``rules.standing``).
    Raises UnknownGroupError / UnknownTopicError."""
    values = {name: getattr(request, name) for name in FILTER_FIELDS}
    return {
        **{name: (list(v) or None) if isinstance(v, list) else v for name, v in values.items()},
        "group_id": group(conn, request.group)[0],
        "topic_id": topic_id(conn, request.topic) if request.topic else None,
        "max_generations": generations[0] if generations else None,
        "generation_wait": generations[1] if generations else None,
    }


def count(conn: psycopg.Connection, request: DlqFilter) -> int:
    """How many dead letters match. Raises UnknownGroupError / UnknownTopicError."""
    return conn.execute(S.DLQ_COUNT, filter_params(conn, request)).fetchone()[0]


def select(
    conn: psycopg.Connection,
    request: DlqFilter,
    limit: int = 100,
    with_body: bool = False,
    generations: tuple[int, float] | None = None,
) -> list[dict]:
    """The matching dead letters, oldest first (``limit`` at most), as dicts of native values
    (datetimes; with ``with_body`` the body decoded by content type, the properties and the attempt
    history). A body that does not decode (an UNDECODABLE dead letter) is given as it is stored
    (text, or bytes when it is not UTF-8) with the reason in ``body_error``. ``jsonable`` turns the
    rows into JSON-ready values. ``generations``: a standing redrive's rule (``filter_params``)."""
    cur = conn.execute(S.DLQ_SELECT, {**filter_params(conn, request, generations), "limit": limit})
    names = [c.name for c in cur.description]
    return [_selected(dict(zip(names, values, strict=True)), with_body) for values in cur.fetchall()]


def groups(conn: psycopg.Connection, request: DlqFilter, limit: int = 50) -> list[dict]:
    """The matching dead letters grouped by the signature of their last failure (issue 40), most
    first, at most ``limit`` groups: ``{"signature", "count", "failed_again" (of them, dead
    letters redriven before: they failed again after a redrive), "first_dead_lettered_at",
    "last_dead_lettered_at", "topics", "error_class", "last_error", "error_frame",
    "newest_message_id"}`` each, the last four the newest dead letter's (``DLQ_SIGNATURES``).
    Raises UnknownGroupError / UnknownTopicError."""
    cur = conn.execute(S.DLQ_SIGNATURES, {**filter_params(conn, request), "limit": limit})
    names = [c.name for c in cur.description]
    return [dict(zip(names, values, strict=True)) for values in cur.fetchall()]


def export(conn: psycopg.Connection, request: DlqFilter, limit: int) -> Iterator[str]:
    """The rows of ``select(conn, request, limit, with_body=True)`` as JSON Lines, one ``json_line``
    (a ``str`` without its newline) a row, read through a server-side cursor ``EXPORT_BATCH`` rows
    at a time: a download of many dead letters never holds them all in memory. Runs in a
    transaction of its own on ``conn`` (which must not be in one); raises UnknownGroupError /
    UnknownTopicError before the first row."""
    params = {**filter_params(conn, request), "limit": limit}
    with conn.transaction(), conn.cursor(name="redelivery_export") as cur:
        cur.itersize = EXPORT_BATCH
        cur.execute(S.DLQ_SELECT, params)
        names = None
        for values in cur:
            names = names or [c.name for c in cur.description]
            yield json_line(dict(zip(names, values, strict=True)))


def json_line(row: dict) -> str:
    """A dead letter as one line of JSON (no newline, ASCII only): a row as ``DLQ_SELECT`` reads it
    (``body`` as stored bytes, ``content_type``) made the row ``jsonable(select(..., with_body=True))``
    gives, but with a JSON body written as it is stored, so every value is as published (Python
    would write 1e400 as Infinity, which is no JSON, 10.10 as 10.1, -0 as 0). Only line breaks
    between values become spaces, and characters outside ASCII \\u escapes (inside strings, where
    they only can be: the same value). A body that does not decode keeps ``select``'s form (the
    stored text as a string, ``body_error``). Raises nothing of its own."""
    stored, content_type = row["body"], row["content_type"]
    shaped = _selected(dict(row), True)
    text = _stored_json(stored) if content_type == JSON and "body_error" not in shaped else None
    if text is None:
        return json.dumps(jsonable([shaped])[0], default=str)
    del shaped["body"]  # the last key (``_selected`` sets it): the stored text goes in its place
    head = json.dumps(jsonable([shaped])[0], default=str)
    return f'{head[:-1]}, "body": {text}}}'


#: What keeps a JSON text from being one ASCII line: a line break (only between values: a string
#: holds none) and a character outside ASCII (only inside a string).
_ONE_ASCII_LINE = re.compile(r"[\r\n]|[^\x00-\x7f]")


def _stored_json(stored: bytes) -> str | None:
    """A JSON body that decoded, as one ASCII line of its stored text; None when that text is not
    UTF-8 without a byte order mark, as PostgreSQL checks a JSON body since migration 0013 (the
    json module also reads UTF-16 and UTF-32 and skips the mark: an older row may be so)."""
    try:
        text = bytes(stored).decode()
    except UnicodeDecodeError:
        return None
    if text.isascii() and "\n" not in text and "\r" not in text:
        return text
    return None if text.startswith("\ufeff") else _ONE_ASCII_LINE.sub(_one_ascii_line, text)


def _one_ascii_line(match: re.Match) -> str:
    """A space for a line break, the \\u escape (two for a pair of surrogates) for a character
    outside ASCII: as ``json.dumps`` writes it, so Unicode line separators (U+2028, U+0085, which
    ``str.splitlines`` breaks at) never split a line either."""
    return " " if match[0] in "\r\n" else json.dumps(match[0])[1:-1]


#: Rows a server-side cursor of ``export`` fetches at a time.
EXPORT_BATCH = 500


def _selected(row: dict, with_body: bool) -> dict:
    """A ``DLQ_SELECT`` row as ``select`` gives it."""
    body, content_type = row.pop("body"), row.pop("content_type")
    if with_body:
        try:
            row["body"] = decode(body, content_type)
        except (ValueError, RecursionError) as exc:
            raw = bytes(body)
            row["body"], row["body_error"] = (
                _as_text(raw),
                f"not decodable as {content_type}: {exc}"[:500],
            )
    else:
        del row["properties"], row["attempts"]
    return row


def _as_text(raw: bytes) -> str | bytes:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


def jsonable(rows: list[dict]) -> list[dict]:
    """``select`` rows with times as ISO strings and binary bodies as hex."""

    def value(v):
        if isinstance(v, datetime):
            return v.isoformat()
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v).hex()
        return v

    return [{k: value(v) for k, v in row.items()} for row in rows]


def summary(conn: psycopg.Connection, group_name: str | None = None) -> list[dict]:
    """Per group with dead letters: count, oldest and newest dead-lettering time, counts per DLQ
    (20 at most), the top reasons and the top last errors (5 each)."""
    out = []
    for group_id, name, total, oldest, newest in conn.execute(
        S.DLQ_SUMMARY_GROUPS, {"group": group_name}
    ).fetchall():

        def top(statement, limit=5, group_id=group_id):
            params = {"group_id": group_id, "limit": limit}
            return [{"value": v, "count": n} for v, n in conn.execute(statement, params)]

        out.append(
            {
                "group": name,
                "count": total,
                "oldest": oldest.isoformat(),
                "newest": newest.isoformat(),
                "queues": top(S.DLQ_TOP_QUEUES, 20),
                "top_reasons": top(S.DLQ_TOP_REASONS),
                "top_errors": top(S.DLQ_TOP_ERRORS),
            }
        )
    return out


#: Rows on a page of the operator's dead-letter list; the last error is cut at ``ERROR_CHARS`` there
#: (the message's page shows it whole).
PAGE_ROWS, ERROR_CHARS = 50, 200
#: A message's page shows at most this many bytes of its body, and a binary body's first
#: ``HEX_PREVIEW_BYTES`` as hex: a body of megabytes never leaves the database whole.
BODY_PREVIEW_BYTES, HEX_PREVIEW_BYTES = 64 * 1024, 512


@dataclass(frozen=True)
class Cursor:
    """Where a page of ``browse`` ends: its last row's dead-lettering time and message id. The
    next page starts after it (keyset pagination), so rows dead-lettered or redriven meanwhile
    never shift or repeat a page. ``token`` / ``parse``: its form in a URL."""

    dead_lettered_at: datetime
    message_id: int

    def token(self) -> str:
        return f"{self.dead_lettered_at.isoformat()}_{self.message_id}"

    @classmethod
    def parse(cls, token: str) -> Cursor:
        """Raises ``ValueError`` for anything ``token`` did not make."""
        at, _, message_id = token.rpartition("_")
        try:
            parsed = cls(datetime.fromisoformat(at), int(message_id))
        except ValueError:
            raise ValueError(f"not a page cursor: {token[:100]!r}") from None
        if parsed.dead_lettered_at.tzinfo is None or not 1 <= parsed.message_id <= MAX_MESSAGE_ID:
            raise ValueError(f"not a page cursor: {token[:100]!r}")
        return parsed


def browse(
    conn: psycopg.Connection, request: DlqFilter, *, after: Cursor | None = None, limit: int = PAGE_ROWS
) -> tuple[list[dict], Cursor | None]:
    """One page of the matching dead letters, newest first: ``(rows, cursor of the next page or
    None)``, after ``after`` (None: the first page), at most ``limit`` rows. Each row: message id,
    key, topic, DLQ, reason, the last error's first ``ERROR_CHARS`` characters (and
    ``error_length``, its whole length), delivery count, reconsume times, redrive count,
    dead-lettered at. The filter is the redrive's (``DlqFilter``): what a page lists is what a
    redrive of the same filter would move. Raises UnknownGroupError / UnknownTopicError."""
    params = {
        **filter_params(conn, request),
        "before_at": after.dead_lettered_at if after else None,
        "before_id": after.message_id if after else None,
        "limit": limit + 1,
        "error_chars": ERROR_CHARS,
    }
    cur = conn.execute(S.DLQ_BROWSE, params)
    names = [c.name for c in cur.description]
    rows = [dict(zip(names, values, strict=True)) for values in cur.fetchall()]
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], Cursor(last["dead_lettered_at"], last["message_id"])


def message(
    conn: psycopg.Connection, group_name: str, message_id: int, config: RedeliveryConfig | None = None
) -> dict | None:
    """One dead letter of ``group_name`` in full for its page, or None when the group has no such
    dead letter (never dead-lettered, or redriven since). Its fields as in the DLQ table, the body
    as ``body_text`` (JSON pretty-printed, every number as written; text as text; None for a binary
    body), ``body_hex`` (a binary body's first ``HEX_PREVIEW_BYTES`` bytes), ``body_size`` (bytes)
    and ``body_shown`` (bytes of it read, at most ``BODY_PREVIEW_BYTES``); ``properties`` (dict: the
    user's own and, once it was retried, REAL_TOPIC, ORIGIN_MESSAGE_ID, RETRY_TOPIC and
    RECONSUMETIMES, as its last delivery carried them; the retry topic named by ``config``'s policy,
    default the process's config), ``attempts`` (each failed delivery: at, delivery, outcome, error,
    and since issue 40 its class, frame and signature), ``redrives`` (each earlier redrive of it in
    this group: run key, triggered by, moved at, destination topic), its last failure's
    ``signature``, ``error_class``, ``error_frame`` and ``error_stack``, and
    ``signature_before_redrive`` (the failure that dead-lettered it before its latest redrive, or
    None: a message that failed again after a redrive says whether it is the same failure).
    Raises UnknownGroupError, or ValueError for a message id that is no bigint."""
    if not 1 <= message_id <= MAX_MESSAGE_ID:
        raise ValueError(f"message id {message_id} is out of range (1 to {MAX_MESSAGE_ID})")
    group_id = group(conn, check_name("group", group_name))[0]
    params = {"group_id": group_id, "message_id": message_id, "body_bytes": BODY_PREVIEW_BYTES}
    cur = conn.execute(S.DLQ_MESSAGE, params)
    values = cur.fetchone()
    if values is None:
        return None
    row = dict(zip([c.name for c in cur.description], values, strict=True))
    row |= _body_preview(bytes(row.pop("body")), row["content_type"], row["body_size"])
    row["properties"] = _delivered_properties(row, group_name, config or cached_config())
    redrives = conn.execute(S.MESSAGE_REDRIVES, params)
    names = [c.name for c in redrives.description]
    row["redrives"] = [dict(zip(names, r, strict=True)) for r in redrives.fetchall()]
    row["signature_before_redrive"] = _signature_before_redrive(row)
    return row


def _signature_before_redrive(row: dict) -> str | None:
    """The signature of the failure that dead-lettered the message before its latest redrive in
    this group (the newest attempt of the history older than that redrive), or None: never
    redriven here, or that attempt is no longer among the 20 the history keeps."""
    if not row["redrives"]:
        return None
    redriven_at = max(r["moved_at"] for r in row["redrives"])
    before = [a for a in row["attempts"] if a.get("at") and datetime.fromisoformat(a["at"]) < redriven_at]
    return before[-1].get("signature") if before else None


def _delivered_properties(row: dict, group_name: str, config: RedeliveryConfig) -> dict:
    """A dead letter's properties as its last delivery carried them (``codec.retry_properties``)."""
    try:
        retry_topic = config.policy_for(row["topic"], group_name).retry_name
    except ConfigError:  # a name the policy cannot make any more: the consumer saw it, we cannot
        retry_topic = "(unknown: the policy names none)"
    return retry_properties(
        row["properties"],
        topic=row["topic"],
        origin_message_id=row["origin_message_id"],
        retry_topic=retry_topic,
        reconsume_times=row["reconsume_times"],
    )


def _body_preview(shown: bytes, content_type: str, size: int) -> dict:
    """``body_text`` / ``body_hex`` of a body's first bytes ``shown`` (see ``message``)."""
    preview = {"body_size": size, "body_shown": len(shown), "body_text": None, "body_hex": None}
    if content_type == BINARY:
        preview["body_hex"] = shown[:HEX_PREVIEW_BYTES].hex(" ")
        return preview
    text = shown.decode("utf-8", errors="replace")  # a cut may split a character
    if len(shown) == size and content_type == JSON:  # JSON cannot be parsed from a part
        text = pretty_json(text)
    preview["body_text"] = text
    return preview


#: A number's place in ``pretty_json``'s output: a string of NUL and its index (jsonb text holds no
#: NUL, so no string of the body can look like one).
_NUMBER = re.compile(r'"\\u0000(\d+)"')


def pretty_json(text: str) -> str:
    """JSON ``text`` indented by two spaces, every number written as in ``text`` (Python's float
    would show 10.10 as 10.1, 1e400 as Infinity and -0 as 0) and every key kept (a repeated key,
    which jsonb and Python keep once, leaves the text as it is). Text that does not parse (an
    UNDECODABLE body), or that holds a ``\\u0000`` escape, is returned as it is."""
    if "\\u0000" in text.lower():
        return text
    numbers: list[str] = []

    def number(raw: str) -> str:
        numbers.append(raw)
        return f"\x00{len(numbers) - 1}"

    def unique_keys(pairs: list[tuple]) -> dict:
        if len({key for key, _ in pairs}) < len(pairs):
            raise ValueError("a key is repeated")
        return dict(pairs)

    try:
        value = json.loads(text, parse_float=number, parse_int=number, object_pairs_hook=unique_keys)
    except (ValueError, RecursionError):
        return text
    return _NUMBER.sub(lambda m: numbers[int(m[1])], json.dumps(value, indent=2, ensure_ascii=False))
