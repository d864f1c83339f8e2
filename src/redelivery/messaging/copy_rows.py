"""Messages as the rows of the log's COPY (``statements.COPY_MESSAGES``): Arrow arrays encoded in
PostgreSQL's binary COPY format by pgpq (in Rust, no Python object per row), their JSON bodies
checked a batch at a time, and the errors PostgreSQL raises for a row mapped back to that row.

The API builds the arrays from its encoded messages, a Spark task from its partition's Arrow
batches; both write the same columns, so every row is checked the same way: by PostgreSQL as it
is written (a key's encoding, properties that are a JSON object, a JSON body that is JSON:
``messages_json_body``), and here for what only jsonb refuses (``check_json_bodies``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime

import pgpq
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from pgpq import encoders, schema

from redelivery.errors import MalformedMessageError
from redelivery.messaging.codec import JSON, JSONB_HAZARD, JSONB_SAFE_LENGTH, SAFE_BRACKETS, check_json_text

#: The columns of ``COPY_MESSAGES``, in its order (ids come from the column's default, in the order
#: of the rows). ``properties``: a JSON object as text (jsonb on the wire).
MESSAGE_SCHEMA = pa.schema(
    [
        ("topic_id", pa.int32()),
        ("key", pa.string()),
        ("body", pa.binary()),
        ("content_type", pa.string()),
        ("properties", pa.string()),
        ("published_at", pa.timestamp("us", tz="UTC")),
    ]
)
#: The binary COPY format's header (signature, flags, no extension) and trailer (-1 as int16).
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
COPY_TRAILER = b"\xff\xff"


def _encoder() -> pgpq.ArrowToPostgresBinaryEncoder:
    builders = {f.name: pgpq.ArrowToPostgresBinaryEncoder.infer_encoder(f) for f in MESSAGE_SCHEMA}
    properties = MESSAGE_SCHEMA.field("properties")
    builders["properties"] = encoders.StringEncoderBuilder.new_with_output(properties, schema.Jsonb())
    return pgpq.ArrowToPostgresBinaryEncoder.new_with_encoders(MESSAGE_SCHEMA, builders)


def encode_rows(batch: pa.RecordBatch) -> bytes:
    """The rows of a ``MESSAGE_SCHEMA`` batch in the binary COPY format, without the header and
    the trailer (``COPY_HEADER`` + the rows of any number of batches + ``COPY_TRAILER`` is one
    COPY's data)."""
    encoder = _encoder()
    encoder.write_header()
    rows = encoder.write_batch(batch)
    rest = encoder.finish()[: -len(COPY_TRAILER)]  # it buffers: finish writes the rest, then the trailer
    return rows + rest if rest else rows  # (no copy of a large chunk: fresh memory is slow to fault in)


#: A chunk of a COPY holds at most this many rows and, past its first row, this many bytes of
#: bodies: a few MB, so that the server takes in one chunk while the client encodes the next,
#: memory is reused rather than faulted in anew, and a staged chunk stays far below PostgreSQL's
#: 1 GB for a value.
CHUNK_ROWS = 16_384
CHUNK_BYTES = 8 * 1024 * 1024


def row_ranges(body_sizes: list[int]) -> Iterator[tuple[int, int]]:
    """[start, end) of consecutive rows, each range at most ``CHUNK_ROWS`` rows and, past its first
    row, at most ``CHUNK_BYTES`` bytes of bodies (``body_sizes``: each row's)."""
    start, size = 0, 0
    for index, body_size in enumerate(body_sizes):
        if index > start and (index - start == CHUNK_ROWS or size + body_size > CHUNK_BYTES):
            yield start, index
            start, size = index, 0
        size += body_size
    if start < len(body_sizes):
        yield start, len(body_sizes)


def chunks(topic_id: int, published_at: datetime, columns: tuple) -> Iterator[bytes]:
    """``columns`` (keys, bodies, content types, properties: lists of the same length) as the
    data of ``COPY_MESSAGES``, a chunk at a time (``row_ranges``, ``encode_rows``), each chunk's
    JSON bodies checked first (``check_json_bodies``: ``MalformedMessageError`` names the message
    by its index in ``columns``)."""
    for start, end in row_ranges(list(map(len, columns[1]))):
        batch = message_batch(topic_id, published_at, *(column[start:end] for column in columns))
        check_json_bodies(batch, lambda row, start=start: f"message {start + row}")
        yield encode_rows(batch)


def slices(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """A batch with a ``body`` column in slices of ``row_ranges``."""
    sizes = pc.fill_null(pc.binary_length(batch.column("body").cast(pa.binary())), 0).to_pylist()
    for start, end in row_ranges(sizes):
        yield batch.slice(start, end - start)


def check_json_bodies(batch: pa.RecordBatch, where) -> None:
    """Raise ``MalformedMessageError`` (``where(row)`` names the message) for a JSON body of a
    ``MESSAGE_SCHEMA`` batch that holds what only jsonb refuses or nests deeper than Python decodes
    (``codec.JSONB_HAZARD``, ``SAFE_BRACKETS``). The rows that may, found for the whole batch at
    once by Arrow (RE2 and substring counts, in C++: a regular expression per body in Python cost
    more than the rest of a publish's client work), are checked exactly, so only a real refusal
    raises."""
    json_rows = pc.indices_nonzero(pc.equal(batch.column("content_type"), JSON))
    bodies = batch.column("body").take(json_rows)
    lengths = pc.binary_length(bodies)
    suspects = set(
        pc.indices_nonzero(
            pc.or_(
                pc.match_substring_regex(bodies, JSONB_HAZARD.pattern), pc.greater(lengths, JSONB_SAFE_LENGTH)
            )
        ).to_pylist()
    )
    long_rows = pc.indices_nonzero(pc.greater(lengths, SAFE_BRACKETS))  # only a long text nests that deep
    if len(long_rows):
        long = bodies.take(long_rows)
        brackets = pc.add(pc.count_substring(long, "["), pc.count_substring(long, "{"))
        suspects.update(long_rows.take(pc.indices_nonzero(pc.greater(brackets, SAFE_BRACKETS))).to_pylist())
    for index in sorted(suspects):
        try:
            check_json_text(bodies[index].as_py().decode())
        except (ValueError, RecursionError) as exc:
            message = where(json_rows[index].as_py())
            raise MalformedMessageError(f"{message}: body is not valid {JSON}: {exc}") from None


def constant(value, rows: int, type_: pa.DataType) -> pa.Array:
    """``value`` repeated ``rows`` times, without a Python object per row."""
    return pc.fill_null(pa.nulls(rows, type_), pa.scalar(value, type_))


def message_batch(
    topic_id: int, published_at: datetime, keys, bodies, content_types, properties
) -> pa.RecordBatch:
    """One batch of ``MESSAGE_SCHEMA``: the messages' columns (Arrow arrays, or lists for
    ``pa.array``) with the topic and the publish time of every row."""
    rows = len(bodies)
    return pa.RecordBatch.from_arrays(
        [
            constant(topic_id, rows, pa.int32()),
            _array(keys, pa.string()),
            _array(bodies, pa.binary()),
            _array(content_types, pa.string()),
            _array(properties, pa.string()),
            constant(published_at, rows, MESSAGE_SCHEMA.field("published_at").type),
        ],
        schema=MESSAGE_SCHEMA,
    )


def _array(values, type_: pa.DataType) -> pa.Array:
    """An Arrow array of ``type_``: ``values`` cast (a large_string from Spark, say) or made."""
    return values.cast(type_) if isinstance(values, pa.Array) else pa.array(values, type_)


# "COPY messages, line 12" or "COPY messages, line 12, column key": the row a COPY refused.
_COPY_LINE = re.compile(r"COPY \S+, line (\d+)(?:, column (\w+))?")


def refused_row(error: psycopg.Error) -> tuple[int, str | None] | None:
    """(index of the row, from 0; the column, or None) that PostgreSQL names in the context of an
    error raised by a COPY, or None when it names none."""
    match = _COPY_LINE.search(error.diag.context or "")
    return None if match is None else (int(match.group(1)) - 1, match.group(2))


def refusal(error: psycopg.Error, column: str | None) -> str:
    """What PostgreSQL refused in a row, in the words of the API's own checks."""
    if (
        isinstance(error, psycopg.errors.CheckViolation)
        and error.diag.constraint_name == "messages_json_body"
    ):
        return "body is not valid application/json (PostgreSQL's IS JSON refuses it)"
    what = column if column in ("key", "body", "properties") else "message"
    return f"{what} refused by PostgreSQL: {error.diag.message_primary}"
