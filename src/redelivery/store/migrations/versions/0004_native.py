"""Settle markers: a Spark task that answers its partition's receipts twice changes nothing the
second time.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.execute("""
    SET LOCAL search_path TO redelivery;

    CREATE TABLE settle_parts (
        run_id text NOT NULL,
        part integer NOT NULL,
        acked bigint NOT NULL DEFAULT 0,
        retried bigint NOT NULL DEFAULT 0,
        dead_lettered bigint NOT NULL DEFAULT 0,
        stale bigint NOT NULL DEFAULT 0,
        settled_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (run_id, part)
    );
    CREATE INDEX settle_parts_settled ON settle_parts (settled_at);
    """)
