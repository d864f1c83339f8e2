"""The log: messages in time partitions, a consume offset per subscription, and a delivery row only
while a message is unfinished for its group (docs/ARCHITECTURE.md, "Storage").

Offline: stop every client (Airflow tasks, Spark jobs, consumers) before it runs; it rewrites
``deliveries`` and copies ``messages`` into the log in one transaction.

- ``messages`` becomes a table partitioned by range of ``published_at``, keyed by
  ``(topic_id, id, published_at)``; its partitions live in schema ``redelivery_log`` and are listed
  in ``log_partitions``. Today's messages go into one partition, ``messages_upgraded``, from the
  beginning of time to the end of the current hour, and a message published at a later time into
  the partition of its hour; retention drops them like any other once no group needs them. Ids
  come from the sequence ``message_ids``, continuing where the identity stopped.
- Each subscription keeps ``consume_offset`` (every message of its topic with a smaller or equal
  id was handed to the group or is not the group's), ``messages_taken`` (messages it took past its
  offset, ever) and ``dead_letters_expired`` (dead letters retention deleted): its COMMITTED count
  is ``messages_taken`` minus its delivery rows, its dead letters and ``dead_letters_expired``.
  Here the offset becomes the topic's newest id and ``messages_taken`` the group's delivery rows of
  the topic, so every count of ``redelivery stats`` stays what it was.
- ``deliveries`` keeps only READY, INFLIGHT and WAITING_RETRY rows (states, delivery counts,
  leases, histories unchanged), now with the message's ``published_at`` and keyed by
  ``(topic_id, group_id, message_id)``; COMMITTED rows go (the offset and the counters hold them)
  and DLQ rows go (the dead letter's row in its DLQ table holds everything: delivery count,
  reconsume times, history, redrive count). ``dlq_messages`` no longer refers to ``deliveries``.

Revision ID: 0012
Revises: 0011
"""

from datetime import UTC, timedelta

from alembic import op

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.execute("""
    SET LOCAL search_path TO redelivery;
    SET LOCAL statement_timeout = 0;
    SET LOCAL lock_timeout = 0;
    CREATE SCHEMA IF NOT EXISTS redelivery_log;

    -- The partitions of the log, one row each, written in the transaction that attaches or drops
    -- the partition (redelivery.store.log): [starts_at, ends_at) of publish times; starts_at NULL:
    -- from the beginning of time (MINVALUE).
    CREATE TABLE log_partitions (
        partition_name text PRIMARY KEY,
        starts_at timestamptz,
        ends_at timestamptz NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        CHECK (starts_at < ends_at)
    );

    ALTER TABLE messages RENAME TO messages_before_log;
    ALTER INDEX messages_pkey RENAME TO messages_before_log_pkey;
    DROP INDEX messages_topic, messages_publish_batch;
    CREATE SEQUENCE message_ids;
    -- past every id ever taken (a deleted topic's too: redrive_moves may still name them)
    SELECT setval('message_ids', greatest(
        coalesce((SELECT max(id) FROM messages_before_log), 0),
        coalesce((SELECT last_value FROM pg_sequences
                  WHERE schemaname = 'redelivery' AND sequencename = 'messages_id_seq'), 0)) + 1, false);
    CREATE TABLE messages (
        topic_id integer NOT NULL,
        id bigint NOT NULL DEFAULT nextval('message_ids'),
        key text,
        body bytea NOT NULL,
        content_type text NOT NULL
            CHECK (content_type IN ('application/json', 'application/octet-stream', 'text/plain')),
        properties jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(properties) = 'object'),
        -- set when this message is a copy of another (redrive to another topic); else NULL
        origin_message_id bigint,
        publish_batch text,
        published_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (topic_id, id, published_at)
    ) PARTITION BY RANGE (published_at);
    ALTER SEQUENCE message_ids OWNED BY messages.id;
    CREATE INDEX messages_publish_batch ON messages (publish_batch) WHERE publish_batch IS NOT NULL;
    """)
    # Today's messages go into one partition that ends with the current hour; a message published
    # at a later time (an ``at`` in the future) goes into the partition of its own hour, as a
    # publish would put it: one that ended with the newest message (2099, say) would take every
    # later message and retention could never drop it. A store without messages gets none (the
    # first publish makes its partition).
    bind = op.get_bind()
    [[ends_at, count]] = bind.exec_driver_sql(
        "SELECT date_bin('1 hour', now(), 'epoch'::timestamptz) + interval '1 hour', count(*)"
        " FROM redelivery.messages_before_log"
    ).fetchall()
    later = bind.exec_driver_sql(
        "SELECT DISTINCT date_bin('1 hour', published_at, 'epoch'::timestamptz)"
        f" FROM redelivery.messages_before_log WHERE published_at >= '{ends_at.isoformat()}' ORDER BY 1"
    ).fetchall()
    for (starts_at,) in later:
        name = "messages_" + starts_at.astimezone(UTC).strftime("%Y%m%dt%H%M%S")  # log.partition_name
        low, high = f"'{starts_at.isoformat()}'", f"'{(starts_at + timedelta(hours=1)).isoformat()}'"
        op.execute(f"""
        SET LOCAL search_path TO redelivery;
        CREATE TABLE redelivery_log.{name} PARTITION OF messages FOR VALUES FROM ({low}) TO ({high});
        INSERT INTO log_partitions (partition_name, starts_at, ends_at) VALUES ('{name}', {low}, {high});
        """)
    if count:
        op.execute(f"""
        SET LOCAL search_path TO redelivery;
        CREATE TABLE redelivery_log.messages_upgraded PARTITION OF messages
            FOR VALUES FROM (MINVALUE) TO ('{ends_at.isoformat()}');
        INSERT INTO log_partitions (partition_name, starts_at, ends_at)
        VALUES ('messages_upgraded', NULL, '{ends_at.isoformat()}');
        INSERT INTO messages (topic_id, id, key, body, content_type, properties, origin_message_id,
                              publish_batch, published_at)
        SELECT topic_id, id, key, body, content_type, properties, origin_message_id, publish_batch,
               published_at
        FROM messages_before_log ORDER BY topic_id, id;
        """)
    op.execute("""
    SET LOCAL search_path TO redelivery;
    ALTER TABLE subscriptions
        ADD COLUMN consume_offset bigint NOT NULL DEFAULT 0,
        ADD COLUMN messages_taken bigint NOT NULL DEFAULT 0 CHECK (messages_taken >= 0),
        ADD COLUMN dead_letters_expired bigint NOT NULL DEFAULT 0 CHECK (dead_letters_expired >= 0);
    UPDATE subscriptions s SET
        consume_offset = coalesce((SELECT max(m.id) FROM messages_before_log m
                                   WHERE m.topic_id = s.topic_id), 0),
        messages_taken = (SELECT count(*) FROM deliveries d
                          WHERE d.topic_id = s.topic_id AND d.group_id = s.group_id);

    ALTER TABLE dlq_messages DROP CONSTRAINT dlq_messages_delivery_fk;
    ALTER TABLE deliveries RENAME TO deliveries_before_log;
    ALTER INDEX deliveries_pkey RENAME TO deliveries_before_log_pkey;
    DROP INDEX deliveries_ready, deliveries_ready_at, deliveries_waiting, deliveries_inflight;
    CREATE TABLE deliveries (
        topic_id integer NOT NULL,
        group_id integer NOT NULL,
        message_id bigint NOT NULL,
        published_at timestamptz NOT NULL,  -- the message's, to find it in the log's partitions
        state delivery_state NOT NULL CHECK (state IN ('READY', 'INFLIGHT', 'WAITING_RETRY')),
        delivery_count integer NOT NULL DEFAULT 0 CHECK (delivery_count >= 0),
        reconsume_times integer NOT NULL DEFAULT 0 CHECK (reconsume_times >= 0),
        redrive_count integer NOT NULL DEFAULT 0 CHECK (redrive_count >= 0),
        delay_level smallint CHECK (delay_level >= 1),
        due_at timestamptz,
        invisible_until timestamptz,
        ready_at timestamptz,
        first_failure_at timestamptz,
        last_failure_at timestamptz,
        last_error text,
        attempts jsonb NOT NULL DEFAULT '[]',  -- the last failed deliveries: {at, delivery, outcome, error}
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (topic_id, group_id, message_id),
        CHECK (state <> 'WAITING_RETRY' OR (due_at IS NOT NULL AND delay_level IS NOT NULL)),
        CHECK (state <> 'INFLIGHT' OR invisible_until IS NOT NULL)
    );
    INSERT INTO deliveries (topic_id, group_id, message_id, published_at, state, delivery_count,
                            reconsume_times, redrive_count, delay_level, due_at, invisible_until, ready_at,
                            first_failure_at, last_failure_at, last_error, attempts, created_at, updated_at)
    SELECT d.topic_id, d.group_id, d.message_id, m.published_at, d.state, d.delivery_count, d.reconsume_times,
           d.redrive_count, d.delay_level, d.due_at, d.invisible_until, d.ready_at, d.first_failure_at,
           d.last_failure_at, d.last_error, d.attempts, d.created_at, d.updated_at
    FROM deliveries_before_log d JOIN messages_before_log m ON m.id = d.message_id
    WHERE d.state IN ('READY', 'INFLIGHT', 'WAITING_RETRY');
    DROP TABLE deliveries_before_log;
    DROP TABLE messages_before_log;

    -- READY rows (retries promoted, dead letters redriven: the messages past an offset have none)
    -- by subscription; ready_at for the asset watchers and the oldest READY age.
    CREATE INDEX deliveries_ready ON deliveries (topic_id, group_id, message_id) INCLUDE (ready_at)
        WHERE state = 'READY';
    CREATE INDEX deliveries_waiting ON deliveries (delay_level, due_at) INCLUDE (group_id, topic_id)
        WHERE state = 'WAITING_RETRY';
    CREATE INDEX deliveries_inflight ON deliveries (invisible_until) INCLUDE (group_id, topic_id)
        WHERE state = 'INFLIGHT';
    """)
