"""A circuit breaker per subscription (issue 41): its state, the answers it counts, its audit.

- ``breakers``: one row per subscription, made with it (the trigger ``subscriptions_breaker``, so a
  process of the version before makes it too; the existing subscriptions get theirs here).
  ``open_until`` is NULL when closed, a time when open (half-open once it passed), ``infinity``
  when held. Every row exists before anyone needs it: an answer that fails locks its
  subscription's row ``FOR SHARE`` first, and the statement that opens the breaker waits for it,
  so no failure is counted as spent on one side of an opening and parked on the other.
- ``breaker_outcomes``: answers per subscription and second (successes, counted failures), in
  shards (the backend's pid modulo 4) so that concurrent answers of a group rarely wait on one row.
  Unlogged: after a crash of PostgreSQL the counts start again from nothing (the breaker's state,
  logged, stays), and the counting of every answer costs no WAL.
- ``breaker_transitions``: every transition with its figures and who made it (the breaker, or an
  operator), kept as ``redrive_runs`` are.

Revision ID: 0021
Revises: 0020
"""

from alembic import op

revision = "0021"
down_revision = "0020"

TABLES = """
CREATE TABLE IF NOT EXISTS redelivery.breakers (
    topic_id integer NOT NULL,
    group_id integer NOT NULL,
    state text NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'half_open', 'held')),
    open_until timestamptz,
    open_seconds float8,
    opened_at timestamptz,
    probe_size integer NOT NULL DEFAULT 5 CHECK (probe_size > 0),
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by text NOT NULL DEFAULT 'redelivery',
    opened_total bigint NOT NULL DEFAULT 0,
    closed_total bigint NOT NULL DEFAULT 0,
    held_total bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, group_id),
    FOREIGN KEY (topic_id, group_id) REFERENCES redelivery.subscriptions ON DELETE CASCADE,
    CHECK ((state = 'closed') = (open_until IS NULL)),
    CHECK ((state = 'held') = (open_until = 'infinity'))
);
CREATE UNLOGGED TABLE IF NOT EXISTS redelivery.breaker_outcomes (
    topic_id integer NOT NULL,
    group_id integer NOT NULL,
    second timestamptz NOT NULL,
    shard smallint NOT NULL,
    succeeded integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, group_id, second, shard)
) WITH (fillfactor = 70);
CREATE TABLE IF NOT EXISTS redelivery.breaker_transitions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic_id integer NOT NULL,
    group_id integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    from_state text NOT NULL,
    to_state text NOT NULL,
    changed_by text NOT NULL,
    succeeded bigint,
    failed bigint,
    open_seconds float8,
    open_until timestamptz,
    note text
);
CREATE INDEX IF NOT EXISTS breaker_transitions_subscription
    ON redelivery.breaker_transitions (topic_id, group_id, id);
"""

MAKE_WITH_SUBSCRIPTION = """
CREATE OR REPLACE FUNCTION redelivery.make_breaker() RETURNS trigger
LANGUAGE plpgsql SET search_path = redelivery AS $$
BEGIN
  INSERT INTO breakers (topic_id, group_id) VALUES (NEW.topic_id, NEW.group_id) ON CONFLICT DO NOTHING;
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER subscriptions_breaker AFTER INSERT ON redelivery.subscriptions
    FOR EACH ROW EXECUTE FUNCTION redelivery.make_breaker();
INSERT INTO redelivery.breakers (topic_id, group_id)
    SELECT topic_id, group_id FROM redelivery.subscriptions ON CONFLICT DO NOTHING;
"""


def upgrade() -> None:
    op.execute(TABLES)
    op.execute(MAKE_WITH_SUBSCRIPTION)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS subscriptions_breaker ON redelivery.subscriptions")
    op.execute("DROP FUNCTION IF EXISTS redelivery.make_breaker()")
    op.execute("DROP TABLE IF EXISTS redelivery.breaker_transitions")
    op.execute("DROP TABLE IF EXISTS redelivery.breaker_outcomes")
    op.execute("DROP TABLE IF EXISTS redelivery.breakers")
