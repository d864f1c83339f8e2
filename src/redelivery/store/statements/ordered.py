"""An ordered subscription's receive (issue 31, 36): its lock, its passes over the log, what it left."""

from __future__ import annotations

from redelivery.store.statements._shared import _named
from redelivery.store.statements.messages import (
    _LEASE_END,
    _RECEIVE_GATE,
    _RECEIVE_MOVED,
    _RECEIVE_READY,
    _receive_rows,
)

# The statements keep the layout of SQL, not of Python.
# fmt: off

#: A message's ordering key: its key, ``""`` being none (Pub/Sub: an empty ordering key is no key).
#: What a delivery row of an ordered subscription carries (``deliveries.key``; NULL: keyless).
_ORDERING_KEY_OF = "nullif({0}.key, '')"
#: The head of key ``{3}`` of subscription (``{1}``, ``{2}``) (alias ``{0}``): its row that is not
#: BLOCKED, through the hash index of ``deliveries_one_head`` on the ordering unit (its entries are
#: hash codes of any key's size; PostgreSQL compares the unit itself exactly).
_HEAD_OF = """ordering_key({0}.topic_id, {0}.group_id, {0}.key) = ordering_key({1}, {2}, {3})
        AND {0}.key IS NOT NULL AND {0}.state <> 'BLOCKED'"""
#: The BLOCKED rows of key ``{3}`` (alias ``{0}``), through ``deliveries_blocked``: the key's 64-bit
#: digest (an entry of any key's size: a btree entry holds 2,704 bytes at most), then the key itself.
_BLOCKED_OF = """{0}.topic_id = {1} AND {0}.group_id = {2}
        AND hashtextextended({0}.key, 0) = hashtextextended({3}, 0) AND {0}.key = {3}
        AND {0}.state = 'BLOCKED'"""
#: Whether key ``{2}`` of subscription (``{0}``, ``{1}``) is held: it has a head (every key with a row
#: has one, in any committed state). The head is locked ``FOR KEY SHARE``: an answer that deletes it
#: waits for the statement's transaction, and its trigger then sees the BLOCKED rows written there.
#: A head deleted meanwhile drops out of the lock: the key is held still if it has BLOCKED rows (the
#: trigger that deleted the head made the oldest of them READY, a head nothing but a receive, which
#: waits for the subscription row, can end), else it is free. A free key costs one probe. Each
#: EXISTS a probe per key whatever the statistics (OFFSET 0: never a hash of the whole table).
_HEAD = _HEAD_OF.format("h", "{0}", "{1}", "{2}")
_HELD = f"""CASE WHEN EXISTS (SELECT 1 FROM deliveries h WHERE {_HEAD} OFFSET 0)
          THEN EXISTS (SELECT 1 FROM (SELECT 1 FROM deliveries h WHERE {_HEAD} FOR KEY SHARE) locked OFFSET 0)
               OR EXISTS (SELECT 1 FROM deliveries b
                          WHERE {_BLOCKED_OF.format("b", "{0}", "{1}", "{2}")} OFFSET 0)
          ELSE false END"""

#: An ordered subscription's receive begins with this, in the receive's transaction: its row locked
#: (receives and redrives of the group take turns), so that RECEIVE_ORDERED, the next statement,
#: sees every delivery row committed before. Returns how many messages its breaker lets the receive
#: hand out (``_RECEIVE_GATE``: 0 while open, no pass is run); nothing: the subscription is not
#: ordered (or gone).
LOCK_ORDERED_SUBSCRIPTION = _named("LOCK_ORDERED_SUBSCRIPTION", f"""
    WITH {_RECEIVE_GATE}
    SELECT (SELECT n FROM gate) FROM subscriptions
    WHERE topic_id = %(topic_id)s AND group_id = %(group_id)s AND ordered FOR UPDATE OF subscriptions""")
#: One pass of an ordered subscription's receive (after LOCK_ORDERED_SUBSCRIPTION, in its
#: transaction): its READY rows, then past the offset up to ``scan`` messages (``messaging.ordered``
#: runs passes until the batch is full or nothing is left past the offset, so that no number of
#: blocked messages holds back a free key). A message there is free when it has no ordering key, or
#: it is the first of its key in the scan and its key has no delivery row (no unfinished message, no
#: HALTED head). It takes the messages up to the batch's room-th free one (all it scanned when fewer
#: are free): the free ones are leased, every other one gets a BLOCKED row (no lease, delivery count
#: 0) that finish_ordered_heads promotes once its key's head ends, and the offset moves past all of
#: them. Whether a key is held is ``_HELD``: its head locked ``FOR KEY SHARE`` (an answer that deletes
#: it waits for this receive's transaction, and its trigger then sees the BLOCKED rows written
#: here), or, its head deleted meanwhile, BLOCKED rows of it (the oldest now its READY head). One
#: message per key per receive: a batch never holds two messages of a key, so no answer can commit
#: one ahead of another.
RECEIVE_ORDERED = _named("RECEIVE_ORDERED", f"""
    WITH {_RECEIVE_READY},
    subscription AS (
      SELECT s.consume_offset FROM subscriptions s
      WHERE s.topic_id = %(topic_id)s AND s.group_id = %(group_id)s AND s.ordered
        AND (SELECT n FROM room) > 0),
    -- whole rows: the scan reads each message's row for its key anyway (the log's only index is
    -- its primary key), so the bodies of the ones handed out come with it
    scanned AS (
      -- nth 1: its key's first (keys sorted by their digest first: an int8 compares faster)
      SELECT c.*, row_number() OVER (PARTITION BY hashtextextended(c.key, 0), c.key ORDER BY c.id) AS nth
      FROM (SELECT m.id, {_ORDERING_KEY_OF.format("m")} AS key, m.body, m.content_type, m.properties,
                   m.published_at, m.origin_message_id, m.key AS published_key
            FROM messages m
            WHERE m.topic_id = %(topic_id)s AND m.id > (SELECT consume_offset FROM subscription)
            -- the limit a value of a subquery, as RECEIVE's: planned as an index scan in id order
            -- that stops at it (a constant let the planner read every message past the offset and
            -- sort them)
            ORDER BY m.id LIMIT (SELECT %(scan)s::bigint)) c),
    -- free: keyless, or its key's first in the scan and the key not held (_HELD: probed, and its
    -- head locked, once per key; a key whose head this statement leases again is held: its row,
    -- changed by this statement, would drop out of the lock, as PostgreSQL locks no row its own
    -- statement changed)
    flagged AS MATERIALIZED (
      SELECT c.*, CASE WHEN c.key IS NULL THEN true
                       WHEN c.nth > 1 THEN false
                       WHEN c.key IN (SELECT a.key FROM again a) THEN false
                       ELSE NOT {_HELD.format("%(topic_id)s", "%(group_id)s", "c.key")} END AS free
      FROM scanned c),
    cut AS (
      SELECT coalesce((SELECT f.id FROM flagged f WHERE f.free ORDER BY f.id
                       OFFSET greatest((SELECT n FROM room) - 1, 0) LIMIT 1),
                      (SELECT max(id) FROM flagged)) AS id),
    -- what the pass takes (the bodies stay in flagged: read once more, for the ones handed out)
    new AS (SELECT f.id, f.key, f.free, f.published_at FROM flagged f WHERE f.id <= (SELECT id FROM cut)),
    handed AS (
      SELECT f.id, f.published_key AS key, f.body, f.content_type, f.properties, f.published_at,
             f.origin_message_id
      FROM flagged f WHERE f.free AND f.id <= (SELECT id FROM cut)),
    taken AS (
      INSERT INTO deliveries (topic_id, group_id, message_id, published_at, key, state, delivery_count,
                              invisible_until, ready_at)
      SELECT %(topic_id)s, %(group_id)s, n.id, n.published_at, n.key,
             CASE WHEN n.free THEN 'INFLIGHT' ELSE 'BLOCKED' END::delivery_state,
             CASE WHEN n.free THEN 1 ELSE 0 END, CASE WHEN n.free THEN {_LEASE_END} END, n.published_at
      FROM new n),
    {_RECEIVE_MOVED}
    {_receive_rows("handed")}""")
#: Whether an ordered subscription has messages past its offset (``messaging.ordered``: a pass that
#: did not fill the batch runs again while there are): the first one's id, read from the log's
#: primary key in id order (as an EXISTS, the planner may read the whole partition to find none).
PAST_OFFSET = _named("PAST_OFFSET", """
    SELECT (SELECT m.id FROM messages m
            WHERE m.topic_id = %(topic_id)s
              AND m.id > (SELECT consume_offset FROM subscriptions
                          WHERE topic_id = %(topic_id)s AND group_id = %(group_id)s)
            ORDER BY m.id LIMIT 1) IS NOT NULL""")
# fmt: on
