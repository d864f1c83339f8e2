"""The rules of an ordered subscription that need no I/O (issues 31, 36; the statements keep the
rest: ``RECEIVE_ORDERED``, ``finish_ordered_heads``; ``messaging.ordered`` runs the passes)."""

from __future__ import annotations

import math

#: The most messages one pass of an ordered receive reads past the offset, and one transaction of
#: it passes over before a receive that found nothing to hand out commits and goes on in another:
#: what SQS FIFO scans past blocked message groups at most (Amazon SQS Developer Guide, "FIFO queue
#: message grouping": 20,000 messages). A receive itself goes on until its batch is full or nothing
#: is left past the offset: no number of blocked messages holds back a free key.
MAX_ORDERED_SCAN = 20_000
#: The least share of free messages a first pass plans for (one in twenty: at most twenty times the
#: room read before a second pass).
MIN_FREE_SHARE = 0.05


def first_scan(room: int, free_share: float = 1.0) -> int:
    """Messages the first pass of an ordered receive with ``room`` places left reads past the
    offset: enough for ``room`` free messages when ``free_share`` of what it reads is free (what the
    subscription's last receives found: ``next_free_share``), and a sixteenth more (at least 16),
    for the few of busy keys among them; at most ``MAX_ORDERED_SCAN``. A pass reads what it takes:
    every message it reads up to the batch's room-th free one is leased or written BLOCKED, and
    each key it reads is probed, so reading four times the batch (issue 31) cost three probes in
    four for nothing with many keys, and too few passes over a second one with few."""
    share = min(1.0, max(free_share, MIN_FREE_SHARE))
    return min(MAX_ORDERED_SCAN, math.ceil(room / share) + max(16, room // 16))


def next_scan(scan: int) -> int:
    """The next pass's read after a pass of ``scan`` that did not fill the batch: twice as many (the
    messages there are mostly of busy keys), at most ``MAX_ORDERED_SCAN``."""
    return min(MAX_ORDERED_SCAN, 2 * scan)


def next_free_share(free_share: float, handed: int, scanned: int, filled: bool) -> float:
    """What the next receive expects of the messages it reads to be free, after one that handed out
    ``handed`` of the ``scanned`` it read in its first pass: that share when the pass fell short
    (every message it read was taken), else a little more than before (keys come free again)."""
    if filled:
        return min(1.0, free_share * 1.25)
    return max(MIN_FREE_SHARE, handed / scanned) if scanned else free_share
