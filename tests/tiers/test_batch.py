"""A DAG run's batch of windows (issue 38): the windows' ends, each applied at its end, late ones
caught up at once, a failed window covered by the next, a stop between windows; and a real batch
against the state store, on the real clock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from redelivery.errors import InvalidWindowError
from redelivery.tiers.batch import apply_windows, window_ends

T = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)


def s(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


class SimulatedClock:
    """A clock that only moves when the batch waits (or when a window takes time)."""

    def __init__(self, start: datetime):
        self.now, self.waits = start, []

    def __call__(self) -> datetime:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(round(seconds, 3))
        self.now += timedelta(seconds=seconds)
        return False


def test_window_ends_are_on_the_clock_not_the_run():
    assert window_ends(10, s(3), s(33)) == [s(10), s(20), s(30)]
    assert window_ends(10, s(0), s(30)) == [s(10), s(20), s(30)]  # (after, until]
    assert window_ends(10, s(30), s(30)) == []
    # two runs meeting at a span's end cover every window once
    first, second = window_ends(10, s(3), s(3603)), window_ends(10, s(3603), s(7203))
    assert len(first) == len(second) == 360 and first[-1] + timedelta(seconds=10) == second[0]


def test_each_window_is_applied_at_its_end_in_turn():
    clock, applied, lines = SimulatedClock(s(1)), [], []

    def apply(start, end):
        applied.append((start, end, clock()))
        return {"promoted": 2 if end == s(20) else 0, "duration_seconds": 0.01}

    report = apply_windows(
        window_ends(10, s(0), s(40)), 10, apply, wait=clock.wait, clock=clock, log=lines.append
    )
    assert applied == [
        (s(0), s(10), s(10)),
        (s(10), s(20), s(20)),
        (s(20), s(30), s(30)),
        (s(30), s(40), s(40)),
    ]
    assert clock.waits == [9.0, 10.0, 10.0, 10.0]
    assert (report.applied, report.windows, report.promoted, report.failed) == (4, 4, 2, [])
    # the windows summed: a line a minute of windows that moved something (here the batch's end)
    assert lines == [f"4 windows from {s(0).isoformat()} to {s(40).isoformat()}: 2 promoted (slowest 0.01 s)"]


def test_the_log_sums_windows_a_line_a_minute_when_busy_and_ten_when_quiet():
    clock, lines = SimulatedClock(s(0)), []
    moving = {"promoted": 1, "dead_lettered": 1, "duration_seconds": 0.02}
    report = apply_windows(
        window_ends(10, s(0), s(1200)),
        10,
        lambda start, end: moving if end <= s(120) else {"duration_seconds": 0.01},
        wait=clock.wait,
        clock=clock,
        log=lines.append,
    )
    assert report.windows == 120 and report.promoted == 12
    busy = "6 promoted, 6 dead-lettered (slowest 0.02 s)"
    assert lines == [
        f"6 windows from {s(0).isoformat()} to {s(60).isoformat()}: {busy}",
        f"6 windows from {s(60).isoformat()} to {s(120).isoformat()}: {busy}",
        f"60 windows from {s(120).isoformat()} to {s(720).isoformat()}: nothing due (slowest 0.01 s)",
        f"48 windows from {s(720).isoformat()} to {s(1200).isoformat()}: nothing due (slowest 0.01 s)",
    ]


def test_a_late_start_applies_the_passed_windows_as_one():
    """A retried task, or a run the scheduler started late: what is due by the latest passed end
    moves at once (a window promotes everything due by its end), then the batch keeps the clock."""
    clock, applied = SimulatedClock(s(35)), []
    report = apply_windows(
        window_ends(10, s(0), s(50)),
        10,
        lambda start, end: applied.append((start, end)) or {},
        wait=clock.wait,
        clock=clock,
        log=lambda line: None,
    )
    assert applied == [(s(0), s(30)), (s(30), s(40)), (s(40), s(50))]
    assert (report.applied, report.windows) == (3, 5)


def test_a_failed_window_is_covered_by_the_next_and_reported():
    clock, lines = SimulatedClock(s(0)), []

    def apply(start, end):
        if end == s(20):
            raise OSError("connection refused")
        return {"promoted": 1}

    report = apply_windows(
        window_ends(10, s(0), s(30)), 10, apply, wait=clock.wait, clock=clock, log=lines.append
    )
    assert report.failed == [(s(20), "OSError: connection refused")]
    assert (report.applied, report.windows, report.promoted) == (2, 2, 2)
    assert (
        f"window ending {s(20).isoformat()} failed (the next one covers it): OSError: connection refused"
        in lines
    )


def test_the_same_error_window_after_window_is_said_once_and_the_recovery_too():
    clock, lines = SimulatedClock(s(0)), []

    def apply(start, end):
        if s(20) <= end <= s(50):
            raise OSError("connection refused")
        return {}

    report = apply_windows(
        window_ends(10, s(0), s(60)), 10, apply, wait=clock.wait, clock=clock, log=lines.append
    )
    assert len(report.failed) == 4 and report.applied == 2
    assert [line for line in lines if "failed" in line] == [
        f"window ending {s(20).isoformat()} failed (the next one covers it): OSError: connection refused",
        f"window ending {s(60).isoformat()} applied after 4 failed windows",
    ]


def test_a_database_clock_behind_waits_and_applies_the_same_window():
    clock, attempts = SimulatedClock(s(0)), []

    def apply(start, end):
        attempts.append((end, clock()))
        if len(attempts) < 3:
            raise InvalidWindowError("window end is after the database's clock")
        return {}

    report = apply_windows(
        window_ends(10, s(0), s(10)), 10, apply, wait=clock.wait, clock=clock, log=lambda x: None
    )
    assert [end for end, _ in attempts] == [s(10)] * 3 and report.failed == []
    assert report.applied == 1 and clock.waits == [10.0, 0.25, 0.25]


def test_a_stop_ends_the_batch_before_its_next_window():
    clock, applied = SimulatedClock(s(0)), []

    def wait(seconds):
        clock.wait(seconds)
        return len(applied) == 2  # Airflow kills the task while it waits for its third window

    report = apply_windows(
        window_ends(10, s(0), s(50)),
        10,
        lambda a, b: applied.append(b) or {},
        wait=wait,
        clock=clock,
        log=print,
    )
    assert applied == [s(10), s(20)] and report.windows == 2


def test_a_paused_dag_stops_the_batch_before_its_next_window():
    clock, applied, lines = SimulatedClock(s(0)), [], []
    report = apply_windows(
        window_ends(10, s(0), s(60)),
        10,
        lambda a, b: applied.append(b) or {},
        wait=clock.wait,
        clock=clock,
        log=lines.append,
        paused=lambda: len(applied) == 2,  # an operator pauses the tier after its second window
    )
    assert applied == [s(10), s(20)] and report.paused and report.windows == 2
    assert lines[-1] == f"the DAG is paused: the batch stops before the window ending {s(30).isoformat()}"


def test_a_long_window_asks_whether_it_was_paused_while_it_waits():
    """A tier of 5-minute windows paused mid-wait ends its task within 10 s, not at the window."""
    clock, asked = SimulatedClock(s(0)), []

    def paused():
        asked.append(clock())
        return clock() >= s(125)  # paused 2 minutes into its first window

    report = apply_windows(
        window_ends(300, s(0), s(600)),
        300,
        lambda a, b: {},
        wait=clock.wait,
        clock=clock,
        log=print,
        paused=paused,
    )
    assert report.paused and report.windows == 0
    assert asked == [s(k) for k in range(0, 140, 10)] and clock() == s(130)


def test_unresolved_subscriptions_are_collected_once():
    clock = SimulatedClock(s(0))
    problem = {"unresolved_subscriptions": [{"topic": "t", "group": "g", "error": "no DLQ name"}]}
    report = apply_windows(
        window_ends(10, s(0), s(30)), 10, lambda a, b: problem, wait=clock.wait, clock=clock, log=print
    )
    assert report.unresolved == {"t/g": "no DLQ name"} and report.applied == 3


@pytest.mark.timeout(60)
def test_a_batch_promotes_each_retry_at_the_first_window_end_after_its_due_time(
    client, topic_group, database_url
):
    """On the real clock and the real store: windows of 1 s, three retries due 0.3 s into each;
    none becomes READY before the end of the window it is due in (0.7 s after its due time), and
    each application is one record in tier_runs, on the windows' grid (a slow machine may apply two
    windows as one: no bound on time is asserted)."""
    from redelivery.store import db
    from redelivery.tiers.run import TierRunRequest, run_tier

    now = client.conn.execute("SELECT now()").fetchone()[0]
    start = now.replace(microsecond=0) + timedelta(seconds=1)
    client.publish("orders", [{"n": i} for i in range(3)], at=now)
    got = client.receive("billing", "orders", 3, 30, at=now)
    for k, message in enumerate(got):  # due at start + k + 0.3 (a 10 s level, failed 9.7 s before)
        client.reconsume_later(
            "billing", [message], delay=10, error="x", at=start + timedelta(seconds=k - 9.7)
        )

    def apply(window_start, window_end):
        return run_tier(
            TierRunRequest(
                tier="seconds",
                window_start=window_start,
                window_end=window_end,
                run_key=f"b/{window_end.isoformat()}",
            ),
            url=database_url,
        )

    report = apply_windows(
        window_ends(1, start, start + timedelta(seconds=3)), 1, apply, wait=threading.Event().wait, log=print
    )
    assert (report.windows, report.promoted, report.failed) == (3, 3, [])
    with db.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM ready_at - due_at)::float8 FROM deliveries WHERE state = 'READY'"
        ).fetchall()
        records = conn.execute(
            "SELECT window_end, (summary->>'promoted')::int FROM tier_runs ORDER BY window_end"
        ).fetchall()
    assert len(rows) == 3 and all(late >= 0.69 for (late,) in rows), rows  # never before its window's end
    grid = [start + timedelta(seconds=k) for k in (1, 2, 3)]
    assert {end for end, _ in records} <= set(grid) and records[-1][0] == grid[-1]
    assert sum(n for _, n in records) == 3 and len(records) == report.applied
