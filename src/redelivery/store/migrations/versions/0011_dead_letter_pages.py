"""The operator's page browses dead letters: keyset pages newest first, a search by key, and a
message's redrive history.

``dlq_messages_browse`` (group, dead-lettered at, message id) serves a page of any depth in the
order the page shows (``DLQ_BROWSE``: the last row of a page is the next one's cursor), and every
use of the index it replaces (``dlq_messages_group``: the filter's time range, the summary's oldest
and newest). ``dlq_messages_key`` finds a key's dead letters in the same order. Both are built
partition by partition, concurrently: dead-lettering goes on meanwhile. ``redrive_moves_message``
finds a message's redrives (``MESSAGE_REDRIVES``), built concurrently too.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

from redelivery.store.migrations.online import build_index, build_partitioned_index

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    build_index("redrive_moves_message", "redrive_moves (group_id, message_id)")
    build_partitioned_index("dlq_messages_browse", "dlq_messages", "group_id, dead_lettered_at, message_id")
    build_partitioned_index("dlq_messages_key", "dlq_messages", "group_id, key, dead_lettered_at, message_id")
    # Covered by dlq_messages_browse. Dropping an index of a partitioned table takes its lock for an
    # instant (under the migration's lock_timeout, retried); no partition is read.
    op.execute("DROP INDEX IF EXISTS redelivery.dlq_messages_group")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS dlq_messages_group"
        " ON redelivery.dlq_messages (group_id, dead_lettered_at)"
    )
    op.execute("DROP INDEX IF EXISTS redelivery.dlq_messages_key")
    op.execute("DROP INDEX IF EXISTS redelivery.dlq_messages_browse")
    op.execute("DROP INDEX IF EXISTS redelivery.redrive_moves_message")
