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
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb
from pydantic import Field, model_validator

from redelivery.config import RedeliveryConfig, cached_config
from redelivery.dead_letters import DlqFilter, TopicName, filter_params, jsonable, select
from redelivery.errors import RedeliveryError
from redelivery.messaging.waiting import wake
from redelivery.rules.policies import MAX_INT
from redelivery.spark.tasks import default_parallelism, run_in_tasks
from redelivery.store import catalog, db
from redelivery.store import statements as S
from redelivery.store.log import ensure_partition
from redelivery.tiers.window import plan_ranges

MAX_BATCH = 500
SAMPLE_SIZE = 10


#: The rate limit a person's redrive (the CLI, the ``dlq_redrive`` form) starts from, messages per
#: second: the API's default is no limit.
OPERATOR_RATE_LIMIT = 500


class RedriveRequest(DlqFilter):
    """A redrive: the filter, then ``max_messages`` (None: all selected), ``rate_limit`` in
    messages per second (None: no limit), ``destination_topic`` (None: the original topic),
    ``reset_reconsume_times`` (default on: the retry budget is restored, reconsume times back to 0;
    the delivery count is never reset) and ``dry_run`` (default on: report only). The one
    declaration of these fields, as ``DlqFilter`` is of the filter's (``redelivery.fields``)."""

    max_messages: int | None = Field(
        default=None,
        ge=1,
        le=MAX_INT,
        title="Max messages",
        description="Move at most this many. Empty: all that match.",
    )
    rate_limit: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        title="Rate limit (messages per second)",
        description="Move at most this many messages a second. Empty: no limit.",
        json_schema_extra={"operator_default": OPERATOR_RATE_LIMIT},
    )
    destination_topic: TopicName = Field(
        default=None,
        title="Destination topic",
        description="Empty: back to the original topic. Otherwise a copy is published there and the "
        "dead letter is closed.",
    )
    reset_reconsume_times: bool = Field(
        default=True,
        title="Restore the retry budget",
        description="On: reconsume times back to 0, so a redriven message gets its retries again. "
        "The delivery count is never reset, and the redrive is counted.",
    )
    dry_run: bool = Field(
        default=True, title="Dry run", description="On: only count and sample what would move."
    )

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
        # without a key or a signature when none is given, as runs recorded before the filter had
        # them: a resumed run matches them
        unset = {name for name in ("key", "signature") if getattr(self, name) is None}
        return self.model_dump(mode="json", exclude={"dry_run"} | unset)


def _moving_params(
    conn: psycopg.Connection, request: RedriveRequest, generations: tuple[int, float] | None = None
) -> dict:
    params = {
        **filter_params(conn, request, generations),
        "reset": request.reset_reconsume_times,
        "dest": None,
        "dest_name": None,
    }
    # the topics whose delivery rows a move back may make: the request's, or every one of the group's
    params["revived_topics"] = (
        [params["topic_id"]] if params["topic_id"] else catalog.subscribed_topics(conn, params["group_id"])
    )
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


@dataclass(frozen=True)
class Lane:
    """Dead letters a capped redrive moves together: those of topic id ``topic_filter`` (None: the
    request's own filter), becoming READY on topic id ``target`` for groups ``caps`` ((group id,
    max_ready_backlog) pairs) whose READY backlog stays at or below its cap."""

    topic_filter: int | None
    target: int
    caps: tuple[tuple[int, int], ...]


def capped_lanes(conn: psycopg.Connection, config, request: RedriveRequest, params: dict) -> list[Lane]:
    """The lanes of a redrive that lands under a ready-backlog cap, RocketMQ's flow control
    (RocketMQ cloud, "Send retry and flow control"; publish and tier runs keep the same caps), or
    [] when none applies and the moves need no room check. Back to the original topics: one lane
    per topic of the group (the request's topic only, when it names one), each capped by the
    group's policy on it. To another topic: one lane, capped by every capped group of that topic.
    A subscription whose policy cannot be resolved has no known cap (as in publish)."""
    if params["dest"] is not None:
        pairs = [(params["dest"], g) for g in catalog.subscribed_groups(conn, params["dest"])]
    else:
        group_id = params["group_id"]
        topics = [params["topic_id"]] if params["topic_id"] else catalog.subscribed_topics(conn, group_id)
        pairs = [(t, params["group_id"]) for t in topics]
    policies = catalog.effective_policies(conn, config, pairs, problems={})
    caps = {pair: p.max_ready_backlog for pair, p in policies.items() if p.max_ready_backlog is not None}
    if not caps:
        return []
    if params["dest"] is not None:
        return [Lane(params["topic_id"], params["dest"], tuple((g, c) for (_, g), c in sorted(caps.items())))]
    return [Lane(t, t, ((g, caps[(t, g)]),) if (t, g) in caps else ()) for t, g in pairs]


def _room(conn: psycopg.Connection, lane: Lane) -> int | None:
    """Free places under the lane's caps, inside the batch's transaction, under the topic's
    backlog lock (taken by publishers and tier runs too); None: no cap."""
    if not lane.caps:
        return None
    catalog.lock_backlog(conn, lane.target)
    return _places(conn, lane)


def _places(conn: psycopg.Connection, lane: Lane) -> int:
    return max(min(cap - catalog.ready_count(conn, g, lane.target) for g, cap in lane.caps), 0)


def could_move(
    conn: psycopg.Connection, config, request: RedriveRequest, generations: tuple[int, float] | None = None
) -> bool:
    """Whether a redrive of ``request`` would move something now: a matching dead letter in a lane
    with room under its ready-backlog caps (``capped_lanes``), or in any lane when none is capped,
    or one that holds its key (moved back whatever the caps, as ``_move_batch_once`` does). A peek
    without the backlog lock: the run's batches check the room again under it. A standing redrive
    asks first, so that a cap that stays full writes no redrive run at each tick. Raises as
    ``redrive`` does, before moving anything."""
    params = _moving_params(conn, request, generations)
    lanes = capped_lanes(conn, config, request, params)
    if not lanes:
        return bool(conn.execute(S.DLQ_COUNT, params).fetchone()[0])
    for lane in lanes:
        lane_params = {**params, "topic_id": lane.topic_filter}
        if not conn.execute(S.DLQ_COUNT, lane_params).fetchone()[0]:
            continue
        if not lane.caps or _places(conn, lane) > 0:
            return True
        if params["dest"] is None and conn.execute(S.DLQ_COUNT_HOLDING, lane_params).fetchone()[0]:
            return True
    return False


#: How often a batch runs again after a retention run dropped a partition it writes to.
PARTITION_ATTEMPTS = 3


def _move_batch(
    conn: psycopg.Connection, params: dict, run_id: int, size: int, bounds=None, lane: Lane | None = None
) -> tuple[int, bool]:
    """Move up to ``size`` selected dead letters in one transaction: (moved, the lane's cap is
    reached). A batch that finds no partition of the log for a message it puts back (made before
    the first batch, then dropped by a retention run during a pause: still empty, nothing held it)
    rolls back, makes the partitions again and runs again. A batch that would give an ordered
    subscription's key a second head (a head the batch saw was deleted meanwhile, and the key's
    next message promoted: ``deliveries_one_head`` refuses it), or a deadlock victim, changed
    nothing and runs again."""

    def once() -> tuple[int, bool]:
        return db.retry_lock_conflicts(
            lambda: _move_batch_once(conn, params, run_id, size, bounds, lane), conflicts=db.HEAD_CONFLICTS
        )

    for _ in range(PARTITION_ATTEMPTS - 1):
        try:
            return _woken(conn, params, once())
        except psycopg.errors.CheckViolation as error:
            if error.diag.constraint_name:  # a real check, not "no partition ... found for row"
                raise
            _make_partitions(conn, params, params["partition_span"])
    return _woken(conn, params, once())


def _woken(conn: psycopg.Connection, params: dict, result: tuple[int, bool]) -> tuple[int, bool]:
    """``result`` of a committed batch, its topic's waiting consumers woken when it moved some."""
    if result[0]:
        if params.get("dest"):  # a copy published there: every group of that topic
            wake(conn, [(params["dest"], None, result[0])])
        else:
            wake(conn, [(topic_id, params["group_id"], result[0]) for topic_id in params["revived_topics"]])
    return result


def _move_batch_once(
    conn: psycopg.Connection, params: dict, run_id: int, size: int, bounds=None, lane: Lane | None = None
) -> tuple[int, bool]:
    params = {
        **params,
        "batch_size": size,
        "run": run_id,
        "low": bounds[0] if bounds else None,
        "high": bounds[1] if bounds else None,
    }
    if params["dest"] is not None:  # the partition its copies go to (a run may cross the hour)
        ensure_partition(conn, conn.execute(S.DB_NOW).fetchone()[0], params["partition_span"])
    with conn.transaction():
        if params["dest"] is not None:  # its copies are messages of that topic: hold it as a publish does
            catalog.lock_topic_for_publish(conn, params["dest"])
        else:  # delivery rows come back: their topics may not be deleted under them
            catalog.lock_topics_shared(conn, params["revived_topics"])
        # an ordered subscription's receives and this batch take turns (RECEIVE_ORDERED's rule);
        # its HALTED heads too, when their dead letters leave for another topic
        conn.execute(S.LOCK_ORDERED_SUBSCRIPTIONS, {"group_id": params["group_id"]})
        room = _room(conn, lane) if lane is not None else None
        holding = 0
        if room is not None and room < size and params["dest"] is None:
            # a dead letter holding its key goes back whatever the cap: its key's messages wait for it
            holding = _move(conn, {**params, "holding_only": True})
            size, room = size - holding, max(room - holding, 0)  # they wait now too
        if room is not None:
            if room == 0 or size == 0:
                return holding, room == 0
            params["batch_size"] = min(size, room)
        moved = _move(conn, {**params, "holding_only": False})
    return holding + moved, room is not None and moved >= room


def _move(conn: psycopg.Connection, params: dict) -> int:
    """One REDRIVE_MOVE_BATCH in the caller's transaction: how many dead letters it moved."""
    removed, audited = conn.execute(S.REDRIVE_MOVE_BATCH, params).fetchone()
    if removed != audited:  # every move is audited: roll back, touch nothing
        raise RedeliveryError(f"redrive batch removed {removed} dead letters but audited {audited} moves")
    return audited


def _finish(
    conn: psycopg.Connection,
    run_id: int,
    status: str,
    matched: int | None = None,
    sample: list | None = None,
    held_by_backlog_cap: int | None = None,
) -> dict:
    params = {
        "run": run_id,
        "status": status,
        "matched": matched,
        "held_by_backlog_cap": held_by_backlog_cap,
        "sample": Jsonb(sample) if sample is not None else None,
    }
    return _record(conn.execute(S.REDRIVE_RUN_FINISH, params))


def _record(cursor: psycopg.Cursor) -> dict | None:
    """The audit record a REDRIVE_RUN_FINISH or REDRIVE_RUN_BY_KEY cursor returns, JSON-ready."""
    row = cursor.fetchone()
    if row is None:
        return None
    out = dict(zip([c.name for c in cursor.description], row, strict=True))
    for key in ("started_at", "finished_at"):
        out[key] = out[key].isoformat() if out[key] is not None else None
    return out


def summary_line(record: dict) -> str:
    """One line naming each number of a redrive's audit record, the same words as its keys and
    the columns of ``redrive_runs``: e.g. ``matched 8,255, max messages 10, moved 10``."""
    cap = record.get("max_messages")
    line = (
        f"matched {record['matched'] or 0:,}, max messages {'all' if cap is None else f'{cap:,}'}, "
        f"moved {record['moved']:,}"
    )
    if record.get("held_by_backlog_cap"):
        line += f", held by backlog cap {record['held_by_backlog_cap']:,}"
    return line + (" (dry run: nothing moves)" if record["dry_run"] else "")


def run_record(conn: psycopg.Connection, run_key: str) -> dict:
    """The audit record of run ``run_key`` (the dict ``redrive`` returns); ``RedeliveryError`` if
    there is no such run."""
    record = _record(conn.execute(S.REDRIVE_RUN_BY_KEY, {"run_key": run_key}))
    if record is None:
        raise RedeliveryError(f"no redrive run has the key {run_key!r}")
    return record


@dataclass(frozen=True)
class Run:
    """A redrive run's row as REDRIVE_RUN_START returns it."""

    id: int
    moved: int
    status: str
    dry_run: bool


def start_run(
    conn: psycopg.Connection,
    request: RedriveRequest,
    group_id: int,
    run_key: str,
    triggered_by: str | None,
    standing_id: int | None = None,
    max_generations: int | None = None,
) -> Run:
    """Start run ``run_key`` for ``request`` (of standing redrive ``standing_id`` with its
    generation limit ``max_generations``, when given), or
    resume it; raises ``RedeliveryError``, changing nothing, when the key is a redrive of another
    selection, or a real run that a dry run would resume (a dry run never moves anything)."""
    start = {
        "standing_id": standing_id,
        "max_generations": max_generations,
        "run_key": run_key,
        "triggered_by": triggered_by,
        "group_id": group_id,
        "dry_run": request.dry_run,
        "filter": Jsonb({**request.selection(), "dry_run": request.dry_run}),
    }
    row = conn.execute(S.REDRIVE_RUN_START, start).fetchone()
    if row is not None:
        return Run(*row[:4])
    existing = run_record(conn, run_key)  # (deleted by retention meanwhile: "no redrive run has the key")
    selection = {k: v for k, v in existing["filter"].items() if k != "dry_run"}
    if selection != request.selection():
        raise RedeliveryError(
            f"run key {run_key!r} is a redrive of another selection: {json.dumps(existing['filter'])}"
        )
    raise RedeliveryError(
        f"run key {run_key!r} is a real redrive ({existing['status']}, {existing['moved']} moved): "
        "a dry run under it would move; use another run key"
    )


def open_run(
    request: RedriveRequest, *, run_key: str, triggered_by: str | None = None, url: str | None = None
):
    """Check ``request`` and record it as run ``run_key`` without moving anything, so that a job
    elsewhere (redelivery/jobs/dlq_redrive.py under spark-submit) runs it from the key alone
    (``request_of_run``): the request never travels as a command-line argument, which Linux caps
    at 128 KiB. Raises what ``redrive`` raises before moving anything."""
    with db.connect(url or db.database_url(), autocommit=True) as conn:
        db.check_schema(conn)
        params = _moving_params(conn, request)
        start_run(conn, request, params["group_id"], run_key, triggered_by)


def request_of_run(conn: psycopg.Connection, run_key: str) -> tuple[RedriveRequest, str | None]:
    """(the request, who triggered it) of run ``run_key``; ``RedeliveryError`` if there is none."""
    record = run_record(conn, run_key)
    return RedriveRequest.model_validate(record["filter"]), record["triggered_by"]


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
    config: RedeliveryConfig | None = None,
    standing_id: int | None = None,
    generations: tuple[int, float] | None = None,
) -> dict:
    """Redrive the dead letters ``request`` selects and return the audit record as a dict:
    ``{"run_key", "triggered_by", "filter", "dry_run", "status", "matched", "max_messages",
    "moved", "held_by_backlog_cap", "sample", "started_at", "finished_at"}``: ``matched`` counts
    the dead letters the filter matches, ``max_messages`` caps how many the run moves (None: all),
    ``moved`` counts what this run moved, and ``held_by_backlog_cap`` the matched ones left in the
    DLQ because a ready-backlog cap (``max_ready_backlog`` of a group they would reach) had no
    room. A dry run moves nothing and reports the count and a sample.

    ``run_key`` names the run in ``redrive_runs``: running the same key again resumes it (a retried
    Airflow task; a real run after a dry run under the same key moves) and a finished key moves
    nothing more; a key stands for one selection, and a dry run is refused under the key of a real
    run. ``should_stop()`` is asked between batches: the run then ends with status ``stopped``,
    every message in one place, and resumes under its key. ``wait(seconds)`` paces the batches (an
    interruptible wait lets a stop cut a pause short). Under a ready-backlog cap, what fits moves,
    oldest message first, each batch checking the room under the topic's backlog lock. With
    ``spark`` and a selection of at least ``spark_threshold`` messages (default: the config's
    ``spark_threshold``; no ``max_messages``, no cap), the batches run in Spark tasks over
    message-id ranges, paced together. ``config``: the policies (default: the config file's).
    ``standing_id`` and ``generations`` make it a run of a standing redrive (``redelivery.standing``):
    only dead letters below its generation limit and past their generation's wait (``filter_params``).
    Raises UnknownGroupError, UnknownTopicError, RedeliveryError before moving anything."""
    url = url or db.database_url()
    config = config or cached_config()
    with db.connect(url, autocommit=True) as conn:
        db.check_schema(conn)  # SchemaNotMigratedError, not an UndefinedTable halfway
        params = _moving_params(conn, request, generations)
        lanes = capped_lanes(conn, config, request, params)
        limit = generations[0] if generations else None
        run = start_run(conn, request, params["group_id"], run_key, triggered_by, standing_id, limit)
        try:
            matched = conn.execute(S.DLQ_COUNT, params).fetchone()[0]
            sample = jsonable(select(conn, request, limit=SAMPLE_SIZE, generations=generations))
            log(
                f"redrive {run_key}: {matched} dead letters of group {request.group!r} match"
                f"{'' if request.max_messages is None else f', max {request.max_messages}'}; "
                f"{'dry run' if run.dry_run else 'moving'}; already moved by this run: {run.moved}"
            )
            if run.dry_run or run.status == "success":
                return _logged(log, _finish(conn, run.id, "success", matched=matched, sample=sample))
            params["partition_span"] = config.retention.seconds("partition")
            _make_partitions(conn, params, params["partition_span"])
            budget = None if request.max_messages is None else max(request.max_messages - run.moved, 0)
            threshold = config.spark_threshold if spark_threshold is None else spark_threshold
            held = None
            pace = Pace(conn, run.id, request.rate_limit, wait)
            if lanes:
                moved, stopped, held = _redrive_lanes(
                    conn, params, run.id, budget, pace, log, should_stop, lanes
                )
            elif spark is not None and budget is None and matched >= threshold:
                moved, stopped = _redrive_spark(spark, url, params, run.id, request.rate_limit, conn), False
            else:
                moved, stopped, _ = _redrive_loop(conn, params, run.id, budget, pace, log, should_stop)
            log(f"redrive {run_key}: moved {moved} in this attempt{' and stopped' if stopped else ''}")
            return _logged(log, _finish(
                conn, run.id, "stopped" if stopped else "success", matched=matched, sample=sample,
                held_by_backlog_cap=held,
            ))  # fmt: skip
        except BaseException:
            _finish(conn, run.id, "failed")
            raise


def _make_partitions(conn: psycopg.Connection, params: dict, span_seconds: int) -> None:
    """The partitions of the log the moves will write to, made before the first batch: for copies
    to another topic, the current one; back to their own topic, those of the dead letters whose
    message retention dropped from the log (it goes back into it, at its own publish time)."""
    if params["dest"] is not None:
        ensure_partition(conn, conn.execute(S.DB_NOW).fetchone()[0], span_seconds)
        return
    for (starts_at,) in conn.execute(S.DEAD_LETTER_LOG_GAPS, {**params, "span": span_seconds}).fetchall():
        ensure_partition(conn, starts_at, span_seconds)


def _logged(log, record: dict) -> dict:
    log(f"redrive {record['run_key']} {record['status']}: {summary_line(record)}")
    return record


def _redrive_lanes(conn, params, run_id, budget, pace, log, should_stop, lanes) -> tuple[int, bool, int]:
    """The batches of each lane in turn, sharing the budget: (moved, stopped, matched dead letters
    left in the DLQ because a lane's cap was reached)."""
    moved, full_lanes = 0, []
    for lane in lanes:
        lane_params = {**params, "topic_id": lane.topic_filter}
        left = None if budget is None else budget - moved
        if left == 0:
            break
        n, stopped, full = _redrive_loop(conn, lane_params, run_id, left, pace, log, should_stop, lane=lane)
        moved += n
        if stopped:
            return moved, True, 0
        if full:
            full_lanes.append(lane_params)
    held = sum(conn.execute(S.DLQ_COUNT, p).fetchone()[0] for p in full_lanes)
    return moved, False, held if budget is None else min(held, budget - moved)


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
    conn, params, run_id, budget, pace: Pace, log, should_stop, bounds=None, lane: Lane | None = None
) -> tuple[int, bool, bool]:
    """Batches until nothing is left, the budget is spent or the lane's cap is reached: (moved,
    stopped by should_stop, cap reached)."""
    moved = 0
    while budget is None or moved < budget:
        size = pace.batch_size() if budget is None else min(pace.batch_size(), budget - moved)
        pace.before(size)
        if should_stop():  # between two batches (a stop that came during the wait included)
            log("  stopped between batches")
            return moved, True, False
        n, full = _move_batch(conn, params, run_id, size, bounds, lane)
        moved += n
        if n:
            log(f"  batch: moved {n} (total {moved})")
        if full:
            log("  the ready-backlog cap is reached: the rest stays in the DLQ")
            return moved, False, True
        if n < size:
            break
    return moved, False, False


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
