"""Standing redrive policies (issue 41): dead letters that come back by themselves.

- ``standing_redrives``: one row per policy, declared in the config file (``source = 'config'``,
  written again by each tick from the file) or by an operator (``'operator'``). ``spec`` is the
  policy (``rules.standing.StandingRedrive`` as JSON); ``state`` is active or stopped (by itself,
  when the messages it brought back died again too often, or by an operator), with why and by whom.
  ``more_left``: its last run left matching dead letters behind (or did not finish), so the next
  tick runs it again (a tick runs a policy under a session advisory lock, so two ticks never run it
  at once and one that died frees it at once). ``trigger_at``: the breaker close an ``after:
  breaker_closed`` policy is bringing back the dead letters of (those dead-lettered before it, and
  since ``trigger_from``: the close before it, or the policy's creation).
  ``brought_back`` counts every message its runs moved, in the transaction of each move
  (``redelivery_auto_redriven_total``).
- ``redrive_runs.standing_id``: the policy a run belongs to (NULL: a person's redrive), and
  ``max_generations``: its generation limit when it ran.
- ``redrive_moves.generation``: the message's redrive count once moved (its generation), which a
  run keeps at or below its ``max_generations`` (the crash suite checks it); ``topic_id``: the
  message's topic (a move's delivery row is found by its key: what became of a brought-back
  message).

Nothing is rewritten: a new table, nullable columns, an index of a small table.

Revision ID: 0022
Revises: 0021
"""

from alembic import op

revision = "0022"
down_revision = "0021"

UPGRADE = """
CREATE TABLE IF NOT EXISTS redelivery.standing_redrives (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    group_id integer NOT NULL REFERENCES redelivery.consumer_groups (id) ON DELETE CASCADE,
    source text NOT NULL CHECK (source IN ('config', 'operator')),
    spec jsonb NOT NULL,
    state text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'stopped')),
    stopped_reason text,
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by text NOT NULL,
    counting_since timestamptz NOT NULL DEFAULT now(),
    more_left boolean NOT NULL DEFAULT false,
    trigger_at timestamptz,
    trigger_from timestamptz,
    last_run_at timestamptz,
    runs bigint NOT NULL DEFAULT 0,
    brought_back bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'stopped') = (stopped_reason IS NOT NULL))
);
ALTER TABLE redelivery.redrive_runs ADD COLUMN IF NOT EXISTS standing_id integer
    REFERENCES redelivery.standing_redrives (id) ON DELETE SET NULL;
ALTER TABLE redelivery.redrive_runs ADD COLUMN IF NOT EXISTS max_generations integer;
ALTER TABLE redelivery.redrive_moves ADD COLUMN IF NOT EXISTS generation integer,
    ADD COLUMN IF NOT EXISTS topic_id integer;
CREATE INDEX IF NOT EXISTS redrive_runs_standing ON redelivery.redrive_runs (standing_id, id)
    WHERE standing_id IS NOT NULL;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS redelivery.redrive_runs_standing")
    op.execute(
        "ALTER TABLE redelivery.redrive_moves DROP COLUMN IF EXISTS generation,"
        " DROP COLUMN IF EXISTS topic_id"
    )
    op.execute("ALTER TABLE redelivery.redrive_runs DROP COLUMN IF EXISTS max_generations")
    op.execute("ALTER TABLE redelivery.redrive_runs DROP COLUMN IF EXISTS standing_id")
    op.execute("DROP TABLE IF EXISTS redelivery.standing_redrives")
