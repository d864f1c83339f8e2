"""Ordered subscriptions (issue 31): a failing message holds back the later messages of its key,
and nothing else (SQS FIFO message groups, Pub/Sub ordering keys, RocketMQ orderly consumption).

- ``subscriptions.ordered`` and ``on_exhausted`` ('continue': a head that is dead-lettered
  releases its key; 'halt': the key stays held until its dead letter is redriven).
- ``deliveries.key``: the message's key, set only on the delivery rows of an ordered subscription
  (NULL everywhere else, so that the indexes below hold nothing of an unordered one).
- Two delivery states: BLOCKED (a message the offset passed while its key had an unfinished
  message: no lease, no delivery yet) and HALTED (the dead-lettered head of a key of a 'halt'
  subscription: it holds the key; its message is counted as a dead letter, not as unfinished).
- ``deliveries_key_head``: at most one head per key (a row that is not BLOCKED), enforced by
  PostgreSQL whatever a statement gets wrong; ``deliveries_key``: a key's rows in id order (the
  next BLOCKED one after its head, the newest one); ``deliveries_key_redriven``: the BLOCKED
  messages a redrive brought back behind their key's head (nearly always none).
- ``finish_ordered_heads``: after every DELETE of delivery rows (an ack, a dead-lettering by any
  path, a topic's or group's deletion), the keys whose head it removed get their next BLOCKED row
  promoted to READY, or, for a 'halt' subscription whose head went to a dead-letter queue, a HALTED
  row. A trigger, so that no path that ends a delivery can forget it; it runs after the statement,
  with a snapshot of its own, so it sees a BLOCKED row a receive committed while the DELETE waited
  for it (docs/ARCHITECTURE.md, "Ordered subscriptions").

The enum values are committed first (a value added to an enum cannot be used in the transaction
that adds it); the columns are changes of the catalog only (no default, or a constant one); the
indexes are built concurrently; the check constraint is added NOT VALID and validated without
blocking writes.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

from redelivery.store.migrations.online import build_index

revision = "0015"
down_revision = "0014"

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
  -- Every other head this statement deleted (a key has one: deliveries_key_head, so none is left)
  -- releases its key: the key's next message becomes READY. That is its oldest BLOCKED message a redrive
  -- brought back behind the head (older than the head: deliveries_key_redriven, nearly always
  -- empty), else its first BLOCKED message after the head: every other message of the key the
  -- offset passed is younger than its head. Both are index probes that start where the answer is,
  -- never walking the key's finished messages (dead index entries until a vacuum). Then the rows by
  -- their primary key (arrays: an index condition), matched exactly.
  WITH nexts AS MATERIALIZED (
    SELECT h.topic_id, h.group_id,
           coalesce(
             (SELECT b.message_id FROM deliveries b
              WHERE b.topic_id = h.topic_id AND b.group_id = h.group_id AND b.key = h.key
                AND b.state = 'BLOCKED' AND b.redrive_count > 0
              ORDER BY b.message_id LIMIT 1),
             (SELECT b.message_id FROM deliveries b
              WHERE b.topic_id = h.topic_id AND b.group_id = h.group_id AND b.key = h.key
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


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("ALTER TYPE redelivery.delivery_state ADD VALUE IF NOT EXISTS 'BLOCKED'")
        op.execute("ALTER TYPE redelivery.delivery_state ADD VALUE IF NOT EXISTS 'HALTED'")
    op.execute("""
    SET LOCAL search_path TO redelivery;
    ALTER TABLE subscriptions ADD COLUMN IF NOT EXISTS ordered boolean NOT NULL DEFAULT false,
        ADD COLUMN IF NOT EXISTS on_exhausted text NOT NULL DEFAULT 'continue'
            CHECK (on_exhausted IN ('continue', 'halt'));
    ALTER TABLE deliveries ADD COLUMN IF NOT EXISTS key text;
    ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_state_check;
    ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_state_key_check;
    ALTER TABLE deliveries ADD CONSTRAINT deliveries_state_key_check CHECK (
        state IN ('READY', 'INFLIGHT', 'WAITING_RETRY')
        OR (state IN ('BLOCKED', 'HALTED') AND key IS NOT NULL)) NOT VALID;
    """)
    op.execute(FINISH_ORDERED_HEADS)
    op.execute("""
    DROP TRIGGER IF EXISTS deliveries_finish_ordered_heads ON redelivery.deliveries;
    CREATE TRIGGER deliveries_finish_ordered_heads AFTER DELETE ON redelivery.deliveries
        REFERENCING OLD TABLE AS finished FOR EACH STATEMENT
        EXECUTE FUNCTION redelivery.finish_ordered_heads();
    """)
    # SHARE UPDATE EXCLUSIVE: receives and answers go on while it reads the table
    op.execute("ALTER TABLE redelivery.deliveries VALIDATE CONSTRAINT deliveries_state_key_check")
    build_index("deliveries_key", "deliveries (topic_id, group_id, key, message_id) WHERE key IS NOT NULL")
    build_index(
        "deliveries_key_redriven",
        "deliveries (topic_id, group_id, key, message_id) WHERE state = 'BLOCKED' AND redrive_count > 0",
    )
    build_index(
        "deliveries_key_head",
        "deliveries (topic_id, group_id, key) WHERE key IS NOT NULL AND state <> 'BLOCKED'",
        unique=True,
    )


def downgrade() -> None:
    op.execute("""
    SET LOCAL search_path TO redelivery;
    DROP TRIGGER IF EXISTS deliveries_finish_ordered_heads ON deliveries;
    DROP FUNCTION IF EXISTS finish_ordered_heads();
    DROP INDEX IF EXISTS deliveries_key_head;
    DROP INDEX IF EXISTS deliveries_key;
    DROP INDEX IF EXISTS deliveries_key_redriven;
    -- unordered again: a held key's later messages are READY, a halted head is its dead letter only
    UPDATE deliveries SET state = 'READY', ready_at = now() WHERE state = 'BLOCKED';
    DELETE FROM deliveries WHERE state = 'HALTED';
    ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_state_key_check;
    ALTER TABLE deliveries ADD CONSTRAINT deliveries_state_check
        CHECK (state IN ('READY', 'INFLIGHT', 'WAITING_RETRY'));
    ALTER TABLE deliveries DROP COLUMN IF EXISTS key;
    ALTER TABLE subscriptions DROP COLUMN IF EXISTS ordered, DROP COLUMN IF EXISTS on_exhausted;
    """)
