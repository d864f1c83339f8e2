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

import functools
import json
import time
from collections.abc import Callable

import psycopg
from psycopg.types.json import Jsonb
from pydantic import Field, field_validator, model_validator

from . import catalog, db
from . import statements as S
from .config import cached_config
from .dead_letters import DlqFilter, filter_params, jsonable, select
from .errors import RedeliveryError
from .names import check_name
from .policies import MAX_INT
from .spark.tasks import default_parallelism, run_in_tasks
from .transitions import plan_ranges

MAX_BATCH = 500
SAMPLE_SIZE = 10


class RedriveRequest(DlqFilter):
    """A redrive: the filter, then ``max_messages`` (None: all selected), ``rate_limit`` in
    messages per second (None: no limit), ``destination_topic`` (None: the original topic),
    ``reset_reconsume_times`` (default on: the retry budget is restored, reconsume times back to 0;
    the delivery count is never reset) and ``dry_run`` (default on: report only)."""

    max_messages: int | None = Field(default=None, ge=1, le=MAX_INT)
    rate_limit: float | None = Field(default=None, gt=0, le=1_000_000)
    destination_topic: str | None = None
    reset_reconsume_times: bool = True
    dry_run: bool = True

    @field_validator("destination_topic")
    @classmethod
    def _dest_name(cls, value: str | None) -> str | None:
        return check_name("topic", value) if value else None

    @model_validator(mode="after")
    def _dest_is_another_topic(self) -> RedriveRequest:
        if self.destination_topic is not None and self.destination_topic == self.topic:
            raise ValueError(
                f"destination_topic {self.destination_topic!r} is the topic the dead letters come from: "
                "leave it empty to move them back to it"
            )
        return self

    def selection(self) -> dict:
        """What the run moves, as JSON (the dry-run flag aside): a run key stands for one selection."""
        return self.model_dump(mode="json", exclude={"dry_run"})


def _moving_params(conn: psycopg.Connection, request: RedriveRequest) -> dict:
    params = {
        **filter_params(conn, request),
        "reset": request.reset_reconsume_times,
        "dest": None,
        "dest_name": None,
    }
    if request.destination_topic:
        dest = catalog.topic_id(conn, request.destination_topic, what="destination topic")
        if not catalog.subscribed_groups(conn, dest):
            raise RedeliveryError(
                f"destination topic {request.destination_topic!r} has no subscribed group: "
                "redriven messages would reach no consumer"
            )
        params.update(dest=dest, dest_name=request.destination_topic)
        own = conn.execute(S.DLQ_COUNT_FROM_TOPIC, params).fetchone()[0]
        if own:
            raise RedeliveryError(
                f"{own} selected dead letters come from topic {request.destination_topic!r} itself: "
                "a copy cannot go to its own topic; redrive them without a destination"
            )
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
        if params["dest"] is not None:  # its copies are messages of that topic: hold it as a publish does
            catalog.lock_topic(conn, params["dest"])
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
    params = {
        "run": run_id,
        "status": status,
        "selected": selected,
        "sample": Jsonb(sample) if sample is not None else None,
    }
    cur = conn.execute(S.REDRIVE_RUN_FINISH, params)
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
    should_stop: Callable[[], bool] = lambda: False,
    spark=None,
    spark_threshold: int | None = None,
    wait: Callable[[float], object] = time.sleep,
) -> dict:
    """Redrive the dead letters ``request`` selects and return the audit record as a dict:
    ``{"run_key", "triggered_by", "filter", "dry_run", "status", "selected", "moved", "sample",
    "started_at", "finished_at"}``. A dry run moves nothing and reports the count and a sample.

    ``run_key`` names the run in ``redrive_runs``: running the same key again resumes it (a retried
    Airflow task; a real run after a dry run under the same key moves) and a finished key moves
    nothing more; a key stands for one selection. ``should_stop()`` is asked between batches: the
    run then ends with status ``stopped``, every message in one place, and resumes under its key.
    ``wait(seconds)`` paces the batches (an interruptible wait lets a stop cut a pause short).
    With ``spark`` and a selection of at least ``spark_threshold`` messages (default: the config's
    ``spark_threshold``; no ``max_messages``), the batches run in Spark tasks over message-id
    ranges, paced together.
    Raises UnknownGroupError, UnknownTopicError, RedeliveryError before moving anything."""
    url = url or db.database_url()
    with db.connect(url, autocommit=True) as conn:
        params = _moving_params(conn, request)
        start = {
            "run_key": run_key,
            "triggered_by": triggered_by,
            "g": params["g"],
            "dry_run": request.dry_run,
        }
        start["filter"] = Jsonb(request.model_dump(mode="json"))
        run_id, already, status, is_dry, selection = conn.execute(S.REDRIVE_RUN_START, start).fetchone()
        if {k: v for k, v in selection.items() if k != "dry_run"} != request.selection():
            raise RedeliveryError(
                f"run key {run_key!r} is a redrive of another selection: {json.dumps(selection)}"
            )
        try:
            selected = conn.execute(S.DLQ_COUNT, params).fetchone()[0]
            sample = jsonable(select(conn, request, limit=SAMPLE_SIZE))
            log(
                f"redrive {run_key}: {selected} dead letters of group {request.group!r} match; "
                f"{'dry run' if is_dry else 'moving'}; already moved by this run: {already}"
            )
            if is_dry or status == "success":
                return _finish(conn, run_id, "success", selected=selected, sample=sample)
            budget = None if request.max_messages is None else max(request.max_messages - already, 0)
            threshold = cached_config().spark_threshold if spark_threshold is None else spark_threshold
            if spark is not None and budget is None and selected >= threshold:
                moved, stopped = _redrive_spark(spark, url, params, run_id, request.rate_limit, conn), False
            else:
                pace = Pace(conn, run_id, request.rate_limit, wait)
                moved, stopped = _redrive_loop(conn, params, run_id, budget, pace, log, should_stop)
            log(f"redrive {run_key}: moved {moved} in this attempt{' and stopped' if stopped else ''}")
            return _finish(
                conn, run_id, "stopped" if stopped else "success", selected=selected, sample=sample
            )
        except BaseException:
            _finish(conn, run_id, "failed")
            raise


class Pace:
    """Keeps a run's batches to ``rate`` messages per second: each batch first reserves its share
    of the run's schedule in ``redrive_runs`` (all the run's tasks share it) and waits for its
    slot, so there are no bursts, below 1 message/s included."""

    def __init__(self, conn: psycopg.Connection, run_id: int, rate: float | None, wait=time.sleep):
        self.conn, self.run_id, self.rate, self.wait = conn, run_id, rate, wait

    def batch_size(self) -> int:
        """Messages per batch: at most one second's worth (one message below 1 message/s)."""
        return MAX_BATCH if not self.rate else max(1, min(MAX_BATCH, int(self.rate)))

    def before(self, size: int) -> None:
        if self.rate:
            params = {"run": self.run_id, "seconds": size / self.rate}
            delay = self.conn.execute(S.RESERVE_REDRIVE_SLOT, params).fetchone()[0]
            if delay > 0:
                self.wait(float(delay))


def _redrive_loop(
    conn, params, run_id, budget, pace: Pace, log, should_stop, bounds=None
) -> tuple[int, bool]:
    """Batches until nothing is left or the budget is spent: (moved, stopped by should_stop)."""
    moved = 0
    while budget is None or moved < budget:
        size = pace.batch_size() if budget is None else min(pace.batch_size(), budget - moved)
        pace.before(size)
        if should_stop():  # between two batches (a stop that came during the wait included)
            log("  stopped between batches")
            return moved, True
        n = _move_batch(conn, params, run_id, size, bounds)
        moved += n
        if n:
            log(f"  batch: moved {n} (total {moved})")
        if n < size:
            break
    return moved, False


def _range_task(url: str, params: dict, run_id: int, rate: float | None, bounds: tuple[int, int]) -> int:
    """One Spark task: the batches of one message-id range, paced with the run's other tasks."""
    with db.connect(url, autocommit=True) as conn:
        return _redrive_loop(
            conn, params, run_id, None, Pace(conn, run_id, rate), lambda *_: None, lambda: False, bounds
        )[0]


def _redrive_spark(spark, url, params, run_id, rate, conn) -> int:
    partitions = 2 * default_parallelism(spark)
    ranges = plan_ranges(conn, S.PLAN_REDRIVE_RANGES, params, partitions)
    return sum(run_in_tasks(spark, functools.partial(_range_task, url, params, run_id, rate), ranges))
