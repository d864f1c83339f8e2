"""A waiting consumer says so with an advisory lock, not a row (issue 42).

A consumer that waits for a message (``receive(..., wait_seconds=...)``) wrote its row in
``receive_waiters`` as it began to wait and wrote it off as the wait returned: two versions of a
row per wait, which a transaction holding the xmin horizon keeps (3,530 of a held run's 13,717
dead tuples, ``bench/bench_claim.py``). It now holds a session advisory lock, shared, keyed by
its subscription for as long as it waits (``messaging.waiting``): a lock is in PostgreSQL's shared
memory, never a tuple, and it goes with the session, so a consumer that dies waiting leaves
nothing, not a row that expires.

The key is the two-int form (``pg_advisory_lock_shared(-topic_id, group_id)``): ``pg_locks`` shows
it as ``classid`` the negated topic id (an oid: 2^32 - topic id), ``objid`` the group id,
``objsubid`` 2. redelivery's other two-int locks have positive namespaces (7,424,001 and up) and
its breaker locks are the one-bigint form (``objsubid`` 1): no other lock of redelivery has that
key, and nothing ever takes it exclusively.

``notify_waiters`` picks the backends that hold such a lock (``pg_locks``, granted) instead of the
rows that had not expired; ``wake_ordered_waiters`` first looks for an ended head among the rows
its delete ended (a statement with none, every ack of an unordered group, sends nothing and reads
no lock). ``receive_waiters`` is dropped: nothing else reads it.

Revision ID: 0023
Revises: 0022
"""

from alembic import op

revision = "0023"
down_revision = "0022"

#: The backends of a database that wait on subscription (``{topic}``, ``{group}``): the granted
#: shares of its waiter lock (``{group}`` NULL: of any group of the topic).
WAITER_LOCKS = """pg_locks l
          WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND l.classid = (-({topic}))::oid AND ({group} IS NULL OR l.objid = ({group})::oid)"""

NOTIFY_WAITERS = f"""
CREATE OR REPLACE FUNCTION redelivery.notify_waiters(topic_ids int[], group_ids int[], counts int[])
RETURNS int LANGUAGE sql VOLATILE SET search_path = redelivery AS $$
  -- up to n waiters of each group, at random (never a herd of every waiter for one message)
  SELECT count(pg_notify('redelivery_wait_' || w.pid, ''))::int
  FROM (SELECT l.pid, x.n,
               row_number() OVER (PARTITION BY x.topic_id, l.objid ORDER BY random()) AS nth
        FROM unnest(topic_ids, group_ids, counts) AS x(topic_id, group_id, n)
        CROSS JOIN LATERAL (
          SELECT l.pid, l.objid FROM {WAITER_LOCKS.format(topic="x.topic_id", group="x.group_id")}) l) w
  WHERE w.nth <= w.n
$$;
"""

WAKE_ORDERED_WAITERS = """
CREATE OR REPLACE FUNCTION redelivery.wake_ordered_waiters() RETURNS trigger
LANGUAGE plpgsql SET search_path = redelivery AS $$
BEGIN
  -- heads are the ended rows with a key (unordered rows have none) that were not BLOCKED; with
  -- none, nothing to send, and the locks are not read
  PERFORM notify_waiters(array_agg(h.topic_id), array_agg(h.group_id), array_agg(h.n))
  FROM (SELECT f.topic_id, f.group_id, count(*)::int AS n FROM finished f
        WHERE f.key IS NOT NULL AND f.state <> 'BLOCKED'
        GROUP BY f.topic_id, f.group_id) h
  HAVING count(*) > 0;
  RETURN NULL;
END $$;
"""


def upgrade() -> None:
    op.execute(NOTIFY_WAITERS)
    op.execute(WAKE_ORDERED_WAITERS)
    op.execute("DROP TABLE redelivery.receive_waiters")


def downgrade() -> None:
    from importlib import import_module

    op.execute(import_module("redelivery.store.migrations.versions.0017_receive_waiters").CREATE_TABLE)
    before = import_module("redelivery.store.migrations.versions.0019_notify_waiters")
    op.execute(before.NOTIFY_WAITERS.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute(before.WAKE_ORDERED_WAITERS)
