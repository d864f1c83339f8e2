"""A DAG run's batch of windows: a scheduled tier run covers ``run_span`` of time and applies each
of its windows at the window's end, in turn, in one process (the design card's "batched as
windows"; ``TierConfig.run_span``).

Why one process for many windows: each DAG run costs the user's Airflow a scheduler decision, a
task process start, rows in its metadata database and a task-log file (issue 38 measured 10,536
runs and about 230 MB a day with a run per window); a window costs the store a few statements. A
run that sleeps between windows holds one worker slot for its span, and is more punctual than a
run per window: nothing waits for the scheduler, a DAG file parse or a process start at a window's
end.

What a window is does not change: ``apply(start, end)`` promotes what is due by ``end``, once, and
re-applying it moves nothing twice (``redelivery.tiers.run``). So a late start, a failed window or a
retried task loses nothing: the next window applied promotes everything due by its own end. The
ends are fixed by the clock, not by the run (multiples of the window since the Unix epoch, UTC),
so two runs of one tier, or two tries of one run, cover the same windows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from redelivery.errors import InvalidWindowError

#: After a window the database refused as ending after its clock (this machine's clock runs ahead
#: of the database's), wait this long in seconds before applying it again.
CLOCK_SKEW_RETRY_SECONDS = 0.25
#: While it waits for a window's end, the batch asks whether its DAG was paused this often (s).
PAUSE_POLL_SECONDS = 10
#: Windows are logged together: a line per this many seconds of windows when they moved something,
LOG_SECONDS = 60
#: and a line per this many when none did.
QUIET_LOG_SECONDS = 600
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def window_ends(window_seconds: int, after: datetime, until: datetime) -> list[datetime]:
    """The ends of a tier's windows in ``(after, until]``: the multiples of ``window_seconds``
    since the Unix epoch (UTC), oldest first. ``after`` and ``until`` are timezone-aware."""
    first = int((after - EPOCH).total_seconds() // window_seconds) + 1
    last = int((until - EPOCH).total_seconds() // window_seconds)
    return [EPOCH + timedelta(seconds=k * window_seconds) for k in range(first, last + 1)]


@dataclass
class BatchReport:
    """What a batch of windows did: ``applied`` (applications: a late one covers several windows),
    ``windows`` (windows covered), the moves summed over them, ``failed`` (``[(window end,
    error)]``: windows whose application raised; a later one covered what they would have moved)
    and ``unresolved`` (``{"topic/group": error}``: subscriptions whose policy could not be
    resolved, left alone by every window), ``paused`` (the batch stopped because its DAG was
    paused)."""

    applied: int = 0
    windows: int = 0
    promoted: int = 0
    retried_after_lease_expiry: int = 0
    dead_lettered: int = 0
    failed: list[tuple[datetime, str]] = field(default_factory=list)
    unresolved: dict[str, str] = field(default_factory=dict)
    paused: bool = False

    def add(self, summary: dict, windows: int) -> None:
        self.applied += 1
        self.windows += windows
        for key in ("promoted", "retried_after_lease_expiry", "dead_lettered"):
            setattr(self, key, getattr(self, key) + summary.get(key, 0))
        for problem in summary.get("unresolved_subscriptions") or []:
            self.unresolved[f"{problem['topic']}/{problem['group']}"] = problem["error"]

    def as_dict(self) -> dict:
        return {
            "applied": self.applied,
            "windows": self.windows,
            "promoted": self.promoted,
            "retried_after_lease_expiry": self.retried_after_lease_expiry,
            "dead_lettered": self.dead_lettered,
            "failed": [(end.isoformat(), error) for end, error in self.failed],
            "unresolved": dict(self.unresolved),
            "paused": self.paused,
        }


def apply_windows(
    ends: list[datetime],
    window_seconds: int,
    apply: Callable[[datetime, datetime], dict],
    *,
    wait: Callable[[float], bool],
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    log: Callable[[str], object] = print,
    paused: Callable[[], bool] = lambda: False,
) -> BatchReport:
    """Apply the windows ending at ``ends`` (``window_ends``), each at its end by ``clock``:
    ``apply(start, end)`` returns the window's summary (``run_tier``'s). Windows whose end has
    passed when one is due are applied as one (from the first one's start to the last one's end),
    so a late start or a slow window catches up at once. ``wait(seconds)`` sleeps and returns True
    to stop (the task is being killed): the batch then ends before its next window. ``paused()``,
    asked before each window and every ``PAUSE_POLL_SECONDS`` while it waits, True (an operator
    paused the tier's DAG): the batch ends there, its report's ``paused`` set; the next run, once
    unpaused, promotes all that came due meanwhile.

    ``log`` gets a line per minute of windows that moved something (their moves summed), per 10
    minutes of quiet ones, and one at once for windows applied late as one or a failure. A window
    whose ``apply`` raises is logged (one line; the same error again, window after window, only
    once, and the window that succeeds after them) and recorded in the report's ``failed``; the
    batch goes on, and the next window promotes what it would have (a store back, a connection
    defined meanwhile, is used at once). ``InvalidWindowError``
    (the database's clock is behind this machine's) is not a failure: the same window is applied
    again ``CLOCK_SKEW_RETRY_SECONDS`` later. Returns the ``BatchReport``; raises nothing that
    ``apply`` raises."""
    report, lines = BatchReport(), _WindowLog(log)
    i, skewed, failing, failures = 0, None, None, 0
    asked = None  # when ``paused`` was last asked (this clock)
    while i < len(ends):
        now = clock()
        due = ends[i] <= now
        if due or asked is None or (now - asked).total_seconds() >= PAUSE_POLL_SECONDS:
            asked = now
            if paused():
                report.paused = True
                lines.flush()
                log(f"the DAG is paused: the batch stops before the window ending {ends[i].isoformat()}")
                break
        if not due:
            if wait(min((ends[i] - now).total_seconds(), PAUSE_POLL_SECONDS)):
                break
            continue
        j = max(k for k in range(i, len(ends)) if ends[k] <= now)
        start, end = ends[i] - timedelta(seconds=window_seconds), ends[j]
        try:
            summary = apply(start, end)
        except InvalidWindowError as exc:
            if skewed != end:
                skewed = end
                log(f"window ending {end.isoformat()} waits for the database's clock: {exc}")
            if wait(CLOCK_SKEW_RETRY_SECONDS):
                break
            continue
        except Exception as exc:  # the next window covers it: one line, and on
            error = f"{type(exc).__name__}: {exc}"
            report.failed.append((end, error))
            lines.flush()
            if error != failing:  # the same error window after window (a store down): said once
                log(f"window ending {end.isoformat()} failed (the next one covers it): {error}")
            failing, failures = error, failures + 1
        else:
            if failing is not None:
                log(f"window ending {end.isoformat()} applied after {failures} failed windows")
            failing, failures = None, 0
            report.add(summary, j - i + 1)
            lines.add(start, end, summary, j - i + 1)
        i = j + 1
    lines.flush()
    return report


class _WindowLog:
    """The batch's log: windows summed into one line per ``LOG_SECONDS`` of windows when they moved
    something, per ``QUIET_LOG_SECONDS`` when none did (an idle run of the 10 s tier logs 6 lines
    an hour; a busy one 60), and a line at once for windows applied late as one. Every window's
    own summary is its record in ``tier_runs``; a line of Airflow's task log costs about 450 bytes
    with Airflow's own fields."""

    MOVES = (
        ("promoted", "promoted"),
        ("retried_after_lease_expiry", "lease expiries retried"),
        ("dead_lettered", "dead-lettered"),
    )

    def __init__(self, log: Callable[[str], object]):
        self.log = log
        self._reset()

    def _reset(self) -> None:
        self.first, self.last, self.count, self.slowest = None, None, 0, 0.0
        self.moved = {key: 0 for key, _ in self.MOVES}

    def add(self, start: datetime, end: datetime, summary: dict, windows: int) -> None:
        if windows > 1:  # said at once: the windows before it were late
            self.flush()
            self.log(
                f"windows {start.isoformat()} to {end.isoformat()} ({windows}) applied late, as one: "
                f"{self._moves(summary)} in {summary.get('duration_seconds', 0)} s"
            )
            return
        self.first = self.first or start
        self.last, self.count = end, self.count + 1
        self.slowest = max(self.slowest, summary.get("duration_seconds", 0))
        for key in self.moved:
            self.moved[key] += summary.get(key, 0)
        every = LOG_SECONDS if any(self.moved.values()) else QUIET_LOG_SECONDS
        if (self.last - self.first).total_seconds() >= every:
            self.flush()

    def _moves(self, counts: dict) -> str:
        return ", ".join(f"{counts.get(key, 0)} {label}" for key, label in self.MOVES if counts.get(key)) or (
            "nothing due"
        )

    def flush(self) -> None:
        if self.count:
            self.log(
                f"{self.count} windows from {self.first.isoformat()} to {self.last.isoformat()}: "
                f"{self._moves(self.moved)} (slowest {self.slowest} s)"
            )
        self._reset()
