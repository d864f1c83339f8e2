"""Prometheus metrics of the state store, read at scrape time.

``render(conn)`` returns the exposition text (Prometheus text format, UTF-8 bytes) of the metrics
below, read in one read-only snapshot (``redelivery_tier_paused`` only when the caller passes the
tiers' pause states: see its row); ``StateStoreCollector`` is the ``prometheus_client``
collector behind it, for a registry of one's own (``render`` uses a private ``CollectorRegistry``,
never the global one). Served as ``GET /redelivery/metrics`` by the Airflow api-server, to the users
allowed to read the dlq_redrive DAG (``redelivery.airflow.ui.app``), and printed or written to a
node-exporter textfile by ``redelivery metrics``.

Names follow RocketMQ 5's metrics (``rocketmq_consumer_ready_messages``,
``rocketmq_consumer_lag_latency``, ``rocketmq_send_to_dlq_messages_total``): prefix
``redelivery_``, the unit in the name, counters end in ``_total``. Labels: ``topic``, ``group``
(consumer group), ``state`` (delivery state), ``delay_level``, ``dlq`` (the DLQ's name),
``reason`` (why a message was dead-lettered), ``tier``.

| name | type | labels | meaning | source |
|---|---|---|---|---|
| ``redelivery_messages`` | gauge | topic, group, state | messages in READY (READY rows and the messages past the group's consume offset), INFLIGHT, WAITING_RETRY, DLQ or BLOCKED (an ordered subscription's messages waiting behind their key's head) (0 for a subscription with none) | READY: the partial index ``deliveries_ready`` and the log's primary key from the offset on; INFLIGHT, WAITING_RETRY: the partial indexes ``deliveries_inflight``, ``deliveries_waiting``, which carry group and topic; DLQ: ``dlq_messages``; BLOCKED: the partial index ``deliveries_blocked`` |
| ``redelivery_blocked_keys`` | gauge | topic, group | an ordered subscription's keys held by a failure: their head waits for a retry (WAITING_RETRY) or is dead-lettered and holds the key (HALTED, ``on_exhausted`` halt), whether or not messages wait behind it yet; a key whose head is in flight or READY is busy, not held (issue 36) | partial index ``deliveries_held`` (those heads only) |
| ``redelivery_blocked_oldest_age_seconds`` | gauge | topic, group | how long the message BLOCKED the longest has waited behind its key's head, seconds, from when the offset passed it (0: none) | ``deliveries.created_at`` of the BLOCKED rows |
| ``redelivery_retry_waiting_messages`` | gauge | topic, group, delay_level | WAITING_RETRY deliveries per delay level (levels with some) | partial index ``deliveries_waiting`` |
| ``redelivery_consumer_ready_oldest_age_seconds`` | gauge | topic, group | how long the message READY the longest has been READY (RocketMQ's consumer lag latency); 0 with none | ``deliveries.ready_at`` of the READY rows (``deliveries_ready``), the publish time of the first message past the offset |
| ``redelivery_committed_messages_total`` | counter | topic, group | messages the group acknowledged (or closed by a redrive to another topic) | ``subscriptions``: the messages it took past its offset, less its delivery rows and its dead letters (deleted ones included) |
| ``redelivery_log_partitions`` | gauge | | partitions of the log (``retention.partition`` of publish times each) | ``log_partitions`` |
| ``redelivery_log_oldest_partition_end_age_seconds`` | gauge | | how long ago the oldest partition of the log ended (0 while it has not) | ``log_partitions`` |
| ``redelivery_log_held_partitions`` | gauge | topic, group | partitions past ``retention.messages`` that this subscription keeps from being dropped: its offset is below one of their messages, or it has unfinished deliveries in them (a group that lags) | each expired partition's table, ``subscriptions``, ``deliveries`` (``redelivery.store.log.partition_holders``); only when the caller passes the retention |
| ``redelivery_dlq_messages`` | gauge | dlq, group, reason | dead letters in each DLQ, per reason | ``dlq_messages``, index ``dlq_messages_reason`` |
| ``redelivery_dlq_signature_messages`` | gauge | group, signature, error_class | dead letters per group by the signature of their last failure (issue 40): the ``SIGNATURES_PER_GROUP`` most frequent signatures of each group with their error class (empty for a text error), the rest as signature ``other``: bounded however many distinct failures there are | ``dlq_messages``, index ``dlq_messages_signature`` |
| ``redelivery_breaker_open`` | gauge | topic, group, state | 1 while the subscription's circuit breaker is open, half-open or held (``state`` says which), 0 closed (issue 41): receives hand out nothing (half-open: a probe), counted failures are parked | ``breakers`` |
| ``redelivery_breaker_transitions_total`` | counter | topic, group, to | times the breaker went to ``to`` (open, closed, held), by itself or by an operator | ``breakers`` (opened_total, closed_total, held_total), added by the transition's statement |
| ``redelivery_auto_redriven_total`` | counter | group, policy | dead letters a standing redrive brought back (issue 41) | ``standing_redrives.brought_back``, added by each redrive batch of its runs |
| ``redelivery_standing_redrive_stopped`` | gauge | group, policy | 1 while the standing redrive is stopped (by itself, when what it brought back died again too often, or by an operator), 0 active | ``standing_redrives`` |
| ``redelivery_promoted_messages_total`` | counter | group | retries a tier run moved WAITING_RETRY -> READY | ``consumer_groups.promoted``, added in the transaction of the promotion |
| ``redelivery_send_to_dlq_messages_total`` | counter | group | messages dead-lettered, for any reason (RocketMQ ``rocketmq_send_to_dlq_messages_total``) | ``consumer_groups.dead_lettered``, added in the dead-lettering transaction (client or tier run) |
| ``redelivery_redriven_messages_total`` | counter | group | dead letters a redrive moved out of the DLQ (back to READY, or closed with a copy sent to another topic) | ``consumer_groups.redriven``, added by each redrive batch's statement |
| ``redelivery_stale_receipts_total`` | counter | group | receipts that changed nothing (a late or repeated ack, nack or reject) | ``consumer_groups.stale_receipts``, added by the statement that found them stale |
| ``redelivery_tier_run_duration_seconds`` | histogram | tier | the duration of each tier run that is not a dry run, failed ones included | ``tier_histograms`` (run_duration), added with the run's record (``TIER_RUN_FINISH``) |
| ``redelivery_retry_lateness_seconds`` | histogram | tier | per promoted retry, its window's end minus its due time | ``tier_histograms`` (retry_lateness), added in the transaction of the promotion |
| ``redelivery_tier_paused`` | gauge | tier | 1 while Airflow has the tier's DAG (``redelivery_tier_<tier>``) paused: its delay levels are not promoted; 0 while it is active; no sample for a tier whose DAG Airflow has not registered | Airflow's metadata database (``dag.is_paused``), read by the api-server's ``GET /redelivery/metrics`` and passed to ``render`` as ``tier_paused``; ``redelivery metrics`` has no Airflow database and leaves the gauge out |
| ``redelivery_metrics_scrape_duration_seconds`` | gauge | | how long this scrape's queries took | this process |
| ``redelivery_up`` | gauge | | 1: this scrape read the state store; 0: it could not (``render_unavailable``: unreachable, login refused, no such database, never migrated; the reason a comment line, the other samples missing but ``redelivery_tier_paused``), as Prometheus exporters answer for a target that is down | this process |

The counters and histograms are durable totals that never decrease: written in the transaction
of the change they count, by what its guarded statement moved (a re-run or overlapping run of a
window or redrive adds only its own moves; a rolled-back or dry run adds nothing), and kept apart
from the records retention deletes. The gauges cost what they count (a live state's index
entries, the messages past each offset, the dead letters, the groups, the tiers): COMMITTED messages
have no rows, their total is a difference of counters. Each count reads only its index once VACUUM
has marked the heap pages all-visible, and one heap page per row changed since
(``bench/bench_metrics.py`` measures both).
"""  # noqa: E501 (the table's rows)

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from redelivery.errors import DatabaseUnavailableError, SchemaNotMigratedError
from redelivery.rules.words import COUNTED_STATES
from redelivery.store import log
from redelivery.store import statements as S

#: The content type of ``render``'s text (the HTTP route's ``Content-Type``).
CONTENT_TYPE = CONTENT_TYPE_LATEST
#: The delivery states ``redelivery_messages`` counts (COMMITTED is history: see above).
LIVE_STATES = tuple(s for s in COUNTED_STATES if s != "COMMITTED")
#: The signatures of a group the gauge redelivery_dlq_signature_messages shows one by one (the rest: "other").
SIGNATURES_PER_GROUP = 10
#: Counter name -> column of METRICS_GROUP_TOTALS (after the group name) and help text.
COUNTERS = {
    "redelivery_promoted_messages": (1, "Retries promoted to READY by tier runs."),
    "redelivery_send_to_dlq_messages": (2, "Messages dead-lettered, for any reason."),
    "redelivery_redriven_messages": (3, "Dead letters moved out of the DLQ by redrives."),
    "redelivery_stale_receipts": (4, "Receipts that changed nothing (late or repeated answers)."),
}
#: tier_histograms.metric -> histogram name and help text.
HISTOGRAMS = {
    "run_duration": (
        "redelivery_tier_run_duration_seconds",
        "Duration of tier runs (dry runs excepted), seconds.",
    ),
    "retry_lateness": (
        "redelivery_retry_lateness_seconds",
        "Window end minus due time of each promoted retry, seconds.",
    ),
}


UP_HELP = "1 when this scrape read the state store, 0 when it could not (its other samples are then missing)."
#: SQLSTATEs of a refused login (invalid_password, invalid_authorization_specification), and libpq's
#: words for one: a refused login at connect time carries no SQLSTATE (psycopg has no result then).
AUTHENTICATION_FAILED = ("28P01", "28000")
_REFUSED_LOGIN = re.compile(
    r'authentication failed for user|no pg_hba\.conf entry|role "[^"]*" does not exist'
)
_NO_DATABASE = re.compile(r'database "[^"]*" does not exist')
#: What libpq puts before the server's reason (the host and port are said apart).
_LIBPQ_PREFIX = re.compile(r"^(connection failed: )?(connection to server (at|on) .*? failed: )?(FATAL: +)?")
#: SQLSTATEs of a server that cannot serve a session: connection exceptions (class 08), shut down
#: or starting (57P01-57P03), too many connections (53300).
_NO_SESSION = ("57P01", "57P02", "57P03", "53300")
#: ``unavailable``'s line for a read cancelled by its statement time-out (a read-only surface's:
#: ``REDELIVERY_READ_TIMEOUT``); psycopg keeps no host, port or time-out with it.
STATEMENT_TIMED_OUT = "the state store did not answer within its statement time-out"


def unavailable(exc: BaseException) -> str | None:
    """Why the state store cannot serve, one line, when ``exc`` says so; None for any other
    error (a statement's, a bug: not the state store's absence). Never the password:

    - ``cannot reach the state store at <host>:<port>: <libpq's reason>`` (refused, timed out,
      no such host, connection lost);
    - ``authentication failed for user '<user>' at <host>:<port>: <the server's reason>``
      (SQLSTATE 28P01 / 28000, or libpq's words for them at connect time);
    - ``database '<name>' does not exist at <host>:<port>``;
    - ``the state store did not answer within its statement time-out: ...`` (``STATEMENT_TIMED_OUT``:
      a read cancelled by PostgreSQL's ``statement_timeout``, SQLSTATE 57014);
    - ``SchemaNotMigratedError`` (never migrated, an older revision), ``DatabaseUnavailableError``
      (no connection defined, the embedded server cannot start): their own text.

    What the CLI prints, the "Dead letters" page shows and ``redelivery_up 0`` is commented with."""
    if isinstance(exc, SchemaNotMigratedError | DatabaseUnavailableError):
        return _one_line(str(exc))
    if not isinstance(exc, psycopg.OperationalError):
        return None
    text, state = _one_line(str(exc)), exc.sqlstate
    reason = _LIBPQ_PREFIX.sub("", text)
    host, port, user, dbname = _connection_fields(exc)
    where = f" at {host}:{port}" if host else ""
    if state in AUTHENTICATION_FAILED or (state is None and _REFUSED_LOGIN.search(text)):
        return f"authentication failed for user {user!r}{where}: {reason}"
    if state == "3D000" or (state is None and _NO_DATABASE.search(text)):
        return f"database {dbname!r} does not exist{where}"
    if state == "57014" and "statement timeout" in text:  # query_canceled by statement_timeout
        return f"{STATEMENT_TIMED_OUT}: {reason}"
    if state is None or state.startswith("08") or state in _NO_SESSION:
        return f"cannot reach the state store{where}: {reason}"
    return None


def _connection_fields(exc: psycopg.Error) -> tuple[str | None, ...]:
    """(host, port, user, database) of the connection an error came from (all None when psycopg
    kept none: a host name that does not resolve)."""
    pgconn = exc.pgconn
    if pgconn is None:
        return None, None, None, None
    values = (pgconn.host, pgconn.port, pgconn.user, pgconn.db)
    return tuple(value.decode(errors="replace") if value else None for value in values)


def _one_line(text: str) -> str:
    return " ".join(text.split())


@contextmanager
def _snapshot(conn: psycopg.Connection) -> Iterator[None]:
    """One read-only REPEATABLE READ transaction (all the queries see the same state), or a
    savepoint in the caller's transaction when one is open; the connection's settings are put back."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        with conn.transaction():
            yield
        return
    saved = conn.isolation_level, conn.read_only
    conn.isolation_level, conn.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True
    try:
        with conn.transaction():
            yield
    finally:
        conn.isolation_level, conn.read_only = saved


class StateStoreCollector(Collector):
    """A ``prometheus_client`` collector that reads the state store over ``conn`` (a psycopg
    connection with the redelivery search path, e.g. ``db.connect()``) at every ``collect()`` and
    yields the families of the module's table. ``at``: a timezone-aware ``datetime`` replacing the
    database clock for the age gauge (``None``: ``now()``). ``tier_paused``: ``{tier: whether
    Airflow has its DAG paused}``, read by the caller in Airflow's metadata database (``None``: the
    ``redelivery_tier_paused`` gauge is left out). ``retention_seconds``: ``retention.messages``
    (``None``: ``redelivery_log_held_partitions`` is left out). Raises psycopg errors of the
    queries."""

    def __init__(
        self,
        conn: psycopg.Connection,
        at: datetime | None = None,
        tier_paused: Mapping[str, bool] | None = None,
        retention_seconds: int | None = None,
    ):
        self.conn, self.at, self.tier_paused = conn, at, tier_paused
        self.retention_seconds = retention_seconds

    def collect(self) -> Iterator:
        started = time.perf_counter()
        rows = self._read()
        seconds = time.perf_counter() - started
        yield GaugeMetricFamily("redelivery_up", UP_HELP, value=1)
        yield from _live_gauges(rows)
        yield from _log_gauges(rows)
        yield from _counters(rows["totals"])
        committed = CounterMetricFamily(
            "redelivery_committed_messages",
            "Messages acknowledged (or closed by a redrive to another topic), per topic and group.",
            labels=["topic", "group"],
        )
        for topic, group, n in sorted(rows["committed"]):
            committed.add_metric([topic, group], n)
        yield committed
        yield from _histograms(rows["histograms"])
        yield from _breakers(rows["breakers"])
        yield from _standing(rows["standing"])
        if self.tier_paused is not None:  # the state store does not know it: only Airflow does
            yield _tier_paused(self.tier_paused)

        yield GaugeMetricFamily(
            "redelivery_metrics_scrape_duration_seconds",
            "How long the queries of this scrape took, seconds.",
            value=seconds,
        )

    def _read(self) -> dict:
        """Every query of a scrape, in one read-only snapshot: ``{name: rows}``."""
        with _snapshot(self.conn):
            execute = self.conn.execute
            return {
                "subscriptions": execute(S.SUBSCRIPTION_NAMES).fetchall(),
                "ready": execute(S.METRICS_READY, {"at": self.at}).fetchall(),
                "inflight": execute(S.METRICS_INFLIGHT).fetchall(),
                "waiting": execute(S.METRICS_WAITING).fetchall(),
                "dead": execute(S.METRICS_DEAD_LETTERS).fetchall(),
                "signatures": execute(
                    S.METRICS_DEAD_LETTER_SIGNATURES, {"top": SIGNATURES_PER_GROUP}
                ).fetchall(),
                "blocked": execute(S.METRICS_BLOCKED, {"at": self.at}).fetchall(),
                "committed": execute(S.METRICS_COMMITTED).fetchall(),
                "totals": execute(S.METRICS_GROUP_TOTALS).fetchall(),
                "histograms": execute(S.METRICS_HISTOGRAMS).fetchall(),
                "breakers": execute(S.METRICS_BREAKERS, {"at": self.at}).fetchall(),
                "standing": execute(S.METRICS_STANDING).fetchall(),
                "partitions": log.partitions(self.conn),
                "now": self.at or execute(S.DB_NOW).fetchone()[0],
                "held": self._held(),
            }

    def _held(self) -> dict[tuple[str, str], int] | None:
        """{(topic, group): partitions past retention it holds}, or None without a retention."""
        if self.retention_seconds is None:
            return None
        held: dict[tuple[str, str], int] = {}
        for partition in log.expired(self.conn, self.retention_seconds, self.at):
            for holder in log.partition_holders(self.conn, partition):
                held[holder] = held.get(holder, 0) + 1
        return held


def _live_gauges(rows: dict) -> Iterator:
    """The gauges of live deliveries: per state, waiting per level, the oldest READY's age, dead
    letters per DLQ and reason."""
    subscriptions, waiting = rows["subscriptions"], rows["waiting"]
    counts = {(topic, group, state): 0 for topic, group in subscriptions for state in LIVE_STATES}
    age = {(topic, group): 0.0 for topic, group in subscriptions}
    for topic, group, n, oldest in rows["ready"]:
        counts[(topic, group, "READY")] = n
        age[(topic, group)] = oldest
    for topic, group, n in rows["inflight"]:
        counts[(topic, group, "INFLIGHT")] = n
    for topic, group, _, n in waiting:
        counts[(topic, group, "WAITING_RETRY")] = counts.get((topic, group, "WAITING_RETRY"), 0) + n
    keys = {(topic, group): 0 for topic, group in subscriptions}
    blocked_age = {(topic, group): 0.0 for topic, group in subscriptions}
    for topic, group, held_keys, n, oldest in rows["blocked"]:
        counts[(topic, group, "BLOCKED")] = n
        keys[(topic, group)], blocked_age[(topic, group)] = held_keys, oldest
    per_queue: dict = {}
    for dlq, topic, group, reason, n in rows["dead"]:
        counts[(topic, group, "DLQ")] = counts.get((topic, group, "DLQ"), 0) + n
        per_queue[(dlq, group, reason)] = per_queue.get((dlq, group, reason), 0) + n
    yield _gauge(
        "redelivery_messages",
        "Deliveries per topic, group and live state (READY, INFLIGHT, WAITING_RETRY, DLQ, BLOCKED).",
        ["topic", "group", "state"],
        ((list(labels), n) for labels, n in sorted(counts.items())),
    )
    yield _gauge(
        "redelivery_blocked_keys",
        "Keys of an ordered subscription held by a failure: their head waits for a retry or is a dead letter"
        " holding the key (on_exhausted halt); a key whose head is in flight or READY is busy, not held.",
        ["topic", "group"],
        ((list(labels), n) for labels, n in sorted(keys.items())),
    )
    yield _gauge(
        "redelivery_blocked_oldest_age_seconds",
        "How long the message BLOCKED the longest has waited behind its key's head, seconds (0: none).",
        ["topic", "group"],
        ((list(labels), seconds) for labels, seconds in sorted(blocked_age.items())),
    )
    yield _gauge(
        "redelivery_retry_waiting_messages",
        "WAITING_RETRY deliveries per topic, group and delay level.",
        ["topic", "group", "delay_level"],
        (([topic, group, str(level)], n) for topic, group, level, n in sorted(waiting)),
    )
    yield _gauge(
        "redelivery_consumer_ready_oldest_age_seconds",
        "How long the delivery READY the longest has been READY, seconds (0: none READY).",
        ["topic", "group"],
        ((list(labels), seconds_ready) for labels, seconds_ready in sorted(age.items())),
    )
    yield _gauge(
        "redelivery_dlq_messages",
        "Dead letters per DLQ, group and reason.",
        ["dlq", "group", "reason"],
        ((list(labels), n) for labels, n in sorted(per_queue.items())),
    )
    yield _gauge(
        "redelivery_dlq_signature_messages",
        f"Dead letters per group by the signature of their last failure: each group's {SIGNATURES_PER_GROUP}"
        " most frequent signatures with their error class, the rest as signature 'other'.",
        ["group", "signature", "error_class"],
        (
            ([group, signature, error_class or ""], n)
            for group, signature, error_class, n in sorted(rows["signatures"], key=lambda r: (r[0], r[1]))
        ),
    )


def _log_gauges(rows: dict) -> Iterator:
    """The log's partitions: how many, how long ago the oldest ended, and which groups hold
    partitions past retention."""
    partitions, now = rows["partitions"], rows["now"]
    yield GaugeMetricFamily("redelivery_log_partitions", "Partitions of the log.", value=len(partitions))
    age = max((now - partitions[0].ends_at).total_seconds(), 0.0) if partitions else 0.0
    yield GaugeMetricFamily(
        "redelivery_log_oldest_partition_end_age_seconds",
        "How long ago the oldest partition of the log ended, seconds (0: it has not).",
        value=age,
    )
    if rows["held"] is not None:
        yield _gauge(
            "redelivery_log_held_partitions",
            "Partitions past retention.messages a subscription keeps from being dropped (a group that lags).",
            ["topic", "group"],
            ((list(holder), n) for holder, n in sorted(rows["held"].items())),
        )


def _counters(totals: list) -> Iterator:
    """The counters kept per group in ``consumer_groups``."""
    for name, (column, help_text) in COUNTERS.items():
        family = CounterMetricFamily(name, help_text, labels=["group"])
        for row in sorted(totals):
            family.add_metric([row[0]], row[column])
        yield family


def _breakers(breakers: list) -> Iterator:
    """Each subscription's breaker: whether it is open (and how), and its transitions."""
    rows = sorted(breakers)
    yield _gauge(
        "redelivery_breaker_open",
        "1 while the subscription's circuit breaker is open, half-open or held (state), 0 closed.",
        ["topic", "group", "state"],
        (([topic, group, state], int(state != "closed")) for topic, group, state, *_ in rows),
    )
    family = CounterMetricFamily(
        "redelivery_breaker_transitions",
        "Times the subscription's circuit breaker went to open, closed or held.",
        labels=["topic", "group", "to"],
    )
    for topic, group, _, opened, closed, held in rows:
        for to, n in (("open", opened), ("closed", closed), ("held", held)):
            family.add_metric([topic, group, to], n)
    yield family


def _standing(standing: list) -> Iterator:
    """Each standing redrive: what it brought back, and whether it is stopped."""
    family = CounterMetricFamily(
        "redelivery_auto_redriven",
        "Dead letters a standing redrive brought back (moved by its runs).",
        labels=["group", "policy"],
    )
    for group, policy, _, brought_back in standing:
        family.add_metric([group, policy], brought_back)
    yield family
    yield _gauge(
        "redelivery_standing_redrive_stopped",
        "1 while the standing redrive is stopped (by itself or by an operator), 0 active.",
        ["group", "policy"],
        (([group, policy], int(state == "stopped")) for group, policy, state, _ in standing),
    )


def _histograms(histograms: list) -> Iterator:
    """The histograms per tier in ``tier_histograms`` (a metric this version does not know is
    left out)."""
    families = {
        metric: HistogramMetricFamily(name, help_text, labels=["tier"])
        for metric, (name, help_text) in HISTOGRAMS.items()
    }
    for tier, metric, bounds, bucket_counts, total in histograms:
        if metric not in families:
            continue
        cumulative, buckets = 0, []
        for bound, n in zip([*bounds, float("inf")], bucket_counts, strict=True):
            cumulative += n
            buckets.append((floatToGoString(bound), cumulative))
        families[metric].add_metric([tier], buckets, total)
    yield from families.values()


def _tier_paused(tier_paused: Mapping[str, bool]) -> GaugeMetricFamily:
    return _gauge(
        "redelivery_tier_paused",
        "1 while Airflow has the tier's DAG paused (its delay levels are not promoted), else 0.",
        ["tier"],
        (([tier], int(paused)) for tier, paused in sorted(tier_paused.items())),
    )


class _Unavailable(Collector):
    """``redelivery_up 0`` and, when given, the paused tiers Airflow knows."""

    def __init__(self, tier_paused: Mapping[str, bool] | None):
        self.tier_paused = tier_paused

    def collect(self) -> Iterator:
        yield GaugeMetricFamily("redelivery_up", UP_HELP, value=0)
        if self.tier_paused is not None:
            yield _tier_paused(self.tier_paused)


def _unavailable_registry(tier_paused: Mapping[str, bool] | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Unavailable(tier_paused))
    return registry


def render_unavailable(problem: str, tier_paused: Mapping[str, bool] | None = None) -> bytes:
    """The metrics of a scrape that could not read the state store (Prometheus text, as
    ``render``): ``redelivery_up 0`` with its HELP, ``problem`` (``unavailable``'s line) as a
    comment line before it, and ``redelivery_tier_paused`` when ``tier_paused`` is given."""
    comment = f"# the state store cannot serve: {_one_line(problem)}\n".encode()
    return comment + generate_latest(_unavailable_registry(tier_paused))


def write_unavailable_textfile(path: str) -> None:
    """``write_textfile`` of a scrape that could not read the state store: ``redelivery_up 0``.
    Raises ``OSError`` when the directory cannot be written."""
    write_to_textfile(path, _unavailable_registry())


def _gauge(name: str, help_text: str, labels: list[str], samples) -> GaugeMetricFamily:
    """A gauge family of ``(label values, value)`` samples."""
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


def _registry(
    conn: psycopg.Connection,
    at: datetime | None,
    tier_paused: Mapping[str, bool] | None = None,
    retention_seconds: int | None = None,
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateStoreCollector(conn, at, tier_paused, retention_seconds))
    return registry


def render(
    conn: psycopg.Connection,
    at: datetime | None = None,
    tier_paused: Mapping[str, bool] | None = None,
    retention_seconds: int | None = None,
) -> bytes:
    """The metrics as Prometheus text (UTF-8, content type ``CONTENT_TYPE``), read over ``conn``
    in one read-only snapshot. ``at`` replaces the database clock for the age gauges;
    ``tier_paused`` (``{tier: paused}``, from Airflow's metadata database) adds
    ``redelivery_tier_paused``; ``retention_seconds`` (``retention.messages``) adds
    ``redelivery_log_held_partitions``."""
    return generate_latest(_registry(conn, at, tier_paused, retention_seconds))


def write_textfile(conn: psycopg.Connection, path: str, retention_seconds: int | None = None) -> None:
    """Write the metrics to ``path`` (it must end in ``.prom`` for node-exporter's textfile
    collector) through a file in the same directory renamed over it: a reader never sees half a
    file. Raises ``OSError`` when the directory cannot be written."""
    write_to_textfile(path, _registry(conn, None, retention_seconds=retention_seconds))
