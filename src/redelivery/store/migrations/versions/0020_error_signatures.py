"""A failure is more than text: its class, the top frame of the consumer's code, a bounded stack and
a signature (issue 40).

- ``normalized_error(message)``: the message (its first 8,000 characters) with what varies between
  two occurrences of one failure replaced: quoted values (``'...'``, ``"..."``, opened after a
  non-word character, with an optional ``b``/``r``/``u``/``f``/``E`` prefix: Python's and
  PostgreSQL's literals) by ``<q>``, UUIDs by ``<uuid>``, numbers and hexadecimal runs (``0x...``,
  or 8 or more hex digits with a digit among them) by ``<n>`` (one placeholder: an id of 8 decimal
  digits is a hex run too), runs of white space by one space.
- ``error_signature(class, message, frame)``: 12 hex digits of the SHA-256 of the class, the
  normalized message and the frame, one line each (SHA-256: PostgreSQL refuses md5 in FIPS mode).
  One failure, one signature: a statement that records a failure computes it here, from the same
  three values, whatever process recorded it.
- ``system_error_class(reason, attempts)``: the class of a failure redelivery itself recorded
  (an undecodable body, an ended lease), for dead letters that have none.
- ``dlq_messages`` gains ``error_class``, ``error_frame``, ``error_stack`` and ``signature``, plain
  nullable columns (adding them rewrites nothing). The statement that dead-letters sets them; a
  trigger fills a missing signature (a process of the version before, dead-lettering during the
  upgrade).
- The dead letters already there get their signature in batches of ``BACKFILL_BATCH``, each a
  short transaction of its own (row locks on one batch, never a lock of the table), resumed where
  it stopped if the migration is run again.
- ``dlq_messages_signature`` (group, signature, dead-lettered at, message id, topic, redrive count):
  the failures of a group grouped (with their topics, and how many failed again after a redrive)
  from the index alone, and the dead letters of one signature in the list's order. A dead letter
  is never updated after the backfill, so the trailing columns cost no index churn. Built
  partition by partition, concurrently.
- ``append_attempt`` keeps the stack of the newest entry only: 20 entries of history, one stack.

Every step can run again (a migration cut off halfway is run again by ``db.migrate``).

Revision ID: 0020
Revises: 0019
"""

from alembic import op
from sqlalchemy import text

from redelivery.store.migrations.online import build_partitioned_index

revision = "0020"
down_revision = "0019"

#: Dead letters given their signature per transaction of the backfill.
BACKFILL_BATCH = 5000

FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION redelivery.normalized_error(message text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  -- E'' strings: the same pattern whatever the session's standard_conforming_strings
  SELECT btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
           left(coalesce(message, ''), 8000),
           E'(^|[^[:alnum:]_])[bBrRuUfFeE]{0,2}(\'[^\']*\'|"[^"]*")', E'\\1<q>', 'g'),
           '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<uuid>', 'g'),
           E'\\m(0[xX][0-9a-fA-F]+|(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,})\\M', '<n>', 'g'),
           '[0-9]+', '<n>', 'g'),
           '[[:space:]]+', ' ', 'g'))
$$;

CREATE OR REPLACE FUNCTION redelivery.error_signature(error_class text, message text, frame text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT left(encode(sha256(convert_to(coalesce(error_class, '') || E'\n'
                                       || redelivery.normalized_error(message) || E'\n'
                                       || coalesce(frame, ''), 'UTF8')), 'hex'), 12)
$$;

-- rules.failures' UNDECODABLE_CLASS and LEASE_EXPIRED_CLASS, as this migration knows them
CREATE OR REPLACE FUNCTION redelivery.system_error_class(reason text, attempts jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN reason = 'UNDECODABLE' THEN 'redelivery.UndecodableBody'
              WHEN attempts -> -1 ->> 'outcome' = 'lease_expired' THEN 'redelivery.LeaseExpired' END
$$;

CREATE OR REPLACE FUNCTION redelivery.fill_signature() RETURNS trigger
LANGUAGE plpgsql SET search_path = redelivery AS $$
BEGIN
  NEW.error_class := coalesce(NEW.error_class, system_error_class(NEW.reason::text, NEW.attempts));
  NEW.signature := error_signature(NEW.error_class, NEW.last_error, NEW.error_frame);
  RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION redelivery.append_attempt(history jsonb, entry jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_agg(CASE WHEN n <= jsonb_array_length(history) THEN e - 'stack' ELSE e END
                              ORDER BY n), '[]'::jsonb)
    FROM jsonb_array_elements(history || jsonb_build_array(entry)) WITH ORDINALITY AS a(e, n)
    WHERE n > jsonb_array_length(history) + 1 - 20
$$;
"""

#: One batch of the backfill: the next ``n`` dead letters after (dlq, group, message) by the
#: primary key, those without a signature given one; returns the batch's last key (none: done).
BACKFILL = """
WITH batch AS (
  SELECT dlq_id, group_id, message_id FROM redelivery.dlq_messages
  WHERE (dlq_id, group_id, message_id) > (:dlq_id, :group_id, :message_id)
  ORDER BY dlq_id, group_id, message_id LIMIT :n),
filled AS (
  UPDATE redelivery.dlq_messages q
  SET error_class = redelivery.system_error_class(q.reason::text, q.attempts),
      signature = redelivery.error_signature(redelivery.system_error_class(q.reason::text, q.attempts),
                                             q.last_error, NULL)
  FROM batch b
  WHERE q.dlq_id = b.dlq_id AND q.group_id = b.group_id AND q.message_id = b.message_id
    AND q.signature IS NULL)
SELECT dlq_id, group_id, message_id FROM batch ORDER BY 1 DESC, 2 DESC, 3 DESC LIMIT 1
"""

OLD_APPEND_ATTEMPT = """
CREATE OR REPLACE FUNCTION redelivery.append_attempt(history jsonb, entry jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_agg(e ORDER BY n), '[]'::jsonb)
    FROM jsonb_array_elements(history || jsonb_build_array(entry)) WITH ORDINALITY AS a(e, n)
    WHERE n > jsonb_array_length(history) + 1 - 20
$$;
"""


def upgrade() -> None:
    op.execute(FUNCTIONS)
    op.execute("""
    ALTER TABLE redelivery.dlq_messages
        ADD COLUMN IF NOT EXISTS error_class text, ADD COLUMN IF NOT EXISTS error_frame text,
        ADD COLUMN IF NOT EXISTS error_stack text, ADD COLUMN IF NOT EXISTS signature text
    """)
    op.execute("""
    CREATE OR REPLACE TRIGGER dlq_messages_fill_signature BEFORE INSERT ON redelivery.dlq_messages
        FOR EACH ROW WHEN (NEW.signature IS NULL) EXECUTE FUNCTION redelivery.fill_signature()
    """)
    _backfill()
    build_partitioned_index(
        "dlq_messages_signature",
        "dlq_messages",
        "group_id, signature, dead_lettered_at, message_id, topic_id, redrive_count",
    )


def _backfill() -> None:
    """The dead letters already there get their signature, ``BACKFILL_BATCH`` a transaction (the
    columns and the trigger are committed first: a dead letter made meanwhile gets its own)."""
    bind = op.get_bind()
    with op.get_context().autocommit_block():
        last = {"dlq_id": 0, "group_id": 0, "message_id": 0}
        while True:
            row = bind.execute(text(BACKFILL), {**last, "n": BACKFILL_BATCH}).fetchone()
            if row is None:
                return
            last = {"dlq_id": row[0], "group_id": row[1], "message_id": row[2]}


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS redelivery.dlq_messages_signature")
    op.execute("DROP TRIGGER IF EXISTS dlq_messages_fill_signature ON redelivery.dlq_messages")
    op.execute("""
    ALTER TABLE redelivery.dlq_messages
        DROP COLUMN IF EXISTS error_class, DROP COLUMN IF EXISTS error_frame,
        DROP COLUMN IF EXISTS error_stack, DROP COLUMN IF EXISTS signature
    """)
    op.execute(OLD_APPEND_ATTEMPT)
    op.execute("DROP FUNCTION IF EXISTS redelivery.fill_signature()")
    op.execute("DROP FUNCTION IF EXISTS redelivery.system_error_class(text, jsonb)")
    op.execute("DROP FUNCTION IF EXISTS redelivery.error_signature(text, text, text)")
    op.execute("DROP FUNCTION IF EXISTS redelivery.normalized_error(text)")
