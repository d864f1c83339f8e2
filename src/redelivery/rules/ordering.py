"""The rules of an ordered subscription that need no I/O (issue 31; the statements keep the rest:
``RECEIVE_ORDERED``, ``finish_ordered_heads``)."""

from __future__ import annotations

#: How far past its offset an ordered subscription's receive looks for messages of free keys: the
#: most SQS FIFO scans past blocked message groups (Amazon SQS Developer Guide, "FIFO queue
#: message grouping": 20,000 messages).
MAX_ORDERED_SCAN = 20_000


def ordered_scan(max_messages: int) -> int:
    """Messages an ordered receive of ``max_messages`` reads past the offset: four times the batch
    (at least 100), so that a batch fills past keys blocked in it, at most ``MAX_ORDERED_SCAN``."""
    return min(MAX_ORDERED_SCAN, max(100, 4 * max_messages))
