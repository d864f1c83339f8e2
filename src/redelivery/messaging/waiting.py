"""Waiting for a message (issue 42): a receive with ``wait_seconds`` returns as soon as a message
is receivable for its group, or empty after the wait, as SQS's ``WaitTimeSeconds``, PGMQ's
``read_with_poll`` and Kafka's ``poll(timeout)`` do, without a query per consumer every few
milliseconds.

The consumer LISTENs on a channel of its connection's own (``redelivery_wait_<backend pid>``;
autocommit: a LISTEN takes effect at once, and the receives run between waits) and keeps a row in
``receive_waiters`` per topic and group while it may wait. A publish, a tier run and a redrive that
made n messages receivable notify up to n of each group's backends, chosen at random, after their
commit, and
only when such a row has not expired (``NOTIFY_WAITERS``; a publish learns it from the statement
that records its batch): a notifying commit takes a lock of the whole cluster, and nobody waiting
must cost a publish nothing; and a message wakes one consumer, not a herd of every waiter that
would all run a receive for it (16 consumers: 16 receives a message). A chosen consumer that is
busy receives the message when it next asks. A wake-up can still be missed (a publish
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


def channel(backend_pid: int) -> str:
    """The channel a waiting consumer's connection (its backend) LISTENs on."""
    return f"redelivery_wait_{backend_pid}"


def wait_for(
    context, topic_id: int, group_id: int, wait_seconds: float, once: Callable[[], list[_T]]
) -> list[_T]:
    """After a receive that got nothing: ``once()`` (the receive again) until it returns something
    or ``wait_seconds`` passed, each time the topic's channel is notified and at least every
    ``RECHECK_SECONDS``. The first ``once()`` runs after this backend LISTENs and is present, so
    whatever a commit made receivable before is seen by it, and whatever after wakes it.
    ``context``: the client's (``messaging.context.ClientContext``), whose connection waits."""
    conn = context.conn
    deadline = time.monotonic() + wait_seconds
    _listen(context)
    while True:
        _stay_present(context, (topic_id, group_id), deadline)
        _drain(conn)  # what came before this receive: it will see that already
        got = once()
        remaining = deadline - time.monotonic()
        if got or remaining <= 0:
            return got
        for _ in conn.notifies(timeout=min(remaining, RECHECK_SECONDS), stop_after=1):
            break


def _listen(context) -> None:
    """LISTEN on the backend's channel, once per connection (a reconnected client listens again)."""
    if context.listening is not context.conn:
        listen = sql.SQL("LISTEN {}").format(sql.Identifier(channel(context.conn.info.backend_pid)))
        context.conn.execute(listen)
        context.listening = context.conn
        context.present_until.clear()  # a new backend: its rows are to write


def _stay_present(context, subscription: tuple[int, int], deadline: float) -> None:
    """Keep this backend's row of ``subscription`` (topic id, group id) until past ``deadline`` (a
    ``time.monotonic()``): written when the row it wrote last ends before, for
    ``PRESENCE_SECONDS`` more."""
    wall = datetime.now(UTC) + timedelta(seconds=deadline - time.monotonic())
    if context.present_until.get(subscription, wall) > wall:
        return
    until = wall + timedelta(seconds=PRESENCE_SECONDS)
    params = {"topic_id": subscription[0], "group_id": subscription[1], "until": until}
    context.present_until[subscription] = context.conn.execute(S.WAITER_PRESENT, params).fetchone()[0]


def _drain(conn: psycopg.Connection) -> None:
    """Take the notifications that arrived before now (during other statements, kept by psycopg)."""
    for _ in conn.notifies(timeout=0):
        pass


def wake(
    conn: psycopg.Connection,
    messages: int,
    *,
    topic_ids: Iterable[int] = (),
    topics: Iterable[str] = (),
    group_ids: Iterable[int] | None = None,
) -> None:
    """Wake up to ``messages`` consumers of each group (of ``group_ids``; None: every group) waiting
    on these topics (ids or names), after the commit that made that many messages receivable for
    them (``NOTIFY_WAITERS``: nothing is sent when nobody waits). A failure is logged, not raised:
    the commit is done, and a waiter receives again within ``RECHECK_SECONDS`` anyway."""
    params = {
        "topic_ids": list(topic_ids),
        "topics": list(topics),
        "group_ids": None if group_ids is None else list(group_ids),
        "wake": max(int(messages), 1),
    }
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
