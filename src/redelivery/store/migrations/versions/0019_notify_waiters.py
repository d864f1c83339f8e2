"""One way to wake waiting consumers: the SQL function ``notify_waiters`` (issue 42).

A publish, a tier run and a redrive (``NOTIFY_WAITERS``, after their commit) and the trigger that
sees a key's head end (``wake_ordered_waiters``, migration 0018) each chose up to n of a group's
waiting backends at random and notified them: the same query twice. It is one function now,
which both call: for each (topic id, group id or NULL for every group of the topic, n), up to n of
the group's backends whose wait has not expired, one notification on each one's channel. It
changes no row.

Revision ID: 0019
Revises: 0018
"""

from alembic import op

revision = "0019"
down_revision = "0018"

NOTIFY_WAITERS = """
CREATE FUNCTION redelivery.notify_waiters(topic_ids int[], group_ids int[], counts int[]) RETURNS int
LANGUAGE sql VOLATILE SET search_path = redelivery AS $$
  -- up to n waiters of each group, at random (never a herd of every waiter for one message)
  SELECT count(pg_notify('redelivery_wait_' || w.backend_pid, ''))::int
  FROM (SELECT w.backend_pid, x.n,
               row_number() OVER (PARTITION BY w.topic_id, w.group_id ORDER BY random()) AS nth
        FROM unnest(topic_ids, group_ids, counts) AS x(topic_id, group_id, n)
        JOIN receive_waiters w
          ON w.topic_id = x.topic_id AND (x.group_id IS NULL OR w.group_id = x.group_id)
        WHERE w.expires_at > now()) w
  WHERE w.nth <= w.n
$$;
"""

WAKE_ORDERED_WAITERS = """
CREATE OR REPLACE FUNCTION redelivery.wake_ordered_waiters() RETURNS trigger
LANGUAGE plpgsql SET search_path = redelivery AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM receive_waiters) THEN  -- nobody waits: nothing to send
    RETURN NULL;
  END IF;
  -- heads are the ended rows with a key (unordered rows have none) that were not BLOCKED
  PERFORM notify_waiters(array_agg(h.topic_id), array_agg(h.group_id), array_agg(h.n))
  FROM (SELECT f.topic_id, f.group_id, count(*)::int AS n FROM finished f
        WHERE f.key IS NOT NULL AND f.state <> 'BLOCKED'
        GROUP BY f.topic_id, f.group_id) h;
  RETURN NULL;
END $$;
"""


def upgrade() -> None:
    op.execute(NOTIFY_WAITERS)
    op.execute(WAKE_ORDERED_WAITERS)


def downgrade() -> None:
    from importlib import import_module

    op.execute(import_module("redelivery.store.migrations.versions.0018_ordered_wakes").WAKE_ORDERED_WAITERS)
    op.execute("DROP FUNCTION redelivery.notify_waiters(int[], int[], int[])")
