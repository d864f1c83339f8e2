"""The leased row, declared once (issue 39): ``ReceivedMessage``, each field with where a receive
reads it and what it is on a leased DataFrame. What a receive hands out comes from this one class:

- the columns of ``RECEIVE`` and ``RECEIVE_ORDERED`` (``RECEIVE_COLUMNS``, their order, and the
  expressions of their select list: ``receive_select``);
- a ``ReceivedMessage``, made from a row of them (``messaging.leasing``);
- the leased DataFrame's columns (``SPARK_COLUMNS``, ``LEASE_SCHEMA``) and the dicts
  ``Client.lease_rows`` returns (``spark.dataframes`` derives its Arrow schema from them).

A field added here is a column of the receive, an attribute of the message and, when it declares a
Spark type, a column of the DataFrame. (River decodes its ``JobRow`` in one place the same way.)
It lives below the statements, which need its select list, and the messaging layer re-exports
``ReceivedMessage`` (``redelivery.messaging.codec``, ``redelivery.client``, the package).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

#: The keys of a field's metadata: ``leased``, RECEIVE's expression for a READY row leased again
#: (``a``: the delivery row it updated, ``m``: its message); ``taken``, for a message taken past the
#: offset (``n``: the messages handed out; ``{lease_end}``: the lease's end, as the statement writes
#: it); ``spark``, its columns on a leased DataFrame, each a Spark DDL type (a column named as the
#: field) or a (name, type) pair; none when it is not one. A field without expressions is the
#: call's (group, topic).


def _field(leased: str | None = None, taken: str | None = None, spark: str | tuple = (), **default):
    if isinstance(spark, str):
        spark = (spark,)
    return field(metadata={"leased": leased, "taken": taken, "spark": spark}, **default)


@dataclass(frozen=True)
class ReceivedMessage:
    """A message handed to a consumer of ``group``. ``body`` is decoded by content type (JSON
    value, ``bytes`` or ``str``). ``delivery_count`` counts this delivery; ``reconsume_times`` the
    retries scheduled before it. A retried message's ``properties`` carry REAL_TOPIC,
    ORIGIN_MESSAGE_ID, RETRY_TOPIC and RECONSUMETIMES (TDMQ Pulsar, "Message retry and dead-letter
    mechanism"). ``delay_level``: the level of the retry that brought it back, if any;
    ``invisible_until``: when this delivery's lease ends; ``last_error``: the error of its last
    failed delivery; ``redrive_count``: how many times an operator redrove it from the DLQ. The
    receipt of this delivery is (``group``, ``message_id``, ``delivery_count``)."""

    message_id: int = _field("a.message_id", "n.id", spark="long")
    group: str = _field(spark="string")
    topic: str = _field(spark="string")
    key: str | None = _field("m.key", "n.key", spark="string")
    #: on a DataFrame, undecoded: the text of a JSON or text body, or the bytes of a binary one
    body: Any = _field("m.body", "n.body", spark=("string", ("body_binary", "binary")))
    content_type: str = _field("m.content_type", "n.content_type", spark="string")
    properties: dict = _field("m.properties::text", "n.properties::text", spark="map<string,string>")
    published_at: datetime = _field("m.published_at", "n.published_at", spark="timestamp")
    delivery_count: int = _field("a.delivery_count", "1", spark="int")
    reconsume_times: int = _field("a.reconsume_times", "0", spark="int")
    delay_level: int | None = _field("a.delay_level", "NULL::smallint")
    invisible_until: datetime = _field("a.invisible_until", "{lease_end}")
    origin_message_id: int = _field(
        "coalesce(m.origin_message_id, m.id)", "coalesce(n.origin_message_id, n.id)", spark="long"
    )
    last_error: str | None = _field("a.last_error", "NULL::text", spark="string")
    redrive_count: int = _field("a.redrive_count", "0", spark="int", default=0)

    @classmethod
    def of(cls, values: dict[str, Any]) -> ReceivedMessage:
        """The message with ``values`` (a value for every field, by name), as frozen as one made by
        the constructor. A receive makes one per message: the frozen dataclass's ``__init__`` sets
        its 15 fields one ``object.__setattr__`` at a time (1.6 µs a message, a third of the
        client's share of a receive); this sets them in one step (0.3 µs)."""
        message = object.__new__(cls)
        object.__setattr__(message, "__dict__", values)
        return message


_FIELDS = fields(ReceivedMessage)
#: The columns of ``RECEIVE`` and ``RECEIVE_ORDERED``, in their order: a leased row is a tuple of
#: these (a test compares them with the statements' own).
RECEIVE_COLUMNS: tuple[str, ...] = tuple(f.name for f in _FIELDS if f.metadata["leased"])
#: The fields a receive's call gives (not read from the row).
CALL_FIELDS: tuple[str, ...] = tuple(f.name for f in _FIELDS if not f.metadata["leased"])
#: The leased DataFrame's columns, (name, Spark DDL type), in their order.
SPARK_COLUMNS: tuple[tuple[str, str], ...] = tuple(
    column if isinstance(column, tuple) else (f.name, column)  # a bare type: the field's own name
    for f in _FIELDS
    for column in f.metadata["spark"]
)
#: The leased DataFrame's schema (Spark DDL).
LEASE_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in SPARK_COLUMNS)


def _row_values_function():
    """``row_values``, written from the declaration once, as ``dataclasses`` writes an ``__init__``:
    a tuple unpacked into names and a dict display of them costs 0.5 µs a message where
    ``dict(zip(RECEIVE_COLUMNS, row))`` costs 1.1 µs (a receive of 500 messages: 0.3 ms)."""
    names = ", ".join(RECEIVE_COLUMNS)
    display = ", ".join(f"{name!r}: {name}" for name in (*CALL_FIELDS, *RECEIVE_COLUMNS))
    given = ", ".join(CALL_FIELDS)
    source = f"def row_values(row, {given}):\n    ({names},) = row\n    return {{{display}}}\n"
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102  (our own names only: the fields above)
    return namespace["row_values"]


#: ``row_values(row, group, topic)``: a dict of every field of ``ReceivedMessage`` (the call's
#: ``group`` and ``topic``, the row's ``RECEIVE_COLUMNS``), as ``ReceivedMessage.of`` takes it.
row_values = _row_values_function()


def receive_select(lease_end: str) -> tuple[str, str]:
    """The select lists of a receive's two branches, ``RECEIVE_COLUMNS`` in order: (a READY row
    leased again, a message taken past the offset whose lease ends at the SQL ``lease_end``)."""
    leased = [f for f in _FIELDS if f.metadata["leased"]]
    comma = ",\n           "  # a column a line: the statement as PostgreSQL runs it reads as written
    again = comma.join(f"{f.metadata['leased']} AS {f.name}" for f in leased)
    taken = comma.join(f.metadata["taken"].format(lease_end=lease_end) for f in leased)
    return again, taken
