"""Publish a Spark DataFrame as messages, exactly once per batch id, at the speed of COPY.

Every Spark task checks its partition's Arrow batches and encodes them in PostgreSQL's binary COPY
format (``messaging.copy_rows``, pgpq: no Python object per row), and stages them as chunks in
``publish_staging`` (psycopg, with the application's own libpq connection string: Unix sockets,
several hosts, ``sslmode`` and service files work as everywhere else). Then the driver publishes
the whole batch in one transaction: one COPY into the log, fed with the staged chunks. Nothing else
is atomic across partitions, so the rules are:

- each run of the job stages under a run id of its own, and each partition once per run: a task
  attempt that finds its partition claimed (an earlier attempt committed it, or a speculative
  twin) stages nothing; two runs of one batch at once (a zombie task and its retry) never touch
  each other's rows;
- the publishing transaction claims the batch id first: only one run publishes; it checks that
  every partition its tasks reported is staged, with the rows they reported, and that as many
  messages were written; anything else rolls it back with ``PublishError``;
- a batch id means one batch: PostgreSQL fingerprints a repeat's content as it fingerprinted the
  batch (whichever publisher published it), and a different one raises ``BatchConflictError``.

What a task checks, with vectorized Arrow functions: keys are UTF-8 without NUL, content types are
known, properties are absent, and JSON bodies hold none of what only jsonb refuses
(``copy_rows.check_json_bodies``). A batch that any of these cannot vouch for (properties, a text
body, a hazard) is checked message by message as the API checks it. That a JSON body is JSON,
PostgreSQL checks as the driver's COPY writes it, and its error names the row.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime

import psycopg

from redelivery.config import cached_config
from redelivery.errors import MalformedMessageError, PublishError
from redelivery.messaging.codec import (
    BINARY,
    JSON,
    TEXT,
    Message,
    encode,
)
from redelivery.messaging.publishing import (
    NeedPartition,
    check_batch_id,
    check_repeated_batch,
    record_published_batch,
    refused_rows,
    write_copy,
)
from redelivery.messaging.waiting import wake
from redelivery.spark.deploy import map_partitions
from redelivery.spark.session import functions_for
from redelivery.store import catalog, db
from redelivery.store import statements as S
from redelivery.store.log import PartitionChanged, ensure_partition, lock_partition_for_publish

RESULT_SCHEMA = "part long, rows long, staged boolean, error string"


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


def _encoded_rows(batch, part: int, first: int) -> Iterator[tuple]:
    """``codec.encode`` of every row of an Arrow batch: (key, body bytes, content type, properties),
    checked as the API checks a message (a key and properties PostgreSQL can store, properties a
    JSON object of strings, a JSON text free of what only jsonb refuses; a NULL body is empty).
    Raises ``MalformedMessageError`` naming the partition and the message's index in it."""
    keys, bodies, types, props = (_column(batch, i, part, first) for i in range(4))
    for index, (key, body, ctype, prop) in enumerate(zip(keys, bodies, types, props, strict=True), first):
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


def _vouched(batch) -> bool:
    """Whether the vectorized checks vouch for every row of a ``message_columns`` batch (see the
    module's docstring); if not, it is checked message by message."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys, bodies, types, props = batch.columns
    try:
        keys.validate(full=True)  # UTF-8
    except pa.ArrowInvalid:
        return False
    return (
        not pc.any(pc.match_substring(keys, "\x00")).as_py()
        and pc.all(pc.is_in(types, value_set=pa.array([JSON, BINARY]))).as_py() is not False
        and pc.all(pc.or_(pc.is_null(props), pc.equal(props, "{}"))).as_py() is not False
    )


def message_batch(batch, part: int, first: int, topic_id: int, published_at: datetime):
    """A ``message_columns`` Arrow batch as a batch of the log's COPY (``copy_rows.MESSAGE_SCHEMA``),
    checked (see the module's docstring); ``MalformedMessageError`` names the partition and the
    message (``first``: the index of the batch's first message in its partition)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from redelivery.messaging import copy_rows

    batch = pa.RecordBatch.from_arrays(  # the types of message_columns (a column of nulls has none)
        [
            c.cast(t)
            for c, t in zip(batch.columns, (pa.string(), pa.binary(), pa.string(), pa.string()), strict=True)
        ],
        names=["key", "body", "content_type", "properties"],
    )
    if _vouched(batch):
        keys, bodies, types = batch.column(0), batch.column(1), batch.column(2)
        bodies = pc.fill_null(bodies, pa.scalar(b"", pa.binary()))
        properties = copy_rows.constant("{}", batch.num_rows, pa.string())
        checked = copy_rows.message_batch(topic_id, published_at, keys, bodies, types, properties)
    else:
        rows = list(_encoded_rows(batch, part, first))
        checked = copy_rows.message_batch(
            topic_id,
            published_at,
            [r[0] for r in rows],
            [r[1] for r in rows],
            [r[2] for r in rows],
            [json.dumps(r[3]) if r[3] else "{}" for r in rows],
        )
    copy_rows.check_json_bodies(checked, lambda row: f"partition {part} message {first + row}")
    return checked


def stage_partition(url: str, topic_id: int, batch_id: str, run_id: str, published_at: datetime):
    """The function every task runs (``mapInArrow``): stage this partition once for run
    ``run_id``, a chunk per Arrow batch, and report (part, rows, staged by this attempt, error). A
    malformed row stages nothing of the partition and is reported as its error (the driver raises
    it): not a task failure, which Spark would retry."""

    def run(batches: Iterator) -> Iterator:
        import pyarrow as pa
        from pyspark import TaskContext

        from redelivery.messaging.copy_rows import encode_rows, slices

        part = TaskContext.get().partitionId()
        keys = {"batch": batch_id, "stage_run": run_id, "part": part}
        rows, staged, error = 0, False, None
        try:
            with db.connect(url, autocommit=True) as conn, conn.transaction():
                if conn.execute(S.PUBLISH_PART_CLAIM, keys).fetchone() is None:
                    # an earlier attempt of this task staged the partition: report what it did
                    rows = conn.execute(S.PUBLISH_PART, keys).fetchone()[0]
                else:
                    seq = 0
                    for batch in batches:
                        for piece in slices(batch):  # a chunk stays a few MB, whatever the bodies
                            data = encode_rows(message_batch(piece, part, rows, topic_id, published_at))
                            chunk = {**keys, "seq": seq, "rows": piece.num_rows, "data": data}
                            conn.execute(S.STAGE_CHUNK, chunk)
                            rows, seq = rows + piece.num_rows, seq + 1
                    conn.execute(S.PUBLISH_PART_STAGED, {**keys, "rows": rows})
                    staged = True
        except MalformedMessageError as exc:  # the partition's transaction rolled back
            rows, staged, error = 0, False, str(exc)
        for _ in batches:  # drain what a skipped partition did not read
            pass
        yield pa.RecordBatch.from_pylist(
            [{"part": part, "rows": rows, "staged": staged, "error": error}],
            schema=pa.schema([("part", pa.int64()), ("rows", pa.int64()), ("staged", pa.bool_()),
                              ("error", pa.string())]),
        )  # fmt: skip

    return run


def publish_dataframe(df, topic: str, batch_id: str, *, url: str | None = None, at=None) -> int:
    """Publish every row of ``df`` to ``topic`` once; return the number of messages of the batch.

    ``df`` columns: see ``message_columns``. Rows are published partition by partition, in the
    order of each partition, at ``at`` (default: the database's clock when the job starts).
    Running it again with the same ``batch_id`` and content publishes nothing more (it stages the
    DataFrame once more, to compare). Works on classic and Spark Connect sessions. Raises before
    anything is published: ``UnknownTopicError``, ``InvalidBatchIdError``, ``MalformedMessageError``
    (a bad column, or a row PostgreSQL does not take: a body that is not JSON, a key or properties
    it cannot store), ``BatchConflictError`` (the batch id was published to another topic or with
    other content), ``PublishError`` (what is staged is not what the tasks wrote)."""
    check_batch_id(batch_id)
    url = url or db.database_url()
    columns = message_columns(df)
    with db.connect(url, autocommit=True) as conn:
        topic_id = catalog.topic_id(conn, topic)
        published_at = conn.execute(S.PUBLISH_TIME, {"at": at}).fetchone()[0]
    run_id = uuid.uuid4().hex
    reports = map_partitions(
        columns, stage_partition(url, topic_id, batch_id, run_id, published_at), RESULT_SCHEMA
    )
    return publish_staged(url, topic_id, batch_id, run_id, reports, at=published_at)


def publish_staged(url: str, topic_id: int, batch_id: str, run_id: str, reports: list, at: datetime) -> int:
    """The driver's half: publish what run ``run_id`` staged (its messages published at ``at``),
    given its tasks' ``reports`` (one per partition: rows, error), in one transaction; return the
    batch's message count. See ``publish_dataframe`` for the errors."""
    errors = sorted((r["part"], r["error"]) for r in reports if r["error"])
    if errors:  # the first partition's: the same message as the same data gives
        with db.connect(url, autocommit=True) as conn:
            _discard(conn, batch_id, run_id)
        raise MalformedMessageError(f"batch {batch_id!r}: {errors[0][1]} (this run published nothing)")
    staged = _Staged(url, batch_id, run_id, {r["part"]: r["rows"] for r in reports})
    span = cached_config().retention.seconds("partition")
    with db.connect(url, autocommit=True) as conn:
        try:
            for _ in range(3):  # a partition made for the publish time, then the publish again
                try:
                    count = _publish_transaction(conn, topic_id, staged, at)
                    break
                except NeedPartition as need:  # rolled back: nothing was written
                    ensure_partition(conn, need.at, span)
                except PartitionChanged:  # retention dropped it while we waited: rolled back, again
                    continue
            else:
                raise AssertionError("a partition of the log was made three times and is still missing")
        except BaseException:
            _discard(conn, batch_id, run_id)
            raise
    return count


class _Staged:
    """What a publish job run staged: its partitions' row counts (from the tasks' reports) and its
    chunks, streamed in publishing order from a connection of their own (the publishing one is in
    its COPY meanwhile); ``describe`` names the message of a row of that order."""

    def __init__(self, url: str, batch_id: str, run_id: str, rows_by_part: dict[int, int]):
        self.url, self.batch_id, self.run_id, self.rows_by_part = url, batch_id, run_id, rows_by_part
        self.rows = sum(rows_by_part.values())

    def chunks(self) -> Iterator[bytes]:
        with db.connect(self.url, autocommit=True) as conn, conn.transaction():
            cursor = conn.cursor(name=f"chunks-{self.run_id}", binary=True)
            cursor.itersize = 4  # chunks of a few MB each
            cursor.execute(S.STAGED_CHUNKS, {"batch": self.batch_id, "stage_run": self.run_id})
            for _, _, data in cursor:
                yield data

    def describe(self, index: int, column: str | None, error: psycopg.Error) -> str:
        from redelivery.messaging.copy_rows import refusal

        for part in sorted(self.rows_by_part):
            if index < self.rows_by_part[part]:
                break
            index -= self.rows_by_part[part]
        return f"batch {self.batch_id!r}: partition {part} message {index}: {refusal(error, column)}"


def _publish_transaction(conn: psycopg.Connection, topic_id: int, staged: _Staged, at: datetime) -> int:
    """One try of the driver's publish, in one transaction under the topic's publish lock: the
    batch claimed (a repeat with the same content returns the first publish's count), the staged
    chunks COPYed into the log, the batch's range and fingerprint recorded. Raises
    ``NeedPartition`` (rolled back) when no partition of the log holds the publish time."""
    batch_id, waited = staged.batch_id, False
    with conn.transaction():
        catalog.lock_topic_for_publish(conn, topic_id)
        claim = {"batch": batch_id, "topic_id": topic_id, "count": staged.rows, "at": at}
        if conn.execute(S.CLAIM_PUBLISH_BATCH, claim).fetchone() is None:
            with refused_rows(staged.describe):
                count = check_repeated_batch(conn, batch_id, topic_id, staged.rows, staged.chunks())
        else:
            _check_staged(conn, staged)
            _, partition = lock_partition_for_publish(conn, at)
            if partition is None:
                raise NeedPartition(at)
            floor = conn.execute(S.ID_FLOOR).fetchone()[0]
            with refused_rows(staged.describe):
                write_copy(conn, S.COPY_MESSAGES, staged.chunks())
            _, waited = record_published_batch(conn, topic_id, batch_id, floor, staged.rows, partition)
            count = staged.rows
        # this run's chunks only: another run of the batch may be comparing its own (a run whose
        # driver died leaves its chunks to retention.publish_staging)
        conn.execute(S.DELETE_STAGED_RUN, {"batch": batch_id, "stage_run": staged.run_id})
    if waited:  # committed: the waiting consumers may receive them now
        wake(conn, [(topic_id, None, count)])
    return count


def _check_staged(conn: psycopg.Connection, staged: _Staged) -> None:
    parts, part_rows, chunk_rows = conn.execute(
        S.PUBLISH_STAGED, {"batch": staged.batch_id, "stage_run": staged.run_id}
    ).fetchone()
    partitions, rows = len(staged.rows_by_part), staged.rows
    if (parts, part_rows, chunk_rows) != (partitions, rows, rows):
        raise PublishError(
            f"batch {staged.batch_id!r}: the job's {partitions} tasks wrote {rows} rows, but the database "
            f"holds {parts} staged partitions with {part_rows} rows ({chunk_rows} in their chunks): is "
            "the Spark job writing to another database? Nothing was published"
        )


def _discard(conn: psycopg.Connection, batch_id: str, run_id: str) -> None:
    """Delete this run's staged chunks after a failed publish (best effort: retention cleans up)."""
    try:
        conn.execute(S.DELETE_STAGED_RUN, {"batch": batch_id, "stage_run": run_id})
    except psycopg.Error:
        pass
