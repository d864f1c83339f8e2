"""The rules of an ordered subscription that need no I/O (issues 31, 36; the statements keep the
rest: ``RECEIVE_ORDERED``, ``finish_ordered_heads``; ``messaging.ordered`` runs the passes)."""

from __future__ import annotations

#: The most messages one pass of an ordered receive reads past the offset, and one transaction of
#: it passes over before a receive that found nothing to hand out commits and goes on in another:
#: what SQS FIFO scans past blocked message groups at most (Amazon SQS Developer Guide, "FIFO queue
#: message grouping": 20,000 messages). A receive itself goes on until its batch is full or nothing
#: is left past the offset: no number of blocked messages holds back a free key.
MAX_ORDERED_SCAN = 20_000


def first_scan(room: int) -> int:
    """Messages the first pass of an ordered receive with ``room`` places left reads past the
    offset: the room and a quarter more (at least 16 more), for the few messages of busy keys
    among them; at most ``MAX_ORDERED_SCAN``. A pass reads what it takes: every message it reads up
    to the batch's room-th free one is leased or written BLOCKED, and each key it reads is probed,
    so reading four times the batch (issue 31) cost three probes in four for nothing."""
    return min(MAX_ORDERED_SCAN, room + max(16, room // 4))


def next_scan(scan: int) -> int:
    """The next pass's read after a pass of ``scan`` that did not fill the batch: twice as many (the
    messages there are mostly of busy keys), at most ``MAX_ORDERED_SCAN``."""
    return min(MAX_ORDERED_SCAN, 2 * scan)
