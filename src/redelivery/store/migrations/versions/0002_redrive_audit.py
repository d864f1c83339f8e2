"""Redrive audit: one row per redrive run (who, what filter, how many) and one per message moved.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.execute("""
    SET LOCAL search_path TO redelivery;

    CREATE TABLE redrive_runs (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        -- e.g. dlq_redrive/<Airflow run id>: a retried task resumes it
        run_key text NOT NULL UNIQUE,
        triggered_by text,
        group_id integer NOT NULL REFERENCES consumer_groups (id) ON DELETE CASCADE,
        filter jsonb NOT NULL,
        dry_run boolean NOT NULL,
        status text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'success', 'failed')),
        selected bigint,
        moved bigint NOT NULL DEFAULT 0,
        sample jsonb,
        started_at timestamptz NOT NULL DEFAULT now(),
        finished_at timestamptz
    );

    CREATE TABLE redrive_moves (
        run_id bigint NOT NULL REFERENCES redrive_runs (id) ON DELETE CASCADE,
        group_id integer NOT NULL,
        message_id bigint NOT NULL,
        moved_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (run_id, group_id, message_id)
    );
    """)
