"""Ordered subscriptions take keys of any length, and ``""`` is no key (issue 36).

0015 indexed ``deliveries.key`` itself: a btree entry holds 2,704 bytes at most, so one message
with a longer key that does not compress made every receive of its subscription fail, for good.
No index holds a key now, and every probe compares the key exactly:

- ``deliveries_one_head`` replaces the unique index ``deliveries_key_head``: an exclusion constraint
  on a hash index of the ordering unit (``ordering_key(topic_id, group_id, key)``, text), whose
  entries are 32-bit hash codes and whose candidates PostgreSQL compares exactly. A receive finds a
  key's head through it. It cannot be built concurrently: adding it holds ``deliveries`` for one
  read of the table, under the migrations' lock_timeout (a long transaction makes it give way and
  run again).
- ``deliveries_blocked`` replaces ``deliveries_key`` (every keyed row): the BLOCKED rows only, by
  ``hashtextextended(key, 0)`` (64 bits) and id, the key's queue; a head is in one key index, not
  two (an index entry at a random place costs a receive about half as much as the row itself).
  ``deliveries_key_redriven`` takes the digest too. Both built concurrently.
- ``deliveries_held``: the heads that hold their key by a failure (WAITING_RETRY, or HALTED: their
  dead letter holds it, ``on_exhausted`` halt), per group, held longest first: what the operator
  page lists and ``redelivery_blocked_keys`` counts (a head in flight is busy, not held).
- ``dlq_messages_short_key`` replaces ``dlq_messages_key`` (0011), a btree on every key: a message
  whose key is over the btree's limit could not be dead-lettered at all (a reject, a nack past its
  retries, a tier run's expired lease: the whole statement failed, every group's rows with it). It
  holds the keys of at most ``SHORT_KEY_BYTES`` (the page's search by key, ``DLQ_FILTER``, finds a
  longer one by the group's rows). Partial on the key, not a digest of it: the page's order comes
  from the index whatever the statistics (a digest has none until an ANALYZE, and its plan sorted).
  Built partition by partition, concurrently.
- ``""`` is no key (Pub/Sub: an empty ordering key is none): rows of an ordered subscription whose
  key is ``""`` become keyless, their BLOCKED ones READY, a HALTED head (its message a dead letter)
  deleted, and ``finish_ordered_heads`` leaves them alone.
- ``finish_ordered_heads`` finds a key's next message by the digest indexes, one probe per head
  (the redriven ones only for a subscription that has any, its subscription read once).

Revision ID: 0016
Revises: 0015
"""

from alembic import op
from sqlalchemy import text

from redelivery.store.migrations.online import build_index, build_partitioned_index

revision = "0016"
down_revision = "0015"

#: The longest key (bytes) the dead letters' key index holds: with the entry's other columns, under
#: a btree entry's 2,704 bytes. The same number as ``statements._shared.SHORT_KEY_BYTES``.
SHORT_KEY_BYTES = 2000

#: The ordering unit of a delivery row, one text for the hash index: ``topic/group/key`` (the ids
#: hold no "/", so two units are equal exactly when their parts are). Inlined by the planner, so a
#: statement's ``ordering_key(...) = ordering_key(...)`` meets the index's expression.
ORDERING_KEY = """
CREATE OR REPLACE FUNCTION redelivery.ordering_key(topic_id integer, group_id integer, key text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT topic_id::text || '/' || group_id::text || '/' || key $$;
"""

FINISH_ORDERED_HEADS = """
CREATE OR REPLACE FUNCTION redelivery.finish_ordered_heads() RETURNS trigger
LANGUAGE plpgsql SET search_path = redelivery AS $$
BEGIN
  -- Unordered rows have no key: nothing to do (one pass over the statement's deleted rows).
  IF NOT EXISTS (SELECT 1 FROM finished f WHERE f.key IS NOT NULL AND f.state <> 'BLOCKED') THEN
    RETURN NULL;
  END IF;
  -- A 'halt' subscription's head that went to its dead-letter queue holds its key as HALTED, with
  -- what its dead letter holds (counts, the failure that ended it, its history). Not looked for
  -- while no subscription halts (the subscriptions are few: one read).
  IF EXISTS (SELECT 1 FROM subscriptions s WHERE s.on_exhausted = 'halt') THEN
  INSERT INTO deliveries (topic_id, group_id, message_id, published_at, key, state, delivery_count,
                          reconsume_times, redrive_count, first_failure_at, last_failure_at, last_error,
                          attempts, created_at, updated_at)
  SELECT f.topic_id, f.group_id, f.message_id, f.published_at, f.key, 'HALTED', q.delivery_count,
         q.reconsume_times, q.redrive_count, q.first_failure_at, q.last_failure_at, q.last_error,
         q.attempts, f.created_at, now()
  FROM finished f JOIN subscriptions s ON s.topic_id = f.topic_id AND s.group_id = f.group_id
  JOIN dlq_messages q ON q.message_id = f.message_id AND q.group_id = f.group_id AND q.topic_id = f.topic_id
  WHERE f.key IS NOT NULL AND f.state IN ('READY', 'INFLIGHT', 'WAITING_RETRY')
    AND s.on_exhausted = 'halt';
  END IF;
  -- Every other head this statement deleted (a key has one: deliveries_one_head, so none is left)
  -- releases its key: the key's next message becomes READY. That is its oldest BLOCKED message a
  -- redrive brought back behind the head (deliveries_key_redriven, probed only for a subscription
  -- that has any), else its first BLOCKED message after the head (deliveries_blocked): every other
  -- message of the key the offset passed is younger than its head. Probes of the key's digest that
  -- start where the answer is, never walking the key's finished messages (dead index entries
  -- until a vacuum), the key itself compared exactly; each subscription read once; every EXISTS a
  -- probe per row whatever the statistics (OFFSET 0). Then the rows by their primary key (arrays:
  -- an index condition).
  WITH heads AS MATERIALIZED (
    SELECT f.topic_id, f.group_id, f.message_id, f.key, f.state FROM finished f
    WHERE f.key IS NOT NULL AND f.state <> 'BLOCKED'),
  subs AS MATERIALIZED (
    SELECT s.topic_id, s.group_id, s.on_exhausted = 'halt' AS halt,
           EXISTS (SELECT 1 FROM deliveries b WHERE b.topic_id = s.topic_id AND b.group_id = s.group_id
                     AND b.state = 'BLOCKED' AND b.redrive_count > 0 OFFSET 0) AS redriven
    FROM subscriptions s
    WHERE (s.topic_id, s.group_id) IN (SELECT DISTINCT h.topic_id, h.group_id FROM heads h)),
  nexts AS MATERIALIZED (
    SELECT h.topic_id, h.group_id,
           coalesce(
             CASE WHEN s.redriven THEN
               (SELECT b.message_id FROM deliveries b
                WHERE b.topic_id = h.topic_id AND b.group_id = h.group_id
                  AND hashtextextended(b.key, 0) = hashtextextended(h.key, 0) AND b.key = h.key
                  AND b.state = 'BLOCKED' AND b.redrive_count > 0
                ORDER BY b.message_id LIMIT 1) END,
             (SELECT b.message_id FROM deliveries b
              WHERE b.topic_id = h.topic_id AND b.group_id = h.group_id
                AND hashtextextended(b.key, 0) = hashtextextended(h.key, 0) AND b.key = h.key
                AND b.message_id > h.message_id AND b.state = 'BLOCKED'
              ORDER BY b.message_id LIMIT 1)) AS message_id
    FROM heads h JOIN subs s ON s.topic_id = h.topic_id AND s.group_id = h.group_id
    -- a halt subscription's head dead-lettered is HALTED now (above): its key stays held
    WHERE h.state = 'HALTED' OR NOT s.halt
       OR NOT EXISTS (SELECT 1 FROM dlq_messages q WHERE q.message_id = h.message_id
                        AND q.group_id = h.group_id AND q.topic_id = h.topic_id OFFSET 0)),
  -- {"<message id>": ["<group id>", ...]} of the rows to promote (a message's id is its topic's):
  -- each candidate row checked by a lookup, not against the whole list (a list of 500 rows
  -- compared with each of 500 rows cost 40 ms an ack with 1,000 keys)
  chosen AS (
    SELECT jsonb_object_agg(message_id::text, groups) AS lookup
    FROM (SELECT message_id, jsonb_agg(group_id::text) AS groups FROM nexts
          WHERE message_id IS NOT NULL GROUP BY message_id) n)
  UPDATE deliveries d SET state = 'READY', ready_at = now(), updated_at = now()
  WHERE d.topic_id = ANY(ARRAY(SELECT topic_id FROM nexts WHERE message_id IS NOT NULL))
    AND d.group_id = ANY(ARRAY(SELECT group_id FROM nexts WHERE message_id IS NOT NULL))
    AND d.message_id = ANY(ARRAY(SELECT message_id FROM nexts WHERE message_id IS NOT NULL))
    AND ((SELECT lookup FROM chosen) -> d.message_id::text) ? d.group_id::text
    AND d.state::text = 'BLOCKED';  -- as text: the rows by their primary key, never by the scan of
                                    -- deliveries_blocked a state the partial index has would allow
  RETURN NULL;
END $$;
"""

#: The exclusion constraint, added once (a re-run after it was added leaves it alone).
ONE_HEAD = """
DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'deliveries_one_head'
                   AND conrelid = 'redelivery.deliveries'::regclass) THEN
    ALTER TABLE redelivery.deliveries ADD CONSTRAINT deliveries_one_head
      EXCLUDE USING hash ((redelivery.ordering_key(topic_id, group_id, key)) WITH =)
      WHERE (key IS NOT NULL AND state <> 'BLOCKED');
  END IF;
END $$;
"""

#: ``""`` is no key: a HALTED head of key "" goes (its dead letter stays: the trigger promotes the
#: key's next message), then the key's rows become keyless, BLOCKED ones READY.
EMPTY_KEYS = """
DELETE FROM redelivery.deliveries WHERE key = '' AND state = 'HALTED';
UPDATE redelivery.deliveries SET key = NULL, updated_at = now(),
    state = CASE WHEN state = 'BLOCKED' THEN 'READY' ELSE state END,
    ready_at = CASE WHEN state = 'BLOCKED' THEN now() ELSE ready_at END
WHERE key = '';
"""


def upgrade() -> None:
    digest = "topic_id, group_id, hashtextextended(key, 0), message_id"
    build_index("deliveries_blocked", f"deliveries ({digest}) WHERE state = 'BLOCKED'")
    build_index(
        "deliveries_key_redriven",
        f"deliveries ({digest}) WHERE state = 'BLOCKED' AND redrive_count > 0",
        replace=True,
    )
    build_index(
        "deliveries_held",
        "deliveries (group_id, topic_id, first_failure_at, message_id)"
        " WHERE key IS NOT NULL AND state IN ('WAITING_RETRY', 'HALTED')",
    )
    build_partitioned_index(
        "dlq_messages_short_key",
        "dlq_messages",
        "group_id, key, dead_lettered_at, message_id",
        where=f"octet_length(key) <= {SHORT_KEY_BYTES}",
    )
    # An index of a partitioned table is dropped under its lock for an instant (the migration's
    # lock_timeout, retried); no partition is read.
    op.execute("DROP INDEX IF EXISTS redelivery.dlq_messages_key")
    op.execute(ORDERING_KEY)
    op.execute(FINISH_ORDERED_HEADS)
    op.execute(EMPTY_KEYS)
    op.execute(ONE_HEAD)
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS redelivery.deliveries_key_head")
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS redelivery.deliveries_key")


#: 0015's indexes hold the key itself: a btree entry takes 2,704 bytes at most (a third of a page).
BTREE_ENTRY_LIMIT = 2704


def refuse_long_keys() -> None:
    """Refuse the downgrade, before it changes anything, while a key that 0015's btree indexes may
    not hold is live or dead-lettered (their build would fail half-way, leaving an INVALID index).
    Raises ``RuntimeError`` naming how many."""
    limit = BTREE_ENTRY_LIMIT // 2  # a key that does not compress, beside the entry's other columns
    live, dead = (
        op.get_bind()
        .execute(
            text(
                "SELECT (SELECT count(*) FROM redelivery.deliveries WHERE octet_length(key) > :limit),"
                " (SELECT count(*) FROM redelivery.dlq_messages WHERE octet_length(key) > :limit)"
            ),
            {"limit": limit},
        )
        .one()
    )
    if live or dead:
        raise RuntimeError(
            f"cannot downgrade below 0016: {live} live and {dead} dead-lettered messages have keys over"
            f" {limit:,} bytes, which 0015's btree indexes may not hold ({BTREE_ENTRY_LIMIT:,} bytes an"
            " entry); finish or purge them first"
        )


def _0015():
    """Migration 0015's module (its name starts with a digit: loaded from its file)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).with_name("0015_ordering_keys.py")
    spec = importlib.util.spec_from_file_location("redelivery_migration_0015", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def downgrade() -> None:
    refuse_long_keys()
    build_partitioned_index("dlq_messages_key", "dlq_messages", "group_id, key, dead_lettered_at, message_id")
    op.execute("DROP INDEX IF EXISTS redelivery.dlq_messages_short_key")
    build_index(
        "deliveries_key_head",
        "deliveries (topic_id, group_id, key) WHERE key IS NOT NULL AND state <> 'BLOCKED'",
        unique=True,
    )
    text = "topic_id, group_id, key, message_id"
    build_index("deliveries_key", f"deliveries ({text}) WHERE key IS NOT NULL")
    build_index(
        "deliveries_key_redriven",
        f"deliveries ({text}) WHERE state = 'BLOCKED' AND redrive_count > 0",
        replace=True,
    )
    op.execute("ALTER TABLE redelivery.deliveries DROP CONSTRAINT IF EXISTS deliveries_one_head")
    op.execute(_0015().FINISH_ORDERED_HEADS)
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS redelivery.deliveries_blocked")
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS redelivery.deliveries_held")
    op.execute("DROP FUNCTION IF EXISTS redelivery.ordering_key(integer, integer, text)")
