"""Waiting consumers of an ordered subscription woken when a key's head ends (issue 42).

A key's next message becomes receivable when its head ends (acked, rejected, dead-lettered: the
statement deletes the head's delivery row, and ``finish_ordered_heads`` makes the next one READY).
A consumer of that group waiting for a message (``receive(..., wait_seconds=...)``) learnt of it
only at its next re-check, up to a second later. ``wake_ordered_waiters``, a second trigger on the
same deletes, NOTIFYs up to as many of the group's waiting backends as heads ended, at random, as
``NOTIFY_WAITERS`` does for a publish; the notifications go out when the deleting transaction
commits, and none is queued when nobody waits (one probe of ``receive_waiters``), so an ack with
nobody waiting costs no notifying commit. It changes no row: not a state change.

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"

WAKE_ORDERED_WAITERS = """
CREATE OR REPLACE FUNCTION redelivery.wake_ordered_waiters() RETURNS trigger
LANGUAGE plpgsql SET search_path = redelivery AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM receive_waiters) THEN  -- nobody waits: nothing to send
    RETURN NULL;
  END IF;
  -- heads are the ended rows with a key (unordered rows have none) that were not BLOCKED
  PERFORM pg_notify('redelivery_wait_' || w.backend_pid, '')
  FROM (SELECT w.backend_pid, h.n,
               row_number() OVER (PARTITION BY w.topic_id, w.group_id ORDER BY random()) AS nth
        FROM (SELECT f.topic_id, f.group_id, count(*) AS n FROM finished f
              WHERE f.key IS NOT NULL AND f.state <> 'BLOCKED'
              GROUP BY f.topic_id, f.group_id) h
        JOIN receive_waiters w ON w.topic_id = h.topic_id AND w.group_id = h.group_id
        WHERE w.expires_at > now()) w
  WHERE w.nth <= w.n;
  RETURN NULL;
END $$;
"""


def upgrade() -> None:
    op.execute(WAKE_ORDERED_WAITERS)
    op.execute("""
    CREATE TRIGGER deliveries_wake_ordered_waiters AFTER DELETE ON redelivery.deliveries
        REFERENCING OLD TABLE AS finished FOR EACH STATEMENT
        EXECUTE FUNCTION redelivery.wake_ordered_waiters();
    """)


def downgrade() -> None:
    op.execute("DROP TRIGGER deliveries_wake_ordered_waiters ON redelivery.deliveries")
    op.execute("DROP FUNCTION redelivery.wake_ordered_waiters()")
