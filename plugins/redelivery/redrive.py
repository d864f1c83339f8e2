"""Dead letters for operators: select, summarise, and redrive them back to READY.

A redrive selects dead letters of one group with a filter of values (never SQL: every value is a
query parameter, text matches with ``strpos``), then moves them in batches. Each batch is one
transaction: the rows leave the DLQ table, their deliveries go back to READY (or, with another
destination topic, a copy is published there and the original delivery is closed as COMMITTED),
and the audit tables record each message and the running count. So a run stopped between batches,
or killed inside one, leaves every message in exactly one place; a retried or repeated run finds
moved messages gone from the DLQ and never moves one twice. Batches keep to the rate limit.
Large selections can run as a Spark job over message-id ranges (``redrive_with_spark``).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Literal

import psycopg
from pydantic import BaseModel, ConfigDict, Field, field_validator
from psycopg.types.json import Jsonb

from . import db
from .errors import RedeliveryError, UnknownGroupError, UnknownTopicError

REASONS = ("MAX_DELIVERIES_EXCEEDED", "LEASE_EXPIRED", "REJECTED", "NEGATIVE_LEVEL")
MAX_BATCH = 500
SAMPLE_SIZE = 10
#: Above this many selected messages (and without max_messages) a redrive runs as a Spark job.
SPARK_THRESHOLD = 50_000


class DlqFilter(BaseModel):
    """Which dead letters of ``group``: all given conditions must hold. Times are timezone-aware
    (UTC assumed when naive); ``error_contains`` matches the last error, case-insensitively."""

    model_config = ConfigDict(extra="forbid")

    group: str = Field(min_length=1, max_length=59)
    topic: str | None = None
    dead_lettered_from: datetime | None = None
    dead_lettered_to: datetime | None = None
    reasons: list[Literal["MAX_DELIVERIES_EXCEEDED", "LEASE_EXPIRED", "REJECTED", "NEGATIVE_LEVEL"]] = Field(default_factory=list)
    error_contains: str | None = Field(default=None, max_length=1000)
    message_ids: list[int] = Field(default_factory=list, max_length=100_000)

    @field_validator("dead_lettered_from", "dead_lettered_to")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value

    @field_validator("topic", "error_contains")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value if value else None


class RedriveRequest(DlqFilter):
    """A redrive: the filter, then ``max_messages`` (None: all selected), ``rate_limit`` in
    messages per second (None: no limit), ``destination_topic`` (None: the original topic),
    ``reset_counts`` (delivery count and reconsume times back to 0, default on) and ``dry_run``
    (default on: report only)."""

    max_messages: int | None = Field(default=None, ge=1)
    rate_limit: float | None = Field(default=None, gt=0, le=1_000_000)
    destination_topic: str | None = None
    reset_counts: bool = True
    dry_run: bool = True

    @field_validator("destination_topic")
    @classmethod
    def _blank_dest(cls, value: str | None) -> str | None:
        return value if value else None


def _resolve(conn: psycopg.Connection, request: DlqFilter) -> dict:
    """SQL parameters of the filter; raises UnknownGroupError / UnknownTopicError."""
    row = conn.execute("SELECT id FROM consumer_groups WHERE name = %s", (request.group,)).fetchone()
    if row is None:
        raise UnknownGroupError(f"unknown consumer group {request.group!r}")
    params = {"g": row[0], "topic_id": None, "from": request.dead_lettered_from, "to": request.dead_lettered_to,
              "reasons": list(request.reasons) or None, "error": request.error_contains,
              "ids": list(request.message_ids) or None}
    if request.topic:
        found = conn.execute("SELECT id FROM topics WHERE name = %s", (request.topic,)).fetchone()
        if found is None:
            raise UnknownTopicError(f"unknown topic {request.topic!r}")
        params["topic_id"] = found[0]
    return params


FILTER_SQL = """q.group_id = %(g)s
    AND (%(topic_id)s::int IS NULL OR q.topic_id = %(topic_id)s::int)
    AND (%(from)s::timestamptz IS NULL OR q.dead_lettered_at >= %(from)s::timestamptz)
    AND (%(to)s::timestamptz IS NULL OR q.dead_lettered_at < %(to)s::timestamptz)
    AND (%(reasons)s::text[] IS NULL OR q.reason::text = ANY(%(reasons)s::text[]))
    AND (%(error)s::text IS NULL OR strpos(lower(coalesce(q.last_error, '')), lower(%(error)s::text)) > 0)
    AND (%(ids)s::bigint[] IS NULL OR q.message_id = ANY(%(ids)s::bigint[]))"""

_ROW = """q.message_id, t.name AS topic, dq.name AS dead_letter_queue, q.reason::text AS reason, q.last_error,
          q.delivery_count, q.reconsume_times, q.dead_lettered_at, q.first_failure_at, q.last_failure_at,
          q.origin_message_id, q.key"""
_FROM = """dlq_messages q JOIN topics t ON t.id = q.topic_id JOIN dead_letter_queues dq ON dq.id = q.dlq_id"""


def count(conn: psycopg.Connection, request: DlqFilter) -> int:
    """How many dead letters match. Raises UnknownGroupError / UnknownTopicError."""
    return conn.execute(f"SELECT count(*) FROM dlq_messages q WHERE {FILTER_SQL}", _resolve(conn, request)).fetchone()[0]


def select(conn: psycopg.Connection, request: DlqFilter, limit: int = 100, with_body: bool = False) -> list[dict]:
    """The matching dead letters, oldest first (``limit`` at most), as dicts of native values
    (datetimes; with ``with_body`` the body decoded by content type, the properties and the attempt
    history). ``jsonable`` turns them into JSON-ready values."""
    from .client import decode

    params = {**_resolve(conn, request), "limit": limit}
    extra = ", q.body, q.content_type, q.properties, q.attempts" if with_body else ""
    cur = conn.execute(f"SELECT {_ROW}{extra} FROM {_FROM} WHERE {FILTER_SQL} "
                       "ORDER BY q.dead_lettered_at, q.message_id LIMIT %(limit)s", params)
    names = [c.name for c in cur.description]
    rows = [dict(zip(names, values)) for values in cur.fetchall()]
    for row in rows:
        if with_body:
            row["body"] = decode(row["body"], row.pop("content_type"))
    return rows


def jsonable(rows: list[dict]) -> list[dict]:
    """``select`` rows with times as ISO strings and binary bodies as hex."""
    def value(v):
        if isinstance(v, datetime):
            return v.isoformat()
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v).hex()
        return v

    return [{k: value(v) for k, v in row.items()} for row in rows]


def summary(conn: psycopg.Connection, group: str | None = None) -> list[dict]:
    """Per group with dead letters: count, oldest and newest dead-lettering time, counts per DLQ,
    the top reasons and the top last errors (5 each)."""
    where = "WHERE g.name = %(group)s" if group else ""
    out = []
    for group_id, name, total, oldest, newest in conn.execute(
            f"""SELECT g.id, g.name, count(*), min(q.dead_lettered_at), max(q.dead_lettered_at)
                FROM dlq_messages q JOIN consumer_groups g ON g.id = q.group_id {where}
                GROUP BY 1, 2 ORDER BY 3 DESC, 2""", {"group": group}).fetchall():
        def top(expr, limit=5):
            return [{"value": v, "count": n} for v, n in conn.execute(
                f"SELECT {expr}, count(*) FROM {_FROM} WHERE q.group_id = %s GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {limit}",
                (group_id,)).fetchall()]
        out.append({"group": name, "count": total, "oldest": oldest.isoformat(), "newest": newest.isoformat(),
                    "queues": top("dq.name", 20), "top_reasons": top("q.reason::text"),
                    "top_errors": top("coalesce(q.last_error, '(none)')")})
    return out


# ---- moving -------------------------------------------------------------------------------------


def _move_batch(conn: psycopg.Connection, params: dict, run_id: int, size: int, bounds=None) -> int:
    """Move up to ``size`` selected dead letters in one transaction; return how many moved."""
    params = {**params, "n": size, "run": run_id, "lo": bounds[0] if bounds else None, "hi": bounds[1] if bounds else None}
    in_bounds = "AND (%(lo)s::bigint IS NULL OR (q.message_id >= %(lo)s::bigint AND q.message_id < %(hi)s::bigint))"
    if params["dest"] is None:
        revive = """UPDATE deliveries d SET state = 'READY',
                        delivery_count = CASE WHEN %(reset)s THEN 0 ELSE d.delivery_count END,
                        reconsume_times = CASE WHEN %(reset)s THEN 0 ELSE d.reconsume_times END,
                        delay_level = NULL, due_at = NULL, invisible_until = NULL, updated_at = now()
                    FROM removed r WHERE d.message_id = r.message_id AND d.group_id = r.group_id AND d.state = 'DLQ'
                    RETURNING d.message_id, d.group_id"""
        copies = ""
    else:  # a copy goes to the destination's groups; the original delivery is closed
        revive = """UPDATE deliveries d SET state = 'COMMITTED', last_error = 'redriven to topic ' || %(dest_name)s,
                        updated_at = now()
                    FROM removed r WHERE d.message_id = r.message_id AND d.group_id = r.group_id AND d.state = 'DLQ'
                    RETURNING d.message_id, d.group_id"""
        copies = """, copies AS (
                      INSERT INTO messages (topic_id, key, body, content_type, properties, origin_message_id)
                      SELECT %(dest)s, r.key, r.body, r.content_type, r.properties, r.origin_message_id
                      FROM removed r ORDER BY r.message_id RETURNING id, published_at),
                    fan AS (
                      INSERT INTO deliveries (message_id, group_id, topic_id, created_at, updated_at)
                      SELECT c.id, s.group_id, %(dest)s, c.published_at, c.published_at
                      FROM copies c JOIN subscriptions s ON s.topic_id = %(dest)s)"""
    with conn.transaction():
        removed, revived = conn.execute(
            f"""WITH picked AS (
                  SELECT q.dlq_id, q.group_id, q.message_id FROM dlq_messages q
                  WHERE {FILTER_SQL} {in_bounds}
                  ORDER BY q.message_id LIMIT %(n)s FOR UPDATE SKIP LOCKED),
                removed AS (
                  DELETE FROM dlq_messages q USING picked p
                  WHERE q.dlq_id = p.dlq_id AND q.group_id = p.group_id AND q.message_id = p.message_id
                  RETURNING q.message_id, q.group_id, q.key, q.body, q.content_type, q.properties, q.origin_message_id),
                revived AS ({revive}){copies},
                logged AS (
                  INSERT INTO redrive_moves (run_id, group_id, message_id)
                  SELECT %(run)s, group_id, message_id FROM revived RETURNING 1),
                counted AS (
                  UPDATE redrive_runs SET moved = moved + (SELECT count(*) FROM logged) WHERE id = %(run)s RETURNING 1)
                SELECT (SELECT count(*) FROM removed), (SELECT count(*) FROM revived) FROM counted""", params).fetchone()
        if removed != revived:  # a DLQ row whose delivery is not in DLQ: roll back, touch nothing
            raise RedeliveryError(f"redrive batch found {removed} dead letters but {revived} deliveries in DLQ state")
    return revived


def _moving_params(conn: psycopg.Connection, request: RedriveRequest) -> dict:
    params = {**_resolve(conn, request), "reset": request.reset_counts, "dest": None, "dest_name": None}
    if request.destination_topic:
        found = conn.execute("SELECT id FROM topics WHERE name = %s", (request.destination_topic,)).fetchone()
        if found is None:
            raise UnknownTopicError(f"unknown destination topic {request.destination_topic!r}")
        if not conn.execute("SELECT 1 FROM subscriptions WHERE topic_id = %s", (found[0],)).fetchone():
            raise RedeliveryError(f"destination topic {request.destination_topic!r} has no subscribed group: "
                                  "redriven messages would reach no consumer")
        params.update(dest=found[0], dest_name=request.destination_topic)
    return params


def _start(conn: psycopg.Connection, request: RedriveRequest, run_key: str, triggered_by: str | None, group_id: int):
    filter_json = request.model_dump(mode="json")
    return conn.execute(
        """INSERT INTO redrive_runs (run_key, triggered_by, group_id, filter, dry_run)
           VALUES (%s, %s, %s, %s, %s)
           ON CONFLICT (run_key) DO UPDATE SET status = CASE WHEN redrive_runs.status = 'success' THEN 'success'
                                                        ELSE 'running' END
           RETURNING id, moved, status""",
        (run_key, triggered_by, group_id, Jsonb(filter_json), request.dry_run)).fetchone()


def _finish(conn: psycopg.Connection, run_id: int, status: str, **fields) -> dict:
    sets = ", ".join(f"{k} = %({k})s" for k in fields)
    row = conn.execute(
        f"""UPDATE redrive_runs SET status = %(status)s, finished_at = now(){', ' + sets if sets else ''}
            WHERE id = %(id)s RETURNING run_key, triggered_by, filter, dry_run, status, selected, moved, sample,
                                        started_at, finished_at""",
        {"status": status, "id": run_id, **{k: (Jsonb(v) if k == "sample" else v) for k, v in fields.items()}}).fetchone()
    keys = ("run_key", "triggered_by", "filter", "dry_run", "status", "selected", "moved", "sample", "started_at", "finished_at")
    out = dict(zip(keys, row))
    out["started_at"], out["finished_at"] = out["started_at"].isoformat(), out["finished_at"].isoformat()
    return out


def redrive(request: RedriveRequest, *, run_key: str, triggered_by: str | None = None, url: str | None = None,
            log=print, should_stop=lambda: False, spark=None) -> dict:
    """Redrive the dead letters ``request`` selects and return the audit record as a dict:
    ``{"run_key", "triggered_by", "filter", "dry_run", "status", "selected", "moved", "sample",
    "started_at", "finished_at"}``. A dry run moves nothing and reports the count and a sample.

    ``run_key`` names the run in ``redrive_runs``: running the same key again resumes it (a retried
    Airflow task) and a finished key moves nothing more. ``should_stop()`` is asked between
    batches. With ``spark`` and a selection over ``SPARK_THRESHOLD`` (no ``max_messages``), the
    batches run in Spark tasks over message-id ranges, the rate limit split between them.
    Raises UnknownGroupError, UnknownTopicError, RedeliveryError before moving anything."""
    url = url or db.database_url()
    with db.connect(url, autocommit=True) as conn:
        params = _moving_params(conn, request)
        run_id, already, status = _start(conn, request, run_key, triggered_by, params["g"])
        try:
            selected = conn.execute(f"SELECT count(*) FROM dlq_messages q WHERE {FILTER_SQL}", params).fetchone()[0]
            sample = jsonable(select(conn, request, limit=SAMPLE_SIZE))
            log(f"redrive {run_key}: {selected} dead letters of group {request.group!r} match; "
                f"{'dry run' if request.dry_run else 'moving'}; already moved by this run: {already}")
            if request.dry_run or status == "success":
                return _finish(conn, run_id, "success", selected=selected, sample=sample)
            budget = None if request.max_messages is None else max(request.max_messages - already, 0)
            if spark is not None and budget is None and selected > SPARK_THRESHOLD:
                moved = _redrive_spark(spark, url, params, run_id, request.rate_limit, conn)
            else:
                moved = _redrive_loop(conn, params, run_id, budget, request.rate_limit, log, should_stop)
            log(f"redrive {run_key}: moved {moved} in this attempt")
            return _finish(conn, run_id, "success", selected=selected, sample=sample)
        except BaseException:
            conn.execute("UPDATE redrive_runs SET status = 'failed', finished_at = now() WHERE id = %s", (run_id,))
            raise


def _redrive_loop(conn, params, run_id, budget, rate, log, should_stop, bounds=None) -> int:
    """Batches until nothing is left (or the budget is spent), at most ``rate`` messages/s."""
    moved = 0
    while budget is None or moved < budget:
        size = min(MAX_BATCH, int(rate) if rate and rate >= 1 else MAX_BATCH)
        if budget is not None:
            size = min(size, budget - moved)
        started = time.monotonic()
        n = _move_batch(conn, params, run_id, size, bounds)
        moved += n
        if n:
            log(f"  batch: moved {n} (total {moved})")
        if n < size:
            break
        if rate:  # keep to the rate: this batch may not take less than n / rate seconds
            time.sleep(max(0.0, n / rate - (time.monotonic() - started)))
        if should_stop():
            log("  stopped between batches")
            break
    return moved


def _partition(url, params, run_id, rate, bounds) -> int:
    """Runs on a Spark executor: the batches of one message-id range."""
    with db.connect(url, autocommit=True) as conn:
        return _redrive_loop(conn, params, run_id, None, rate, lambda *_: None, lambda: False, bounds)


def _redrive_spark(spark, url, params, run_id, rate, conn) -> int:
    partitions = max(2, spark.sparkContext.defaultParallelism * 2)
    fractions = [i / partitions for i in range(1, partitions)]
    low, high, cuts = conn.execute(
        f"""SELECT min(message_id), max(message_id), percentile_disc(%(f)s::float8[]) WITHIN GROUP (ORDER BY message_id)
            FROM dlq_messages q WHERE {FILTER_SQL}""", {**params, "f": fractions}).fetchone()
    if low is None:
        return 0
    bounds = sorted({low, *(cuts or []), high + 1})
    ranges = list(zip(bounds[:-1], bounds[1:]))
    share = rate / len(ranges) if rate else None
    return sum(spark.sparkContext.parallelize(ranges, len(ranges)).map(
        lambda b: _partition(url, params, run_id, share, b)).collect())
