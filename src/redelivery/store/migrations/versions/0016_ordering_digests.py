"""Ordered subscriptions take keys of any length, and ``""`` is no key (issue 36).

0015 indexed ``deliveries.key`` itself: a btree entry holds 2,704 bytes at most, so one message
with a longer key that does not compress made every receive of its subscription fail, for good.
The indexes now hold a fixed-size digest of the key, and the key is compared exactly:

- ``deliveries_key`` and ``deliveries_key_redriven``: ``hashtextextended(key, 0)`` (64 bits) in
  place of the key, rebuilt concurrently; every probe compares the key itself too, so two keys
  with one digest are never taken for one.
- ``deliveries_one_head`` replaces the unique index ``deliveries_key_head``: an exclusion constraint
  on a hash index of the ordering unit (``ordering_key(topic_id, group_id, key)``, text), whose
  entries are 32-bit hash codes and whose candidates PostgreSQL compares exactly. It cannot be
  built concurrently: adding it holds ``deliveries`` for one read of the table, under the
  migrations' lock_timeout (a long transaction makes it give way and run again).
- ``""`` is no key (Pub/Sub: an empty ordering key is none): rows of an ordered subscription whose
  key is ``""`` become keyless, their BLOCKED ones READY, a HALTED head (its message a dead letter)
  deleted, and ``finish_ordered_heads`` leaves them alone.
- ``finish_ordered_heads`` finds a key's next message by the digest indexes.

Revision ID: 0016
Revises: 0015
"""

from alembic import op

from redelivery.store.migrations.online import build_index

revision = "0016"
down_revision = "0015"

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
  -- what its dead letter holds (counts, the failure that ended it, its history).
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
  -- Every other head this statement deleted (a key has one: deliveries_one_head, so none is left)
  -- releases its key: the key's next message becomes READY. That is its oldest BLOCKED message a
  -- redrive brought back behind the head (deliveries_key_redriven, nearly always empty), else its
  -- first BLOCKED message after the head: every other message of the key the offset passed is
  -- younger than its head. Both are probes of the key's digest that start where the answer is,
  -- never walking the key's finished messages (dead index entries until a vacuum), the key itself
  -- compared exactly. Then the rows by their primary key (arrays: an index condition).
  WITH nexts AS MATERIALIZED (
    SELECT h.topic_id, h.group_id,
           coalesce(
             (SELECT b.message_id FROM deliveries b
              WHERE b.topic_id = h.topic_id AND b.group_id = h.group_id
                AND hashtextextended(b.key, 0) = hashtextextended(h.key, 0) AND b.key = h.key
                AND b.state = 'BLOCKED' AND b.redrive_count > 0
              ORDER BY b.message_id LIMIT 1),
             (SELECT b.message_id FROM deliveries b
              WHERE b.topic_id = h.topic_id AND b.group_id = h.group_id
                AND hashtextextended(b.key, 0) = hashtextextended(h.key, 0) AND b.key = h.key
                AND b.message_id > h.message_id AND b.state = 'BLOCKED'
              ORDER BY b.message_id LIMIT 1)) AS message_id
    FROM finished h
    WHERE h.key IS NOT NULL AND h.state <> 'BLOCKED'
      AND NOT CASE WHEN h.state = 'HALTED' THEN false  -- a halted key released
                   WHEN (SELECT s.on_exhausted FROM subscriptions s
                         WHERE s.topic_id = h.topic_id AND s.group_id = h.group_id) IS DISTINCT FROM 'halt'
                   THEN false
                   ELSE EXISTS (SELECT 1 FROM dlq_messages q WHERE q.message_id = h.message_id
                                  AND q.group_id = h.group_id AND q.topic_id = h.topic_id) END)
  UPDATE deliveries d SET state = 'READY', ready_at = now(), updated_at = now()
  WHERE d.topic_id = ANY(ARRAY(SELECT topic_id FROM nexts WHERE message_id IS NOT NULL))
    AND d.group_id = ANY(ARRAY(SELECT group_id FROM nexts WHERE message_id IS NOT NULL))
    AND d.message_id = ANY(ARRAY(SELECT message_id FROM nexts WHERE message_id IS NOT NULL))
    AND (d.topic_id, d.group_id, d.message_id) = ANY(ARRAY(
          SELECT (n.topic_id, n.group_id, n.message_id) FROM nexts n WHERE n.message_id IS NOT NULL))
    AND d.state = 'BLOCKED';
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
    build_index("deliveries_key", f"deliveries ({digest}) WHERE key IS NOT NULL", replace=True)
    build_index(
        "deliveries_key_redriven",
        f"deliveries ({digest}) WHERE state = 'BLOCKED' AND redrive_count > 0",
        replace=True,
    )
    op.execute(ORDERING_KEY)
    op.execute(FINISH_ORDERED_HEADS)
    op.execute(EMPTY_KEYS)
    op.execute(ONE_HEAD)
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS redelivery.deliveries_key_head")


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
    build_index(
        "deliveries_key_head",
        "deliveries (topic_id, group_id, key) WHERE key IS NOT NULL AND state <> 'BLOCKED'",
        unique=True,
    )
    text = "topic_id, group_id, key, message_id"
    build_index("deliveries_key", f"deliveries ({text}) WHERE key IS NOT NULL", replace=True)
    build_index(
        "deliveries_key_redriven",
        f"deliveries ({text}) WHERE state = 'BLOCKED' AND redrive_count > 0",
        replace=True,
    )
    op.execute("ALTER TABLE redelivery.deliveries DROP CONSTRAINT IF EXISTS deliveries_one_head")
    op.execute(_0015().FINISH_ORDERED_HEADS)
    op.execute("DROP FUNCTION IF EXISTS redelivery.ordering_key(integer, integer, text)")
