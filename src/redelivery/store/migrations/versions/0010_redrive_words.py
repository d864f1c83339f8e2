"""Redrive runs say what each number is: ``matched`` (dead letters the filter matched; was
``selected``, which read as if all of them were chosen when ``max_messages`` capped the run) and
``held_by_backlog_cap`` (matched dead letters left in the DLQ because a ready-backlog cap had no
room: a redrive keeps ``max_ready_backlog`` as publish and tier runs do).

Both are catalog changes only (no table rewrite); they run under the migration's lock_timeout.

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    op.execute("""
    ALTER TABLE redelivery.redrive_runs RENAME COLUMN selected TO matched;
    ALTER TABLE redelivery.redrive_runs ADD COLUMN held_by_backlog_cap bigint NOT NULL DEFAULT 0;
    """)


def downgrade() -> None:
    op.execute("""
    ALTER TABLE redelivery.redrive_runs DROP COLUMN held_by_backlog_cap;
    ALTER TABLE redelivery.redrive_runs RENAME COLUMN matched TO selected;
    """)
