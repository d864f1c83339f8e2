"""An ordered subscription's receive (issues 31, 36): passes of ``RECEIVE_ORDERED`` over the log,
each after its subscription row is locked, until the batch is full or nothing is left past the
offset, so that a free key's message is handed out whatever number of blocked messages the log
holds before it (SQS FIFO looks past blocked message groups for the others)."""

from __future__ import annotations

import psycopg

from redelivery.rules.ordering import MAX_ORDERED_SCAN, first_scan, next_scan
from redelivery.store import db
from redelivery.store import statements as S


def lease_ordered(conn: psycopg.Connection, params: dict) -> list[tuple]:
    """The rows an ordered subscription's receive leased (``RECEIVE_COLUMNS``), committed before
    they return. ``params``: RECEIVE's (``max_messages`` the batch). One transaction, its row locked
    first (``LOCK_ORDERED_SUBSCRIPTION``: receives and redrives of the group take turns, and each
    pass's snapshot holds every delivery row committed before), with passes of ``RECEIVE_ORDERED``
    until the batch is full, nothing is left past the offset, or the transaction passed over
    ``MAX_ORDERED_SCAN`` messages: then, when it handed nothing out, it commits what it wrote
    (BLOCKED rows, the offset moved: nothing a caller has to see) and goes on in another one, so a
    transaction stays short and the receive still returns only once it found something or the log's
    end. A transaction that would give a key a second head (a concurrent writer of the key committed
    first: ``deliveries_one_head`` refuses it) changed nothing and runs again. Nothing: the
    subscription is not ordered (or gone), or nothing was there."""
    while True:
        rows, more = db.retry_lock_conflicts(
            lambda: _one_transaction(conn, params), conflicts=db.HEAD_CONFLICTS
        )
        if rows or not more:
            return sorted(rows, key=lambda row: row[0])  # oldest first, whatever pass took it


def _one_transaction(conn: psycopg.Connection, params: dict) -> tuple[list[tuple], bool]:
    """(rows leased, whether messages are left past the offset) of one transaction of passes."""
    rows: list[tuple] = []
    room, scan, scanned = params["max_messages"], first_scan(params["max_messages"]), 0
    with conn.transaction(), conn.cursor(binary=True) as cursor:
        if cursor.execute(S.LOCK_ORDERED_SUBSCRIPTION, params).fetchone() is None:
            return [], False
        while True:
            got = cursor.execute(S.RECEIVE_ORDERED, {**params, "max_messages": room, "scan": scan}).fetchall()
            rows += got
            room -= len(got)
            scanned += scan
            if room == 0:
                return rows, True
            if not cursor.execute(S.PAST_OFFSET, params).fetchone()[0]:
                return rows, False
            if scanned >= MAX_ORDERED_SCAN:
                return rows, True
            scan = next_scan(scan)
