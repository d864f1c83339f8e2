"""A failure is more than text: its class, the top frame of the consumer's code, a bounded stack and
a signature (issue 40).

- ``normalized_error(message)``: the message with what varies between two occurrences of one
  failure replaced: quoted values (``'...'``, ``"..."`` opened after a non-word character) by
  ``<q>``, UUIDs by ``<uuid>``, numbers and hexadecimal runs (``0x...``, or 8 or more hex digits
  with a digit among them) by ``<n>`` (one placeholder: an id of 8 decimal digits is a hex run
  too), runs of white space by one space. The first 2,000 characters are read.
- ``error_signature(class, message, frame)``: 12 hex digits of the MD5 of the class, the normalized
  message and the frame, one line each. One failure, one signature: a statement that records a
  failure computes it here, from the same three values, whatever process recorded it.
- ``dlq_messages`` gains ``error_class``, ``error_frame``, ``error_stack`` and ``signature``, plain
  nullable columns (adding them rewrites nothing); the rows already there get the signature of their
  text (no class, no frame). The statement that dead-letters sets it.
- ``dlq_messages_signature`` (group, signature, dead-lettered at, message id, topic, redrive
  count): the failures of a group grouped (with their topics, and how many failed again after a
  redrive) from the index alone, and the dead letters of one signature in the list's order. A dead
  letter is never updated, so the two trailing columns cost no index churn. Built partition by
  partition, concurrently.
- ``append_attempt`` keeps the stack of the newest entry only: 20 entries of history, one stack.

Revision ID: 0020
Revises: 0019
"""

from alembic import op

from redelivery.store.migrations.online import build_partitioned_index

revision = "0020"
down_revision = "0019"

FUNCTIONS = r"""
CREATE FUNCTION redelivery.normalized_error(message text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  -- E'' strings: the same pattern whatever the session's standard_conforming_strings
  SELECT btrim(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
           left(coalesce(message, ''), 2000),
           E'(^|[^[:alnum:]_])(\'[^\']*\'|"[^"]*")', E'\\1<q>', 'g'),
           '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<uuid>', 'g'),
           E'\\m(0[xX][0-9a-fA-F]+|(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,})\\M', '<n>', 'g'),
           '[0-9]+', '<n>', 'g'),
           '[[:space:]]+', ' ', 'g'))
$$;

CREATE FUNCTION redelivery.error_signature(error_class text, message text, frame text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT left(md5(coalesce(error_class, '') || E'\n' || redelivery.normalized_error(message) || E'\n'
                  || coalesce(frame, '')), 12)
$$;

CREATE OR REPLACE FUNCTION redelivery.append_attempt(history jsonb, entry jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(jsonb_agg(CASE WHEN n <= jsonb_array_length(history) THEN e - 'stack' ELSE e END
                              ORDER BY n), '[]'::jsonb)
    FROM jsonb_array_elements(history || jsonb_build_array(entry)) WITH ORDINALITY AS a(e, n)
    WHERE n > jsonb_array_length(history) + 1 - 20
$$;
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
        ADD COLUMN error_class text, ADD COLUMN error_frame text, ADD COLUMN error_stack text,
        ADD COLUMN signature text
    """)
    op.execute("""
    UPDATE redelivery.dlq_messages SET signature = redelivery.error_signature(NULL, last_error, NULL)
    WHERE signature IS NULL
    """)
    build_partitioned_index(
        "dlq_messages_signature",
        "dlq_messages",
        "group_id, signature, dead_lettered_at, message_id, topic_id, redrive_count",
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS redelivery.dlq_messages_signature")
    op.execute("""
    ALTER TABLE redelivery.dlq_messages
        DROP COLUMN error_class, DROP COLUMN error_frame, DROP COLUMN error_stack, DROP COLUMN signature
    """)
    op.execute(OLD_APPEND_ATTEMPT)
    op.execute("DROP FUNCTION redelivery.error_signature(text, text, text)")
    op.execute("DROP FUNCTION redelivery.normalized_error(text)")
