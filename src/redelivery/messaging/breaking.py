"""A subscription's circuit breaker as answers and tier windows drive it (issue 41; the rules are
``rules.breaker``'s, the statements ``statements.breakers``').

An answer that fails holds its subscriptions' breaker locks shared first (``catalog.lock_breakers``),
counts what it saw last in its transaction (``count_answers``), and, once it committed, lets the
breaker take its next state when, closed, a failure counted, or it is half-open (``evaluate``): a
transition is its own short transaction, the lock exclusive, never inside an answer's (two answers
holding it shared could not both take it). A crash between the answer and
the transition leaves the counts, which the next answer or tier window evaluates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import psycopg

from redelivery.rules.breaker import BreakerConfig
from redelivery.store import db
from redelivery.store import statements as S

log = logging.getLogger("redelivery.breaker")


@dataclass(frozen=True)
class Transition:
    """A breaker's transition: the subscription, its states before and after, the answers the
    breaker went by (successes, counted failures), and until when it is open (None: closed)."""

    topic_id: int
    group_id: int
    from_state: str
    to_state: str
    succeeded: int
    failed: int
    open_until: datetime | None

    def line(self, topic: str, group: str) -> str:
        """One log line naming the subscription; a held breaker's says what to do."""
        figures = f"{self.failed} counted failures and {self.succeeded} successes"
        text = (
            f"breaker of group {group!r} on topic {topic!r}: {self.from_state} -> {self.to_state} ({figures})"
        )
        if self.to_state == "held":
            return (
                text + ": its open time passed the maximum; it stays open, deliveries parked, until an "
                f"operator closes it (redelivery breaker close --group {group} --topic {topic})"
            )
        if self.to_state == "open":
            return text + f", open until {self.open_until:%Y-%m-%d %H:%M:%S %Z}"
        return text


def count_answers(
    conn: psycopg.Connection,
    config: BreakerConfig,
    topic_id: int,
    group_id: int,
    succeeded: int,
    errors: list[str],
) -> tuple[int, str | None]:
    """In an answer's transaction, after its delivery rows and its group's row: add ``succeeded``
    acks and the failures of ``errors`` (each ``receipts.error_lookup``'s JSON) that count to the
    subscription's answers of this second. Returns (failures counted, the breaker's state)."""
    params = {"topic_id": topic_id, "group_id": group_id, "succeeded": succeeded}
    params["errors"] = "[" + ",".join(errors) + "]"
    failed, state, _ = conn.execute(S.COUNT_OUTCOMES, {**params, "rule": config.params()["rule"]}).fetchone()
    return failed, state


def evaluate(
    conn: psycopg.Connection, config: BreakerConfig, topic_id: int, group_id: int
) -> Transition | None:
    """The breaker's next state (``EVALUATE_BREAKER``), in a transaction of its own: the transition,
    audited, or None. A transition to held is logged as an error, the others as warnings."""
    params = {**config.params(), "topic_id": topic_id, "group_id": group_id}
    params.pop("rule")

    def run() -> tuple | None:
        with conn.transaction():
            conn.execute(S.LOCK_BREAKER, params)  # the answers holding it shared end first
            return conn.execute(S.EVALUATE_BREAKER, params).fetchone()  # a snapshot after the wait

    row = db.retry_lock_conflicts(run)
    if row is None:
        return None
    transition = Transition(topic_id, group_id, *row)
    names = conn.execute(S.BREAKER_NAMES, {"topic_id": topic_id, "group_id": group_id}).fetchone()
    line = transition.line(*(names or (str(topic_id), str(group_id))))
    log.log(logging.ERROR if transition.to_state == "held" else logging.WARNING, line)
    return transition


def evaluate_all(conn: psycopg.Connection, breakers: dict[tuple[int, int], BreakerConfig]) -> list:
    """A tier window's (``tiers.run``): ``evaluate`` each subscription of
    ``breakers`` ({(topic id, group id): its ``breaker:``}) in turn; and a breaker an operator
    opened for a time on a subscription with no ``breaker:`` (nothing counts its answers, so no
    probe could close it) is closed once its time ended. Returns the transitions."""
    done = [t for (topic, group), config in breakers.items() if (t := evaluate(conn, config, topic, group))]
    for topic_id, group_id, ended in conn.execute(S.BREAKERS_NOT_CLOSED).fetchall():
        if ended and (topic_id, group_id) not in breakers:
            why = "its open time ended"
            found = set_state(conn, topic_id, group_id, "closed", None, "redelivery", why, 1)
            if found:
                done.append(Transition(topic_id, group_id, found["from"], "closed", 0, 0, None))
    return done


# ---- an operator's view and hands -------------------------------------------------------------

#: The columns of ``BREAKERS``, as ``breakers`` returns them.
BREAKER_FIELDS = (
    "topic", "group", "state", "open_until", "opened_at", "open_seconds", "probe_size", "changed_at",
    "changed_by", "opened_total", "closed_total", "held_total", "succeeded", "failed",
)  # fmt: skip
#: The columns of ``BREAKER_TRANSITIONS``.
TRANSITION_FIELDS = (
    "at", "topic", "group", "from", "to", "changed_by", "succeeded", "failed", "open_seconds", "open_until",
    "note",
)  # fmt: skip


def breakers(conn: psycopg.Connection, group: str | None = None, window_seconds: float = 60.0) -> list[dict]:
    """Every subscription's breaker (of ``group`` when given), not closed ones first: its state
    ('half_open' once an open one's open time passed), times, totals, and its answers of the last
    ``window_seconds`` (succeeded, counted failures)."""
    rows = conn.execute(S.BREAKERS, {"group": group, "window_seconds": window_seconds})
    return [dict(zip(BREAKER_FIELDS, row, strict=True)) for row in rows]


def history(conn: psycopg.Connection, group: str | None = None, limit: int = 20) -> list[dict]:
    """The latest ``limit`` transitions (of ``group`` when given), newest first."""
    rows = conn.execute(S.BREAKER_TRANSITIONS, {"group": group, "limit": limit})
    return [dict(zip(TRANSITION_FIELDS, row, strict=True)) for row in rows]


def set_state(
    conn: psycopg.Connection,
    topic_id: int,
    group_id: int,
    state: str,
    seconds: float | None,
    by: str,
    note: str | None,
    probe_size: int,
) -> dict | None:
    """An operator's transition (``SET_BREAKER``), checked by the caller: {"from", "to",
    "open_until"}, audited; None: no such subscription."""
    params = {"topic_id": topic_id, "group_id": group_id, "state": state, "open_seconds": seconds}
    params["probe_size"] = probe_size

    def run() -> tuple | None:
        with conn.transaction():
            conn.execute(S.LOCK_BREAKER, params)
            return conn.execute(S.SET_BREAKER, {**params, "changed_by": by, "note": note}).fetchone()

    row = db.retry_lock_conflicts(run)
    if row is None:
        return None
    log.warning(
        "breaker of group id %s on topic id %s set %s -> %s by %s", group_id, topic_id, row[0], row[1], by
    )
    return dict(zip(("from", "to", "open_until"), row, strict=True))
