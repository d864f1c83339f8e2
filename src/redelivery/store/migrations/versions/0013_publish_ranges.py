"""Publish at the speed of COPY (issue 20): a batch is a range of ids, PostgreSQL checks JSON
bodies and fingerprints batches, and a Spark publish stages encoded chunks.

- ``messages.publish_batch`` goes (and its index: a text key per message was a quarter of a
  publish's write). A batch's messages are those of its topic with ids in
  ``publish_batches.first_id .. last_id``: a publish takes its ids under the topic's publish lock,
  so no other message of the topic gets an id in that range (a message put back by a redrive keeps
  its own, older id). Batches recorded before are given the range of the messages tagged with them,
  or, where another batch's ids fall in it (publishers of one topic did not take turns before
  0012), the list of their ids (``message_ids``).
- ``messages_json_body``: a JSON body is JSON (``IS JSON``, in C, as each row is written; what
  only jsonb refuses, the writer checks: ``redelivery.messaging.codec``). NOT VALID: every body
  written before was checked by its writer, and validating would read the whole log.
- ``message_hash`` and ``content_fingerprint``: a batch's fingerprint (its count and the sum of its
  messages' hashes modulo 2^64, independent of order and partitioning), computed by PostgreSQL from
  the rows, whichever writer wrote them. Recorded batches whose messages are all in the log get
  theirs recomputed; the others keep none and are compared by their count.
- ``publish_staging`` holds a Spark publish's chunks (a task's rows as PostgreSQL's binary COPY
  format, one row per Arrow batch) instead of one row per message; what was staged by an
  unfinished publish of the old format is dropped (its job fails at its driver: run it again).

Stop the publishers of the version before (the API's COPY names the column it drops, and a Spark
job's staged rows go) and upgrade them with it; consumers, tier runs and redrives may go on. It
reads every message still tagged with a batch (0.3 s for the demo's 336,776) in one transaction,
done again if a table lock is not granted within the migrations' 2 s.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    op.execute("""
    SET LOCAL search_path TO redelivery;
    SET LOCAL statement_timeout = 0;

    -- The hash of one message's content: key, body, content type, properties (jsonb hashes its
    -- content, whatever the order of its keys).
    CREATE FUNCTION message_hash(key text, body bytea, content_type text, properties jsonb)
        RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE
        RETURN hash_record_extended(ROW(key, body, content_type, properties), 0);
    -- A batch's fingerprint from its message count and the sum of its hashes: 'count:hex16', the sum
    -- modulo 2^64 as 16 hex digits (to_hex of the bigint with the same 64 bits).
    CREATE FUNCTION content_fingerprint(messages bigint, hash_sum numeric)
        RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
        RETURN (SELECT messages || ':' || lpad(to_hex((n - CASE WHEN n >= 2::numeric ^ 63
                                                                 THEN 2::numeric ^ 64 ELSE 0 END
                                                      )::bigint), 16, '0')
                FROM (SELECT mod(mod(coalesce(hash_sum, 0), 2::numeric ^ 64) + 2::numeric ^ 64,
                                 2::numeric ^ 64) AS n) x);

    ALTER TABLE publish_batches ADD COLUMN first_id bigint, ADD COLUMN last_id bigint,
        ADD COLUMN message_ids bigint[];
    UPDATE publish_batches b SET
        first_id = CASE WHEN m.interleaved THEN NULL ELSE m.first_id END,
        last_id = CASE WHEN m.interleaved THEN NULL ELSE m.last_id END,
        message_ids = CASE WHEN m.interleaved THEN m.ids END,
        fingerprint = CASE WHEN m.messages = b.message_count
                           THEN content_fingerprint(m.messages, m.hash_sum) END
    FROM (SELECT t.*, (SELECT count(*) FROM messages x WHERE x.topic_id = t.topic_id
                         AND x.id BETWEEN t.first_id AND t.last_id) <> t.messages AS interleaved
          FROM (SELECT publish_batch, topic_id, count(*) AS messages, min(id) AS first_id,
                       max(id) AS last_id, array_agg(id ORDER BY id) AS ids,
                       sum(message_hash(key, body, content_type, properties)) AS hash_sum
                FROM messages WHERE publish_batch IS NOT NULL GROUP BY publish_batch, topic_id) t) m
    WHERE m.publish_batch = b.batch_id AND m.topic_id = b.topic_id;
    UPDATE publish_batches SET fingerprint = NULL WHERE first_id IS NULL AND message_ids IS NULL;
    ALTER TABLE messages DROP COLUMN publish_batch;

    ALTER TABLE messages ADD CONSTRAINT messages_json_body
        CHECK (content_type <> 'application/json' OR body IS JSON) NOT VALID;

    DROP TABLE publish_staging;
    DELETE FROM publish_parts;
    ALTER TABLE publish_parts DROP COLUMN fingerprint;
    CREATE UNLOGGED TABLE publish_staging (
        batch_id text NOT NULL,
        run_id text NOT NULL,
        part integer NOT NULL,
        seq integer NOT NULL,
        rows integer NOT NULL CHECK (rows > 0),
        data bytea NOT NULL,  -- rows in PostgreSQL's binary COPY format, without header and trailer
        staged_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (batch_id, run_id, part, seq)
    );
    -- chunks of a few MB: stored out of line without compression (pglz would cost more CPU than
    -- the disk it saves on a table whose rows live for minutes)
    ALTER TABLE publish_staging ALTER COLUMN data SET STORAGE EXTERNAL;
    CREATE INDEX publish_staging_staged ON publish_staging (staged_at);
    """)


def downgrade() -> None:
    raise NotImplementedError("0013 has no way down: the messages' batch tags are gone")
