"""Crash consistency: receipts that answer one delivery, exactly-once Spark publish, bounded names,
DLQ rows tied to their delivery, redrive stop and pacing, undecodable bodies.

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"

# Topic and group names: at most 56 characters, so that %RETRY%<group> (the longest queue name a
# group gets by default) fits PostgreSQL's 63-byte identifiers. The frozen copy of
# redelivery.rules.names.NAME_REGEX (a test keeps them equal). NOT VALID: names made before stay usable.
NAME_CHECK = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,55}$"


def upgrade() -> None:
    op.execute("SET LOCAL search_path TO redelivery")
    # A value added to an enum cannot be used in the transaction that adds it; nothing here uses it.
    op.execute("ALTER TYPE dlq_reason ADD VALUE IF NOT EXISTS 'UNDECODABLE'")
    op.execute(f"""
    ALTER TABLE topics DROP CONSTRAINT topics_name_check,
        ADD CONSTRAINT topics_name_check CHECK (name ~ '{NAME_CHECK}') NOT VALID;
    ALTER TABLE consumer_groups DROP CONSTRAINT consumer_groups_name_check,
        ADD CONSTRAINT consumer_groups_name_check CHECK (name ~ '{NAME_CHECK}') NOT VALID,
        -- receipts that changed nothing (a late answer, an answer given twice)
        ADD COLUMN stale_receipts bigint NOT NULL DEFAULT 0;

    -- The delivery count never decreases; a redrive restores the reconsume times and counts itself.
    -- ready_at: when the delivery last became READY (publish, promotion, redrive).
    ALTER TABLE deliveries ADD COLUMN redrive_count integer NOT NULL DEFAULT 0 CHECK (redrive_count >= 0),
        ADD COLUMN ready_at timestamptz;
    ALTER TABLE dlq_messages ADD COLUMN redrive_count integer NOT NULL DEFAULT 0;

    -- A DLQ row belongs to its delivery: deleting a topic (cascading to its deliveries) takes the
    -- dead letters with it, whatever is being dead-lettered at the same moment.
    CREATE INDEX dlq_messages_delivery ON dlq_messages (message_id, group_id);
    ALTER TABLE dlq_messages ADD CONSTRAINT dlq_messages_delivery_fk FOREIGN KEY (message_id, group_id)
        REFERENCES deliveries (message_id, group_id) ON DELETE CASCADE;

    -- A batch id means one batch: its topic and a fingerprint of its content (count and a sum of
    -- row hashes, independent of order and partitioning).
    ALTER TABLE publish_batches ADD COLUMN fingerprint text;
    CREATE INDEX publish_batches_published ON publish_batches (published_at);
    -- Spark publish: each run of a publish job stages every partition of its DataFrame once (a task
    -- that runs twice finds its partition staged), in a namespace of its own (run_id): two runs of
    -- one batch at once never touch each other's rows, and only one of them publishes.
    CREATE TABLE publish_parts (
        batch_id text NOT NULL,
        run_id text NOT NULL,
        part integer NOT NULL,
        rows bigint NOT NULL,
        fingerprint text NOT NULL,
        staged_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (batch_id, run_id, part)
    );
    CREATE INDEX publish_parts_staged ON publish_parts (staged_at);
    ALTER TABLE publish_staging ADD COLUMN run_id text NOT NULL DEFAULT '',
        ADD COLUMN part integer NOT NULL DEFAULT 0,
        ADD COLUMN staged_at timestamptz NOT NULL DEFAULT now();
    DROP INDEX publish_staging_batch;
    CREATE UNIQUE INDEX publish_staging_row ON publish_staging (batch_id, run_id, part, seq);

    -- Redrive: a run stopped between batches ('stopped'), and the pacing of its batches.
    ALTER TABLE redrive_runs DROP CONSTRAINT redrive_runs_status_check,
        ADD CONSTRAINT redrive_runs_status_check
            CHECK (status IN ('running', 'success', 'failed', 'stopped')),
        ADD COLUMN next_slot_at timestamptz;
    CREATE INDEX redrive_runs_finished ON redrive_runs (finished_at);
    CREATE INDEX tier_runs_finished ON tier_runs (finished_at);
    """)
