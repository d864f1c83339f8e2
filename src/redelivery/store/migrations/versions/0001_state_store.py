"""State store: topics, consumer groups, subscriptions, messages, per-group deliveries,
dead-letter queues (one table per DLQ name, schema redelivery_dlq), tier runs and publish batches.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None

# Names that become parts of SQL identifiers (a group's DLQ table "dlq_<group>") are limited to
# letters, digits, '_', '.', '-' so that the quoted identifier stays within PostgreSQL's 63 bytes.
NAME_CHECK = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,58}$"


def upgrade() -> None:
    op.execute(f"""
    SET LOCAL search_path TO redelivery;

    CREATE TYPE delivery_state AS ENUM ('READY', 'INFLIGHT', 'WAITING_RETRY', 'COMMITTED', 'DLQ');
    CREATE TYPE dlq_reason AS ENUM ('MAX_DELIVERIES_EXCEEDED', 'LEASE_EXPIRED', 'REJECTED', 'NEGATIVE_LEVEL');

    CREATE TABLE topics (
        id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name text NOT NULL UNIQUE CHECK (name ~ '{NAME_CHECK}'),
        created_at timestamptz NOT NULL DEFAULT now()
    );

    CREATE TABLE consumer_groups (
        id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name text NOT NULL UNIQUE CHECK (name ~ '{NAME_CHECK}'),
        -- RocketMQ maxReconsumeTimes set on the group itself (-1 = unlimited); NULL: the policy decides.
        max_reconsume_times integer CHECK (max_reconsume_times >= -1),
        created_at timestamptz NOT NULL DEFAULT now()
    );

    CREATE TABLE subscriptions (
        topic_id integer NOT NULL REFERENCES topics (id) ON DELETE CASCADE,
        group_id integer NOT NULL REFERENCES consumer_groups (id) ON DELETE CASCADE,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (topic_id, group_id)
    );

    CREATE TABLE messages (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        topic_id integer NOT NULL REFERENCES topics (id) ON DELETE CASCADE,
        key text,
        body bytea NOT NULL,
        content_type text NOT NULL
            CHECK (content_type IN ('application/json', 'application/octet-stream', 'text/plain')),
        properties jsonb NOT NULL DEFAULT '{{}}' CHECK (jsonb_typeof(properties) = 'object'),
        -- set when this message is a copy of another (redrive to another topic); else NULL
        origin_message_id bigint,
        publish_batch text,
        published_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX messages_topic ON messages (topic_id, id);
    CREATE INDEX messages_publish_batch ON messages (publish_batch) WHERE publish_batch IS NOT NULL;

    -- One row per (message, subscribed group): the state machine of RocketMQ 5, "Consumption retry".
    CREATE TABLE deliveries (
        message_id bigint NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
        group_id integer NOT NULL REFERENCES consumer_groups (id) ON DELETE CASCADE,
        topic_id integer NOT NULL,
        state delivery_state NOT NULL DEFAULT 'READY',
        delivery_count integer NOT NULL DEFAULT 0 CHECK (delivery_count >= 0),
        reconsume_times integer NOT NULL DEFAULT 0 CHECK (reconsume_times >= 0),
        delay_level smallint CHECK (delay_level >= 1),
        due_at timestamptz,
        invisible_until timestamptz,
        first_failure_at timestamptz,
        last_failure_at timestamptz,
        last_error text,
        attempts jsonb NOT NULL DEFAULT '[]',  -- the last failed deliveries: {{at, delivery, outcome, error}}
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (message_id, group_id),
        CHECK (state <> 'WAITING_RETRY' OR (due_at IS NOT NULL AND delay_level IS NOT NULL)),
        CHECK (state <> 'INFLIGHT' OR invisible_until IS NOT NULL)
    );
    CREATE INDEX deliveries_ready ON deliveries (group_id, topic_id, message_id) WHERE state = 'READY';
    CREATE INDEX deliveries_waiting ON deliveries (delay_level, due_at) WHERE state = 'WAITING_RETRY';
    CREATE INDEX deliveries_inflight ON deliveries (invisible_until) WHERE state = 'INFLIGHT';

    -- Dead-letter queues by name (%DLQ%group, topic-group-DLQ, DLQ.topic, or explicit). Each one's
    -- table is a partition of dlq_messages in schema redelivery_dlq, named after the DLQ and
    -- created the first time a message is dead-lettered into it.
    CREATE TABLE dead_letter_queues (
        id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        -- letters, digits and _ . - and the percent sign, chr(37) (kept out of the text: DB-API placeholders)
        name text NOT NULL UNIQUE CHECK (name ~ ('^[A-Za-z0-9_.' || chr(37) || '-]{{1,63}}$')),
        registered_at timestamptz NOT NULL DEFAULT now(),
        table_created_at timestamptz
    );

    CREATE TABLE dlq_messages (
        dlq_id integer NOT NULL,
        group_id integer NOT NULL,
        message_id bigint NOT NULL,
        topic_id integer NOT NULL,
        origin_message_id bigint NOT NULL,
        key text,
        body bytea NOT NULL,
        content_type text NOT NULL,
        properties jsonb NOT NULL,
        published_at timestamptz NOT NULL,
        reason dlq_reason NOT NULL,
        last_error text,
        delivery_count integer NOT NULL,
        reconsume_times integer NOT NULL,
        first_failure_at timestamptz,
        last_failure_at timestamptz,
        dead_lettered_at timestamptz NOT NULL DEFAULT now(),
        attempts jsonb NOT NULL DEFAULT '[]',
        PRIMARY KEY (dlq_id, group_id, message_id)
    ) PARTITION BY LIST (dlq_id);
    CREATE INDEX dlq_messages_group ON dlq_messages (group_id, dead_lettered_at);
    CREATE SCHEMA IF NOT EXISTS redelivery_dlq;

    -- Append one failed delivery to a bounded history (the last 20 are kept).
    CREATE FUNCTION append_attempt(history jsonb, entry jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE AS $$
        SELECT coalesce(jsonb_agg(e ORDER BY n), '[]'::jsonb)
        FROM jsonb_array_elements(history || jsonb_build_array(entry)) WITH ORDINALITY AS a(e, n)
        WHERE n > jsonb_array_length(history) + 1 - 20
    $$;

    -- One row per tier job run (an Airflow task try, or a CLI run).
    CREATE TABLE tier_runs (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_key text NOT NULL UNIQUE,
        tier text NOT NULL,
        levels smallint[] NOT NULL,
        window_start timestamptz,
        window_end timestamptz NOT NULL,
        dry_run boolean NOT NULL DEFAULT false,
        status text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'success', 'failed')),
        started_at timestamptz NOT NULL DEFAULT now(),
        finished_at timestamptz,
        summary jsonb
    );
    CREATE INDEX tier_runs_window ON tier_runs (tier, window_end);

    -- A publish batch is applied once: re-running a publish job with the same batch id is a no-op.
    CREATE TABLE publish_batches (
        batch_id text PRIMARY KEY,
        topic_id integer NOT NULL REFERENCES topics (id) ON DELETE CASCADE,
        message_count integer NOT NULL,
        published_at timestamptz NOT NULL DEFAULT now()
    );

    -- Landing table for Spark's JDBC writer (not atomic across partitions): rows are staged here,
    -- then published in one transaction.
    CREATE UNLOGGED TABLE publish_staging (
        batch_id text NOT NULL,
        seq bigint NOT NULL,
        key text,
        body bytea NOT NULL,
        content_type text NOT NULL,
        properties jsonb NOT NULL DEFAULT '{{}}'
    );
    CREATE INDEX publish_staging_batch ON publish_staging (batch_id, seq);
    """)
