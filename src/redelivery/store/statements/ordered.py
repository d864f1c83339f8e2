"""An ordered subscription's receive (issue 31, 36): its lock, its passes over the log, what it left."""

from __future__ import annotations

from redelivery.store.statements._shared import _named
from redelivery.store.statements.messages import _LEASE_END, _RECEIVE_MOVED, _RECEIVE_READY, _receive_rows

# The statements keep the layout of SQL, not of Python.
# fmt: off

#: A message's ordering key: its key, ``""`` being none (Pub/Sub: an empty ordering key is no key).
#: What a delivery row of an ordered subscription carries (``deliveries.key``; NULL: keyless).
_ORDERING_KEY_OF = "nullif({0}.key, '')"
#: The delivery rows of key ``{1}`` of the statement's subscription (alias ``{0}``): the key's
#: digest, which the indexes ``deliveries_key`` and ``deliveries_key_redriven`` hold (an entry of any
#: size: a btree entry holds 2,704 bytes at most), then the key itself, exactly.
_KEY_ROWS = """{0}.topic_id = %(topic_id)s AND {0}.group_id = %(group_id)s
        AND hashtextextended({0}.key, 0) = hashtextextended({1}, 0) AND {0}.key = {1}"""

#: An ordered subscription's receive begins with this, in the receive's transaction: its row locked
#: (receives and redrives of the group take turns), so that RECEIVE_ORDERED, the next statement,
#: sees every delivery row committed before. Nothing: the subscription is not ordered (or gone).
LOCK_ORDERED_SUBSCRIPTION = _named("LOCK_ORDERED_SUBSCRIPTION", """
    SELECT 1 FROM subscriptions
    WHERE topic_id = %(topic_id)s AND group_id = %(group_id)s AND ordered FOR UPDATE""")
#: One pass of an ordered subscription's receive (after LOCK_ORDERED_SUBSCRIPTION, in its
#: transaction): its READY rows, then past the offset up to ``scan`` messages (``messaging.ordered``
#: runs passes until the batch is full or nothing is left past the offset, so that no number of
#: blocked messages holds back a free key). A message there is free when it has no ordering key, or
#: it is the first of its key in the scan and its key has no delivery row (no unfinished message, no
#: HALTED head). It takes the messages up to the batch's room-th free one (all it scanned when fewer
#: are free): the free ones are leased, every other one gets a BLOCKED row (no lease, delivery count
#: 0) that finish_ordered_heads promotes once its key's head ends, and the offset moves past all of
#: them. A key's newest delivery row is locked ``FOR KEY SHARE``: an answer that deletes it (the
#: key's last row, its head) waits for this receive, and its trigger then sees the BLOCKED rows
#: written here; a row deleted before drops out of the lock and the next newest is locked instead
#: (LIMIT counts only the rows locked: PostgreSQL puts it above the lock), so the key is free only
#: when none is left. One message per key per receive: a batch never holds two messages of a key,
#: so no answer can commit one ahead of another.
RECEIVE_ORDERED = _named("RECEIVE_ORDERED", f"""
    WITH {_RECEIVE_READY},
    subscription AS (
      SELECT s.consume_offset FROM subscriptions s
      WHERE s.topic_id = %(topic_id)s AND s.group_id = %(group_id)s AND s.ordered
        AND (SELECT n FROM room) > 0),
    -- whole rows: the scan reads each message's row for its key anyway (the log's only index is
    -- its primary key), so the bodies of the ones handed out come with it
    scanned AS (
      SELECT m.id, {_ORDERING_KEY_OF.format("m")} AS key, m.body, m.content_type, m.properties,
             m.published_at, m.origin_message_id, m.key AS published_key
      FROM messages m
      WHERE m.topic_id = %(topic_id)s AND m.id > (SELECT consume_offset FROM subscription)
      -- the limit a value of a subquery, as RECEIVE's: planned as an index scan in id order that
      -- stops at it (a constant let the planner read every message past the offset and sort them)
      ORDER BY m.id LIMIT (SELECT %(scan)s::bigint)),
    firsts AS (SELECT c.key, min(c.id) AS id FROM scanned c WHERE c.key IS NOT NULL GROUP BY c.key),
    held AS (
      SELECT f.key FROM firsts f
      CROSS JOIN LATERAL (
        SELECT 1 FROM deliveries d WHERE {_KEY_ROWS.format("d", "f.key")}
        ORDER BY d.message_id DESC LIMIT 1 FOR KEY SHARE) newest
      -- a key whose head this statement leases again: its row, changed by this statement, is
      -- skipped by the lock above (PostgreSQL locks no row its own statement changed)
      UNION ALL
      SELECT a.key FROM again a WHERE a.key IS NOT NULL),
    flagged AS (
      SELECT c.id, c.key, c.published_at, c.published_key,
             c.body, c.content_type, c.properties, c.origin_message_id,
             c.key IS NULL OR c.id IN (SELECT f.id FROM firsts f WHERE f.key NOT IN (SELECT key FROM held))
               AS free
      FROM scanned c),
    cut AS (
      SELECT coalesce((SELECT id FROM (SELECT id, row_number() OVER (ORDER BY id) AS k FROM flagged
                                        WHERE free) x
                       WHERE x.k = (SELECT n FROM room)),
                      (SELECT max(id) FROM scanned)) AS id),
    new AS (SELECT f.* FROM flagged f WHERE f.id <= (SELECT id FROM cut)),
    handed AS (
      SELECT n.id, n.published_key AS key, n.body, n.content_type, n.properties, n.published_at,
             n.origin_message_id
      FROM new n WHERE n.free),
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
#: did not fill the batch runs again while there are).
PAST_OFFSET = _named("PAST_OFFSET", """
    SELECT EXISTS (SELECT 1 FROM messages m
                   WHERE m.topic_id = %(topic_id)s
                     AND m.id > (SELECT consume_offset FROM subscriptions
                                 WHERE topic_id = %(topic_id)s AND group_id = %(group_id)s))""")
# fmt: on
