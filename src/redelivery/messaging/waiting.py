"""Waiting for a message (issue 42): a receive with ``wait_seconds`` returns as soon as a message
is receivable for its group, or empty after the wait, as SQS's ``WaitTimeSeconds``, PGMQ's
``read_with_poll`` and Kafka's ``poll(timeout)`` do, without a query per consumer every few
milliseconds.

The consumer LISTENs on its topic's channel on its own connection (autocommit: a LISTEN takes
effect at once, and the receives run between waits) and keeps a row in ``receive_waiters`` while
it may wait. A publish, a tier run and a redrive that made messages receivable notify the channel
after their commit, and only when such a row has not expired (``NOTIFY_WAITERS``; a publish learns
it from the statement that records its batch): a notifying commit takes a lock of the whole
cluster, and nobody waiting must cost a publish nothing. A wake-up can still be missed (a publish
that read the table just before the row was written, a notification lost with a connection): the
consumer receives again at least every ``RECHECK_SECONDS`` while it waits. What the wait leaves
behind: the LISTEN, until the client closes; the row, until it expires (a minute at most after
the last wait) or the client closes (``leave``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import psycopg
from psycopg import sql

from redelivery.store import statements as S

#: The longest wait of a receive, seconds (SQS ``WaitTimeSeconds``: 0..20).
MAX_WAIT_SECONDS = 20
#: A waiting consumer receives again at least this often, seconds, whether or not it was woken: a
#: missed wake-up costs at most this much.
RECHECK_SECONDS = 1.0
#: How long a consumer's row stays after the wait that wrote it, seconds: the consumers that loop
#: on waiting receives write it once in this long, not once a wait.
PRESENCE_SECONDS = 30.0
_T = TypeVar("_T")
log = logging.getLogger(__name__)


def check_wait(wait_seconds) -> float:
    """``wait_seconds`` as a float; ``ValueError`` unless it is a number of 0..20 seconds (not a bool)."""
    if isinstance(wait_seconds, bool) or not (
        isinstance(wait_seconds, (int, float)) and 0 <= wait_seconds <= MAX_WAIT_SECONDS
    ):
        raise ValueError(f"wait_seconds must be 0..{MAX_WAIT_SECONDS} seconds, got {wait_seconds!r}")
    return float(wait_seconds)


def channel(topic_id: int) -> str:
    """The channel a topic's waiting consumers LISTEN on."""
    return f"redelivery_topic_{topic_id}"


def wait_for(context, topic_id: int, wait_seconds: float, once: Callable[[], list[_T]]) -> list[_T]:
    """After a receive that got nothing: ``once()`` (the receive again) until it returns something
    or ``wait_seconds`` passed, each time the topic's channel is notified and at least every
    ``RECHECK_SECONDS``. The first ``once()`` runs after this backend LISTENs and is present, so
    whatever a commit made receivable before is seen by it, and whatever after wakes it.
    ``context``: the client's (``messaging.context.ClientContext``), whose connection waits."""
    conn = context.conn
    deadline = time.monotonic() + wait_seconds
    _listen(context, topic_id)
    while True:
        _stay_present(context, topic_id, deadline)
        _drain(conn)  # what came before this receive: it will see that already
        got = once()
        remaining = deadline - time.monotonic()
        if got or remaining <= 0:
            return got
        for _ in conn.notifies(timeout=min(remaining, RECHECK_SECONDS), stop_after=1):
            break


def _listen(context, topic_id: int) -> None:
    """LISTEN on the topic's channel, once per connection (a reconnected client listens again)."""
    conn, topics = context.listening
    if conn is not context.conn:
        context.listening = conn, topics = context.conn, set()
        context.present_until.clear()  # a new backend: its rows are to write
    if topic_id not in topics:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(topic_id))))
        topics.add(topic_id)


def _stay_present(context, topic_id: int, deadline: float) -> None:
    """Keep this backend's row of ``topic_id`` until past ``deadline`` (a ``time.monotonic()``):
    written when the row it wrote last ends before, for ``PRESENCE_SECONDS`` more."""
    wall = datetime.now(UTC) + timedelta(seconds=deadline - time.monotonic())
    if context.present_until.get(topic_id, wall) > wall:
        return
    until = wall + timedelta(seconds=PRESENCE_SECONDS)
    row = context.conn.execute(S.WAITER_PRESENT, {"topic_id": topic_id, "until": until}).fetchone()
    context.present_until[topic_id] = row[0]


def _drain(conn: psycopg.Connection) -> None:
    """Take the notifications that arrived before now (during other statements, kept by psycopg)."""
    for _ in conn.notifies(timeout=0):
        pass


def wake(conn: psycopg.Connection, *, topic_ids: Iterable[int] = (), topics: Iterable[str] = ()) -> None:
    """Wake the consumers waiting on these topics (ids or names), after the commit that made
    messages receivable for them (``NOTIFY_WAITERS``: nothing is sent when nobody waits). A failure
    is logged, not raised: the commit is done, and a waiter receives again within
    ``RECHECK_SECONDS`` anyway."""
    params = {"topic_ids": list(topic_ids), "topics": list(topics)}
    try:
        if conn.autocommit:  # a transaction of its own
            conn.execute(S.NOTIFY_WAITERS, params).fetchall()
        else:
            with conn.transaction():  # one begun and committed here
                conn.execute(S.NOTIFY_WAITERS, params).fetchall()
    except psycopg.Error as exc:
        log.warning("waiting consumers not woken (%s): they receive again within %s s", exc, RECHECK_SECONDS)


def leave(context) -> None:
    """This client waits no more (it closes): its rows go; its LISTENs go with its connection."""
    if context.present_until and not context.conn.closed:
        try:
            context.conn.execute(S.WAITER_GONE)
        except psycopg.Error:  # the rows expire by themselves
            pass
    context.present_until.clear()
