"""Reading dead letters: a filter of values (never SQL), and count, select and summary over it.
The redrive moves what such a filter selects (``redrive``); the CLI, the API and the operator page
read through here."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal, get_args

import psycopg
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from redelivery.messaging.codec import decode
from redelivery.rules.names import check_name
from redelivery.store import statements as S
from redelivery.store.catalog import group, topic_id

#: Why a message was dead-lettered (the database enum ``dlq_reason``): retries used up, a lease
#: expired with retries used up, rejected, a negative delay level (RocketMQ), a body Python cannot
#: decode (``Client.receive``).
Reason = Literal["MAX_DELIVERIES_EXCEEDED", "LEASE_EXPIRED", "REJECTED", "NEGATIVE_LEVEL", "UNDECODABLE"]
REASONS: tuple[str, ...] = get_args(Reason)


MAX_MESSAGE_ID = 2**63 - 1  # bigint
MessageId = Annotated[int, Field(ge=1, le=MAX_MESSAGE_ID)]
#: At most this many message ids in one filter; ``error_contains`` at most this many characters.
MAX_MESSAGE_IDS, MAX_ERROR_TEXT = 100_000, 1000


class DlqFilter(BaseModel):
    """Which dead letters of ``group``: all given conditions must hold. Times are timezone-aware
    (UTC assumed when naive), ``dead_lettered_from`` inclusive and ``dead_lettered_to`` exclusive;
    ``error_contains`` matches the last error, case-insensitively, as text (never a pattern).
    Invalid values raise pydantic's ``ValidationError`` (a ``ValueError``) naming the field."""

    model_config = ConfigDict(extra="forbid")

    group: str
    topic: str | None = None
    dead_lettered_from: datetime | None = None
    dead_lettered_to: datetime | None = None
    reasons: list[Reason] = Field(default_factory=list)
    error_contains: str | None = Field(default=None, max_length=MAX_ERROR_TEXT)
    message_ids: list[MessageId] = Field(default_factory=list, max_length=MAX_MESSAGE_IDS)

    @field_validator("group")
    @classmethod
    def _group_name(cls, value: str) -> str:
        return check_name("group", value)

    @field_validator("topic")
    @classmethod
    def _topic_name(cls, value: str | None) -> str | None:
        return check_name("topic", value) if value else None

    @field_validator("dead_lettered_from", "dead_lettered_to")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value

    @field_validator("error_contains")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        if value and "\x00" in value:
            raise ValueError("error_contains may not contain a NUL character")
        return value if value else None

    @model_validator(mode="after")
    def _range(self) -> DlqFilter:
        start, end = self.dead_lettered_from, self.dead_lettered_to
        if start is not None and end is not None and start > end:
            raise ValueError(
                f"dead_lettered_from ({start.isoformat()}) is after dead_lettered_to ({end.isoformat()})"
            )
        return self


def filter_params(conn: psycopg.Connection, request: DlqFilter) -> dict:
    """The parameters of ``statements.DLQ_FILTER``; raises UnknownGroupError / UnknownTopicError."""
    return {
        "group_id": group(conn, request.group)[0],
        "topic_id": topic_id(conn, request.topic) if request.topic else None,
        "from": request.dead_lettered_from,
        "to": request.dead_lettered_to,
        "reasons": list(request.reasons) or None,
        "error": request.error_contains,
        "ids": list(request.message_ids) or None,
    }


def count(conn: psycopg.Connection, request: DlqFilter) -> int:
    """How many dead letters match. Raises UnknownGroupError / UnknownTopicError."""
    return conn.execute(S.DLQ_COUNT, filter_params(conn, request)).fetchone()[0]


def select(
    conn: psycopg.Connection, request: DlqFilter, limit: int = 100, with_body: bool = False
) -> list[dict]:
    """The matching dead letters, oldest first (``limit`` at most), as dicts of native values
    (datetimes; with ``with_body`` the body decoded by content type, the properties and the attempt
    history). A body that does not decode (an UNDECODABLE dead letter) is given as it is stored
    (text, or bytes when it is not UTF-8) with the reason in ``body_error``. ``jsonable`` turns the
    rows into JSON-ready values."""
    cur = conn.execute(S.DLQ_SELECT, {**filter_params(conn, request), "limit": limit})
    names = [c.name for c in cur.description]
    rows = []
    for values in cur.fetchall():
        row = dict(zip(names, values, strict=True))
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
        rows.append(row)
    return rows


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
