"""An ordered subscription's receive (issues 31, 36): passes of ``RECEIVE_ORDERED`` over the log,
each after its subscription row is locked, until the batch is full or nothing is left past the
offset, so that a free key's message is handed out whatever number of blocked messages the log
holds before it (SQS FIFO looks past blocked message groups for the others)."""

from __future__ import annotations

import psycopg

from redelivery.rules.ordering import MAX_ORDERED_SCAN, first_scan, next_free_share, next_scan
from redelivery.store import db
from redelivery.store import statements as S


def lease_ordered(
    conn: psycopg.Connection, params: dict, free_share: float = 1.0
) -> tuple[list[tuple], float]:
    """(the rows an ordered subscription's receive leased (``RECEIVE_COLUMNS``), committed before
    they return; the share of free messages its next receive may expect). ``params``: RECEIVE's
    (``max_messages`` the batch); ``free_share``: what the last receive left (``first_scan``). One
    transaction, its row locked first (``LOCK_ORDERED_SUBSCRIPTION``: receives and redrives of the
    group take turns, and each pass's snapshot holds every delivery row committed before), with
    passes of ``RECEIVE_ORDERED`` until the batch is full, nothing is left past the offset, or the
    transaction passed over ``MAX_ORDERED_SCAN`` messages: then, when it handed nothing out, it
    commits what it wrote (BLOCKED rows, the offset moved: nothing a caller has to see) and goes on
    in another one, so a transaction stays short and the receive still returns only once it found
    something or the log's end. A transaction that would give a key a second head (a concurrent
    writer of the key committed first: ``deliveries_one_head`` refuses it) changed nothing and runs
    again. No rows: the subscription is not ordered (or gone), or nothing was there."""
    while True:
        rows, more, free_share = db.retry_lock_conflicts(
            lambda share=free_share: _one_transaction(conn, params, share), conflicts=db.HEAD_CONFLICTS
        )
        if rows or not more:
            return sorted(rows, key=lambda row: row[0]), free_share  # oldest first, whatever pass took it


def _one_transaction(conn: psycopg.Connection, params: dict, share: float) -> tuple[list[tuple], bool, float]:
    """(rows leased, whether messages are left past the offset, the next free share) of one
    transaction of passes."""
    rows: list[tuple] = []
    room = params["max_messages"]
    scan = first_scan(room, share)
    scanned = 0
    with conn.transaction(), conn.cursor(binary=True) as cursor:
        admitted = cursor.execute(S.LOCK_ORDERED_SUBSCRIPTION, params).fetchone()
        if admitted is None or admitted[0] == 0:  # not ordered (or gone), or its breaker is open
            return [], False, share
        room = min(room, admitted[0])  # half-open: its probe
        while True:
            got = cursor.execute(S.RECEIVE_ORDERED, {**params, "max_messages": room, "scan": scan}).fetchall()
            first, rows, room, scanned = not scanned, rows + got, room - len(got), scanned + scan
            if room == 0:
                return rows, True, next_free_share(share, len(got), scan, True) if first else share
            if not cursor.execute(S.PAST_OFFSET, params).fetchone()[0]:  # the log's end, not busy keys
                return rows, False, share
            if first:  # it read all it was to read, and took it: so many of them were free
                share = next_free_share(share, len(got), scan, False)
            if scanned >= MAX_ORDERED_SCAN:
                return rows, True, share
            scan = next_scan(scan)
