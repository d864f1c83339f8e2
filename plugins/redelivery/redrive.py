"""Redrive: move the dead letters a filter selects back to READY.

A redrive selects dead letters of one group with a filter of values (``dead_letters.DlqFilter``),
then moves them in batches. Each batch is one statement in one transaction
(``statements.REDRIVE_MOVE_BATCH``): the rows leave the DLQ table, their deliveries go back to READY
(or, with another destination topic, a copy is published there and the original delivery is closed
as COMMITTED), and the audit tables record each message and the running count. So a run stopped
between batches, or killed inside one, leaves every message in exactly one place; a retried or
repeated run finds moved messages gone from the DLQ and never moves one twice. Batches keep to the
rate limit. Large selections can run as a Spark job over message-id ranges.
"""

from __future__ import annotations

import time

import psycopg
from psycopg.types.json import Jsonb
from pydantic import Field, field_validator

from . import catalog, db
from . import statements as S
from .dead_letters import DlqFilter, filter_params, jsonable, select
from .errors import RedeliveryError
from .transitions import plan_ranges

MAX_BATCH = 500
SAMPLE_SIZE = 10
#: Above this many selected messages (and without max_messages) a redrive runs as a Spark job.
SPARK_THRESHOLD = 50_000


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


def _moving_params(conn: psycopg.Connection, request: RedriveRequest) -> dict:
    params = {**filter_params(conn, request), "reset": request.reset_counts, "dest": None, "dest_name": None}
    if request.destination_topic:
        dest = catalog.topic_id(conn, request.destination_topic, what="destination topic")
        if not catalog.subscribed_groups(conn, dest):
            raise RedeliveryError(
                f"destination topic {request.destination_topic!r} has no subscribed group: "
                "redriven messages would reach no consumer"
            )
        params.update(dest=dest, dest_name=request.destination_topic)
    return params


def _move_batch(conn: psycopg.Connection, params: dict, run_id: int, size: int, bounds=None) -> int:
    """Move up to ``size`` selected dead letters in one transaction; return how many moved."""
    params = {
        **params,
        "n": size,
        "run": run_id,
        "lo": bounds[0] if bounds else None,
        "hi": bounds[1] if bounds else None,
    }
    with conn.transaction():
        removed, revived = conn.execute(S.REDRIVE_MOVE_BATCH, params).fetchone()
        if removed != revived:  # a DLQ row whose delivery is not in DLQ: roll back, touch nothing
            raise RedeliveryError(
                f"redrive batch found {removed} dead letters but {revived} deliveries in DLQ state"
            )
    return revived


def _finish(
    conn: psycopg.Connection,
    run_id: int,
    status: str,
    selected: int | None = None,
    sample: list | None = None,
) -> dict:
    cur = conn.execute(
        S.REDRIVE_RUN_FINISH,
        {
            "run": run_id,
            "status": status,
            "selected": selected,
            "sample": Jsonb(sample) if sample is not None else None,
        },
    )
    out = dict(zip([c.name for c in cur.description], cur.fetchone(), strict=True))
    out["started_at"], out["finished_at"] = out["started_at"].isoformat(), out["finished_at"].isoformat()
    return out


def redrive(
    request: RedriveRequest,
    *,
    run_key: str,
    triggered_by: str | None = None,
    url: str | None = None,
    log=print,
    should_stop=lambda: False,
    spark=None,
) -> dict:
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
        run_id, already, status = conn.execute(
            S.REDRIVE_RUN_START,
            {
                "run_key": run_key,
                "triggered_by": triggered_by,
                "g": params["g"],
                "filter": Jsonb(request.model_dump(mode="json")),
                "dry_run": request.dry_run,
            },
        ).fetchone()
        try:
            selected = conn.execute(S.DLQ_COUNT, params).fetchone()[0]
            sample = jsonable(select(conn, request, limit=SAMPLE_SIZE))
            log(
                f"redrive {run_key}: {selected} dead letters of group {request.group!r} match; "
                f"{'dry run' if request.dry_run else 'moving'}; already moved by this run: {already}"
            )
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
            _finish(conn, run_id, "failed")
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
    ranges = plan_ranges(conn, S.PLAN_REDRIVE_RANGES, params, partitions)
    if not ranges:
        return 0
    share = rate / len(ranges) if rate else None
    return sum(
        spark.sparkContext.parallelize(ranges, len(ranges))
        .map(lambda b: _partition(url, params, run_id, share, b))
        .collect()
    )
