"""Publish a Spark DataFrame as messages, exactly once per batch id, at the speed of COPY.

Every Spark task stages its partition with a binary COPY into ``publish_staging`` (psycopg, with
the application's own libpq connection string: Unix sockets, several hosts, ``sslmode`` and
service files work as everywhere else), then the driver publishes the whole batch in one
transaction. Nothing else is atomic across partitions, so the rules are:

- each run of the job stages under a run id of its own, and each partition once per run: a task
  attempt that finds its partition claimed (an earlier attempt committed it, or a speculative
  twin) stages nothing; two runs of one batch at once (a zombie task and its retry) never touch
  each other's rows;
- the publishing transaction claims the batch id first: only one run publishes; it checks that
  every partition its tasks reported is staged, with the rows they reported, and that as many
  messages were published; anything else rolls it back with ``PublishError``;
- a batch id means one batch: its fingerprint (row count and a sum of row hashes, the same as the
  API computes) must match the published one, or ``BatchConflictError``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg

from redelivery.config import cached_config
from redelivery.errors import MalformedMessageError, PublishError
from redelivery.messaging.codec import (
    BINARY,
    JSON,
    TEXT,
    Message,
    add_fingerprints,
    encode,
    fingerprint,
    row_hash,
)
from redelivery.messaging.publishing import (
    STAGING_TYPES,
    NeedPartition,
    check_batch_id,
    check_same_batch,
    copy_cursor,
)
from redelivery.spark.session import functions_for
from redelivery.store import catalog, db
from redelivery.store import statements as S
from redelivery.store.log import ensure_partition

RESULT_SCHEMA = "part long, rows long, fingerprint string, staged boolean, error string"


def message_columns(df):
    """``df`` as the columns of a message: ``key`` (string, optional), ``body`` (string: JSON text,
    or binary: application/octet-stream), ``content_type`` (string, optional), ``properties`` (a
    map of strings or a JSON object as a string, optional). Raises ``MalformedMessageError`` naming
    a missing or wrongly typed column."""
    F = functions_for(df)  # noqa: N806
    types = dict(df.dtypes)
    if "body" not in types:
        raise MalformedMessageError(f"the DataFrame has no 'body' column (columns: {sorted(types)})")
    expected = {"body": ("string", "binary"), "key": ("string",), "content_type": ("string",),
                "properties": ("string", "map<string,string>")}  # fmt: skip
    for name, allowed in expected.items():
        if name in types and types[name] not in allowed:
            raise MalformedMessageError(f"column {name!r} is {types[name]}; it must be one of {allowed}")
    default_type = JSON if types["body"] == "string" else BINARY
    return df.select(
        F.col("key") if "key" in types else F.lit(None).cast("string").alias("key"),
        F.col("body").cast("binary").alias("body"),
        F.coalesce(F.col("content_type"), F.lit(default_type)).alias("content_type")
        if "content_type" in types
        else F.lit(default_type).alias("content_type"),
        F.to_json(F.col("properties")).alias("properties")
        if types.get("properties", "").startswith("map")
        else (F.col("properties") if "properties" in types else F.lit(None).cast("string")).alias(
            "properties"
        ),
    )


#: The columns of ``message_columns`` as an error names them.
_COLUMN_NAMES = ("key", "body", "content type", "properties")


def _column(batch, column: int, part: int, first: int) -> list:
    """Column ``column`` of an Arrow batch as Python values. A Spark string holding bytes that are
    not UTF-8 (how a lone surrogate looks there) raises ``MalformedMessageError`` naming the
    partition, the message (``first`` is the batch's first message index) and the field, instead
    of a ``UnicodeDecodeError`` that would fail the task for Spark to retry."""
    values = batch.column(column)
    try:
        return values.to_pylist()
    except UnicodeDecodeError:
        for offset in range(len(values)):  # only on failure: find the row
            try:
                values[offset].as_py()
            except UnicodeDecodeError as exc:
                raise MalformedMessageError(
                    f"partition {part} message {first + offset}: {_COLUMN_NAMES[column]} is not UTF-8 "
                    f"text (byte {exc.start}: a lone surrogate or a bad byte), which PostgreSQL cannot store"
                ) from None
        raise


def _rows(batches: Iterator, part: int) -> Iterator[tuple]:
    """``codec.encode`` of every row of the Arrow batches: (key, body bytes, content type,
    properties), checked as the API checks a message (JSON text as PostgreSQL's jsonb takes it,
    a key and properties PostgreSQL can store, properties a JSON object of strings; a NULL body is
    empty). Raises ``MalformedMessageError`` naming the partition and the message's index in it."""
    index = 0
    for batch in batches:
        keys, bodies, types, props = (_column(batch, i, part, index) for i in range(4))
        for key, body, ctype, prop in zip(keys, bodies, types, props, strict=True):
            where = f"partition {part} message {index}"
            try:
                properties = json.loads(prop) if prop and prop != "{}" else {}
            except ValueError as exc:
                raise MalformedMessageError(f"{where}: properties are not JSON: {exc}") from None
            body = body or b""
            if ctype == TEXT:
                try:
                    body = body.decode()
                except UnicodeDecodeError as exc:
                    raise MalformedMessageError(f"{where}: body is not valid {TEXT}: {exc}") from None
            message = Message(body, key=key, properties=properties, content_type=ctype)
            try:
                yield encode(message, index)
            except MalformedMessageError as exc:
                raise MalformedMessageError(f"partition {part} {exc}") from None
            index += 1


def stage_partition(url: str, batch_id: str, run_id: str, stage: bool):
    """The function every task runs (``mapInArrow``): stage this partition once for run
    ``run_id`` (or, with ``stage`` false, only read it) and report (part, rows, fingerprint,
    staged by this attempt, error). A malformed row stages nothing of the partition and is
    reported as its error (the driver raises it): not a task failure, which Spark would retry."""

    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa
        from pyspark import TaskContext

        part = TaskContext.get().partitionId()
        keys = {"batch": batch_id, "stage_run": run_id, "part": part}
        rows, total, staged, content, error = 0, 0, False, None, None
        try:
            if stage:
                with db.connect(url, autocommit=True) as conn, conn.transaction():
                    if conn.execute(S.PUBLISH_PART_CLAIM, keys).fetchone() is None:
                        # an earlier attempt of this task staged the partition: report what it did
                        rows, content = conn.execute(S.PUBLISH_PART, keys).fetchone()
                    else:
                        with copy_cursor(conn).copy(S.COPY_STAGING) as copy:
                            copy.set_types(STAGING_TYPES)
                            for seq, (key, body, ctype, props) in enumerate(_rows(batches, part)):
                                copy.write_row((batch_id, run_id, part, seq, key, body, ctype, props))
                                rows, total = rows + 1, total + row_hash(key, body, ctype, props)
                        content = fingerprint(rows, total)
                        conn.execute(S.PUBLISH_PART_STAGED, {**keys, "rows": rows, "fingerprint": content})
                        staged = True
            else:  # the batch was published: only compare its content
                for key, body, ctype, props in _rows(batches, part):
                    rows, total = rows + 1, total + row_hash(key, body, ctype, props)
                content = fingerprint(rows, total)
        except MalformedMessageError as exc:  # the partition's transaction rolled back
            rows, content, staged, error = 0, None, False, str(exc)
        for _ in batches:  # drain what a skipped partition did not read
            pass
        yield pa.RecordBatch.from_pylist(
            [{"part": part, "rows": rows, "fingerprint": content, "staged": staged, "error": error}],
            schema=pa.schema([("part", pa.int64()), ("rows", pa.int64()), ("fingerprint", pa.string()),
                              ("staged", pa.bool_()), ("error", pa.string())]),
        )  # fmt: skip

    return run


def publish_dataframe(df, topic: str, batch_id: str, *, url: str | None = None, at=None) -> int:
    """Publish every row of ``df`` to ``topic`` once; return the number of messages of the batch.

    ``df`` columns: see ``message_columns``. Rows are published partition by partition, in the
    order of each partition. Running it again with the same ``batch_id`` and content publishes
    nothing more (it reads the DataFrame once to compare). Works on classic and Spark Connect
    sessions. Raises before anything is published: ``UnknownTopicError``, ``InvalidBatchIdError``,
    ``MalformedMessageError`` (a bad column, or a body PostgreSQL does not take as JSON),
    ``BatchConflictError`` (the batch id was published to another topic or with other content),
    ``PublishError`` (what is staged is not what the tasks wrote)."""
    check_batch_id(batch_id)
    url = url or db.database_url()
    columns = message_columns(df)
    with db.connect(url, autocommit=True) as conn:
        topic_id = catalog.topic_id(conn, topic)
        published = conn.execute(S.PUBLISHED_BATCH, {"batch": batch_id}).fetchone()
    run_id = uuid.uuid4().hex
    reports = columns.mapInArrow(
        stage_partition(url, batch_id, run_id, published is None), RESULT_SCHEMA
    ).collect()
    return publish_staged(url, topic_id, batch_id, run_id, reports, at=at)


def publish_staged(url: str, topic_id: int, batch_id: str, run_id: str, reports: list, at=None) -> int:
    """The driver's half: publish what run ``run_id`` staged, given its tasks' ``reports`` (one
    per partition: rows, fingerprint, error), in one transaction; return the batch's message count.
    See ``publish_dataframe`` for the errors."""
    errors = sorted((r["part"], r["error"]) for r in reports if r["error"])
    if errors:  # the first partition's: the same message as the same data gives
        with db.connect(url, autocommit=True) as conn:
            _discard(conn, batch_id, run_id)
        raise MalformedMessageError(f"batch {batch_id!r}: {errors[0][1]} (this run published nothing)")
    rows = sum(r["rows"] for r in reports)
    content = add_fingerprints(r["fingerprint"] for r in reports)
    span = cached_config().retention.seconds("partition")
    with db.connect(url, autocommit=True) as conn:
        try:
            for _ in range(3):  # a partition made for the publish time, then the publish again
                try:
                    count = _publish_transaction(
                        conn, topic_id, batch_id, run_id, len(reports), rows, content, at
                    )
                    break
                except NeedPartition as need:  # rolled back: nothing was written
                    ensure_partition(conn, need.at, span)
            else:
                raise AssertionError("a partition of the log was made three times and is still missing")
        except BaseException:
            _discard(conn, batch_id, run_id)
            raise
    return count


def _publish_transaction(
    conn: psycopg.Connection,
    topic_id: int,
    batch_id: str,
    run_id: str,
    parts: int,
    rows: int,
    content: str,
    at,
) -> int:
    """One try of the driver's publish, in one transaction under the topic's publish lock: the
    batch claimed (a repeat returns the first publish's count), the staged rows moved into the log.
    Raises ``NeedPartition`` (rolled back) when no partition of the log holds the publish time."""
    with conn.transaction():
        catalog.lock_topic_for_publish(conn, topic_id)
        claim = {"batch": batch_id, "topic_id": topic_id, "count": rows, "fingerprint": content, "at": at}
        if conn.execute(S.CLAIM_PUBLISH_BATCH, claim).fetchone() is None:
            check_same_batch(conn, batch_id, topic_id, content)
            count = conn.execute(S.PUBLISHED_BATCH, {"batch": batch_id}).fetchone()[1]
        else:
            _check_staged(conn, batch_id, run_id, parts, rows)
            if conn.execute(S.BATCH_TAGGED, {"batch": batch_id}).fetchone()[0]:
                conn.execute(S.UNTAG_FORGOTTEN_BATCH, {"batch": batch_id})
            published_at, covered = conn.execute(S.PUBLISH_TIME, {"at": at}).fetchone()
            if not covered:
                raise NeedPartition(published_at)
            keys = {"topic_id": topic_id, "batch": batch_id, "stage_run": run_id, "at": published_at}
            count = conn.execute(S.STAGED_TO_MESSAGES, keys).rowcount
            if count != rows:
                raise PublishError(f"batch {batch_id!r}: {rows} rows staged but {count} messages published")
        conn.execute(S.DELETE_STAGED, {"staging": batch_id})  # every run's leftovers
    return count


def _check_staged(conn: psycopg.Connection, batch_id: str, run_id: str, partitions: int, rows: int) -> None:
    parts, part_rows, staged = conn.execute(
        S.PUBLISH_STAGED, {"batch": batch_id, "stage_run": run_id}
    ).fetchone()
    if (parts, part_rows, staged) != (partitions, rows, rows):
        raise PublishError(
            f"batch {batch_id!r}: the job's {partitions} tasks wrote {rows} rows, but the database holds "
            f"{parts} staged partitions with {part_rows} rows ({staged} staged rows): is the Spark job "
            "writing to another database? Nothing was published"
        )


def _discard(conn: psycopg.Connection, batch_id: str, run_id: str) -> None:
    """Delete this run's staged rows after a failed publish (best effort: retention cleans up)."""
    try:
        conn.execute(S.DELETE_STAGED_RUN, {"batch": batch_id, "stage_run": run_id})
    except psycopg.Error:
        pass
