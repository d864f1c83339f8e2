"""A publish's rows as the log's COPY: JSON bodies checked a chunk at a time for what only jsonb
refuses, the message named by its index in the call. Pure: no server (PostgreSQL's own part of the
check runs in tests/messaging/test_bad_input.py)."""

from datetime import UTC, datetime

import pytest

from redelivery.errors import MalformedMessageError
from redelivery.messaging import copy_rows
from redelivery.messaging.codec import BINARY, JSON

NOW = datetime(2026, 11, 26, tzinfo=UTC)


def columns(bodies: list[bytes], content_type: str = JSON) -> tuple:
    return ([None] * len(bodies), bodies, [content_type] * len(bodies), ["{}"] * len(bodies))


@pytest.mark.parametrize(
    "body,needle",
    [
        (b'"a\\u0000b"', "u0000"),
        (b'"\\ud800"', "surrogate"),
        (b"1e131072", "numeric"),
        (b"[" * 5000 + b"]" * 5000, "recursion"),  # deeper than Python decodes
    ],
)
def test_what_only_jsonb_refuses_names_its_message_across_chunks(monkeypatch, body, needle):
    monkeypatch.setattr(copy_rows, "CHUNK_ROWS", 2)
    bodies = [b'{"n": 1}'] * 3 + [body]
    with pytest.raises(
        MalformedMessageError, match=f"message 3: body is not valid application/json: .*{needle}"
    ):
        list(copy_rows.chunks(1, NOW, columns(bodies)))


@pytest.mark.parametrize(
    "body",
    [
        b'"a\\\\u0000b"',
        b'"\\ud83d\\ude00"',
        b"1e-999",
        b"1E+1000",
        b"[" * 400 + b"]" * 400,
        b'"' + b"x" * 20_000 + b'"',
    ],
)
def test_a_body_jsonb_takes_passes_even_when_it_looks_like_a_hazard(body):
    assert len(list(copy_rows.chunks(1, NOW, columns([b"{}", body])))) == 1


def test_only_json_bodies_are_looked_at():
    assert list(copy_rows.chunks(1, NOW, columns([b'"\\u0000"'], BINARY)))


def test_a_chunk_holds_a_few_mb_of_bodies_whatever_their_size(monkeypatch):
    """Rows go in chunks of at most CHUNK_ROWS rows and, past a chunk's first row, CHUNK_BYTES of
    bodies: a staged chunk stays far below PostgreSQL's 1 GB for a value, memory stays warm."""
    monkeypatch.setattr(copy_rows, "CHUNK_BYTES", 100)
    monkeypatch.setattr(copy_rows, "CHUNK_ROWS", 3)
    assert list(copy_rows.row_ranges([40, 40, 40, 10, 10, 10, 10, 500, 1])) == [
        (0, 2), (2, 5), (5, 7), (7, 8), (8, 9)
    ]  # fmt: skip
    assert list(copy_rows.row_ranges([])) == []
    bodies = [b'"' + b"x" * 60 + b'"'] * 5
    assert len(list(copy_rows.chunks(1, NOW, columns(bodies)))) == 5  # 62 B each: one a chunk
    import pyarrow as pa

    batch = pa.RecordBatch.from_pydict({"body": pa.array(bodies, pa.binary()), "n": list(range(5))})
    assert [s.column("n").to_pylist() for s in copy_rows.slices(batch)] == [[0], [1], [2], [3], [4]]
