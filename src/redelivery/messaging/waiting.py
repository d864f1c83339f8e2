"""Waiting for a message (issue 42): a receive with ``wait_seconds`` returns as soon as a message
is receivable for its group, or empty after the wait, as SQS's ``WaitTimeSeconds``, PGMQ's
``read_with_poll`` and Kafka's ``poll(timeout)`` do, without a query per consumer every few
milliseconds.

The consumer LISTENs on a channel of its connection's own (``redelivery_wait_<backend pid>``;
autocommit: a LISTEN takes effect at once, and the receives run between waits) and holds its
topic's and its subscription's waiter locks while it waits (session advisory locks, shared:
``WAITER_PRESENT``, migration 0023); all end with the wait. A publish, a tier run and a redrive
that made n messages receivable (and, in the database, the delete that ends n heads of an ordered
group's keys: migration 0018's trigger) notify up to n of each group's backends that hold the
subscription's lock, chosen at random, after their commit, and only when one waits (a publish
learns it from the statement that records its batch, which tries the topic's lock
exclusively): a notifying commit takes a lock of the whole cluster, and nobody waiting must cost
a publish nothing; and a message wakes one consumer, not a herd of every waiter that would all run
a receive for it (16 consumers: 16 receives a message). A wake-up can still be missed (a publish
that looked an instant before the consumer took its locks, a notification lost with a
connection): the consumer receives again at least every ``RECHECK_SECONDS`` while it waits.
What a wait leaves behind: nothing, and no tuple while it waits (a row per wait was two dead
versions a transaction holding the xmin horizon kept); a consumer that dies waiting, nothing
either: its locks and its LISTEN go with its session; a wait whose release was cut short (an
interrupt, a cancel), the locks its session may still hold, released by the client's next receive
on that connection (outside a transaction), and its LISTEN by its next wait.

What a wait costs: the client knows, for each of its connections, which subscriptions' locks it
released there (``WaitLocks``), so saying it waits again reads no ``pg_locks`` (a read of the
whole cluster's lock table, every partition of it held while it runs); the first wait of each
subscription on a connection, and one after a round trip cut short, read it. A receive of a
subscription whose last receive that could wait found nothing at once says it waits first, then
receives once (not a receive, then the LISTEN, then the same receive again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from redelivery.store import statements as S

#: The longest wait of a receive, seconds (SQS ``WaitTimeSeconds``: 0..20).
MAX_WAIT_SECONDS = 20
#: A waiting consumer receives again at least this often, seconds, whether or not it was woken: a
#: missed wake-up costs at most this much.
RECHECK_SECONDS = 1.0
_T = TypeVar("_T")
log = logging.getLogger(__name__)


def check_wait(wait_seconds, conn: psycopg.Connection) -> float:
    """``wait_seconds`` as a float; ``ValueError`` unless it is a number of 0..20 seconds (not a
    bool), and, when above 0, ``conn`` is in no transaction (a LISTEN takes effect at its commit)."""
    if isinstance(wait_seconds, bool) or not (
        isinstance(wait_seconds, (int, float)) and 0 <= wait_seconds <= MAX_WAIT_SECONDS
    ):
        raise ValueError(f"wait_seconds must be 0..{MAX_WAIT_SECONDS} seconds, got {wait_seconds!r}")
    if wait_seconds and conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError("a receive cannot wait inside a transaction: LISTEN takes effect at its commit")
    return float(wait_seconds)


def channel(backend_pid: int) -> str:
    """The channel a waiting consumer's connection (its backend) LISTENs on."""
    return f"redelivery_wait_{backend_pid}"


def wait_for(
    context, topic_id: int, group_id: int, wait_seconds: float, once: Callable[[bool], list[_T]]
) -> list[_T]:
    """After a receive that got nothing (or instead of it, when the subscription's last wait began
    so: ``waits_first``): ``once(recheck)`` (the receive again) until it returns something or
    ``wait_seconds`` passed, each time this backend is notified and at least every
    ``RECHECK_SECONDS``. The first ``once`` runs after this backend LISTENs and holds the waiter
    locks, so whatever a commit made receivable before is seen by it, and whatever after wakes it;
    once the wait returns, the locks are released (a notifier picks only waiting backends).
    ``recheck`` is True for a receive after a re-check's timeout only: the receive then asks
    whether its topic and subscription are still the ones it waits on (a woken one does not: what
    woke it was sent for them). ``context``: the client's
    (``messaging.context.ClientContext``), whose connection waits."""
    conn = context.conn
    deadline = time.monotonic() + wait_seconds
    name = sql.Identifier(channel(_server_pid(context)))
    key = (topic_id, group_id)
    subscription = {"topic_id": topic_id, "group_id": group_id}
    locks = context.wait_locks.setdefault(conn, WaitLocks())
    # known released here (not held): taken at once; else (never waited on this session, or a round
    # trip cut short) taken only when not held already
    statement = S.WAITER_PRESENT if key in locks.released else S.WAITER_PRESENT_AGAIN
    locks.released.discard(key)
    locks.unsure.add(key)  # until the release's round trip has answered
    try:
        locks.waiting = key
        with conn.pipeline():  # one round trip, committed before the receive: listening, then waiting
            conn.execute(sql.SQL("LISTEN {}").format(name))
            conn.execute(statement, subscription)
        recheck = False  # at the re-checks only
        first = True
        while True:
            _drain(conn)  # what came before this receive: it will see that already
            got = once(recheck)
            if first:  # the next receive that may wait says so first when this one found nothing
                (context.found_empty.discard if got else context.found_empty.add)(key)
                first = False
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            recheck = True
            for _ in conn.notifies(timeout=min(remaining, RECHECK_SECONDS), stop_after=1):
                recheck = False
                break
    finally:
        try:  # one round trip: waiting and listening no more (a listening session that later sits in
            # a long transaction would hold every notification of the database in the queue)
            with conn.pipeline():
                conn.execute(S.WAITER_DONE, subscription)
                conn.execute(sql.SQL("UNLISTEN {}").format(name))
            locks.unsure.discard(key)
            locks.released.add(key)
        except psycopg.Error:  # unsure: held still (a cancel), or gone with a broken connection's session
            pass
        finally:
            locks.waiting = None


def waits_first(context, topic_id: int, group_id: int) -> bool:
    """Whether a receive of the subscription that may wait says it waits before it receives: its
    last such receive found nothing at once (the receive before the LISTEN would find nothing
    again: a statement saved a message while consumers outnumber messages; a receive that then
    finds messages at once costs a LISTEN and its release, and the next receives first again)."""
    return (topic_id, group_id) in context.found_empty


@dataclass
class WaitLocks:
    """What a client knows of the waiter locks of one connection's session: ``released``, the
    subscriptions whose locks it released there after a wait (the release answered: not held);
    ``unsure``, those whose registration or release round trip did not answer (cut short: held, or
    not). A subscription in neither was never waited on by this client there (another may have)."""

    released: set[tuple[int, int]] = field(default_factory=set)
    unsure: set[tuple[int, int]] = field(default_factory=set)
    #: the subscription a wait on this connection is waiting on now (its receives leave it alone)
    waiting: tuple[int, int] | None = None


def release_left_behind(context) -> None:
    """Before a receive: release the waiter locks that an earlier wait's release, cut short, may
    have left held on the client's connection (``WAITER_LEFT_BEHIND`` reads ``pg_locks``: the rare
    case): a backend that holds them but waits no more would be notified in a waiting consumer's
    stead. Not inside a transaction (a failure would abort the caller's), nor by the receives of a
    wait in progress (they would release its locks, or, of another subscription of its topic, its
    topic's share: the topic's lock is only tried, so a lock left behind may hold none); a failure
    is logged, and the next receive outside a transaction tries again. The LISTEN left with them
    ends with the next wait."""
    conn = context.conn
    locks = context.wait_locks.get(conn)
    if not locks or not locks.unsure or locks.waiting is not None:
        return
    if conn.info.transaction_status != TransactionStatus.IDLE:
        return
    for topic_id, group_id in sorted(locks.unsure):
        try:
            conn.execute(S.WAITER_LEFT_BEHIND, {"topic_id": topic_id, "group_id": group_id})
        except psycopg.Error as exc:
            log.warning("a wait's locks left held are not released yet (%s): the next receive tries", exc)
            return
        locks.unsure.discard((topic_id, group_id))
        locks.released.add((topic_id, group_id))


def _server_pid(context) -> int:
    """The server's pid of the client's session, asked once per connection (a reconnected client
    asks again): a waiter's channel is named by it, as the notifier finds it (``pg_locks.pid``),
    not by the pid the connection reported, which a pooler makes up."""
    conn, pid = context.server_pid
    if conn is not context.conn:
        pid = context.conn.execute(S.BACKEND_PID).fetchone()[0]
        context.server_pid = (context.conn, pid)
    return pid


def _drain(conn: psycopg.Connection) -> None:
    """Take the notifications that arrived before now (during other statements, kept by psycopg)."""
    for _ in conn.notifies(timeout=0):
        pass


def wake(conn: psycopg.Connection, wanted: Iterable[tuple[int, int | None, int]]) -> None:
    """Wake the consumers waiting for what a commit made receivable: ``wanted``, (topic id, group id
    or None for every group of the topic, how many messages) each, up to that many of the group's
    waiting backends (``NOTIFY_WAITERS``: nothing is sent when nobody waits). Runs after the commit
    (in the caller's transaction, if it has one open: in a savepoint of it, its notifications sent
    when it commits). A failure is logged, not raised: the commit is done, and a waiter receives
    again within ``RECHECK_SECONDS`` anyway."""
    rows = [(t, g, max(int(n), 1)) for t, g, n in wanted]
    if not rows:
        return
    topic_ids, group_ids, counts = (list(column) for column in zip(*rows, strict=True))
    params = {"topic_ids": topic_ids, "group_ids": group_ids, "counts": counts}
    try:
        if conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
            conn.execute(S.NOTIFY_WAITERS, params).fetchall()  # a transaction of its own
        else:
            with conn.transaction():  # one begun and committed here, or a savepoint of the caller's
                conn.execute(S.NOTIFY_WAITERS, params).fetchall()
    except psycopg.Error as exc:
        log.warning("waiting consumers not woken (%s): they receive again within %s s", exc, RECHECK_SECONDS)
