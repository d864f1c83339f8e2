"""A waiting consumer says so with advisory locks, not a row (issue 42).

A consumer that waits for a message (``receive(..., wait_seconds=...)``) wrote its row in
``receive_waiters`` as it began to wait and wrote it off as the wait returned: two versions of a
row per wait, which a transaction holding the xmin horizon keeps (3,530 of a held run's 13,717
dead tuples, ``bench/bench_claim.py``). It now holds two session advisory locks, shared, for as
long as it waits (``messaging.waiting``): its subscription's, keyed (minus the topic id, the group
id), and its topic's, keyed (minus the topic id, 0). A lock is in PostgreSQL's shared memory,
never a tuple, and it goes with the session: a consumer that dies waiting leaves nothing.

The keys are the two-int form: ``pg_locks`` shows ``classid`` the negated topic id (an oid:
2^32 - topic id), ``objid`` the group id (0: the topic's), ``objsubid`` 2. redelivery's other
two-int locks have positive namespaces (7,424,001 and up) and its breaker locks are the
one-bigint form (``objsubid`` 1). A publish learns whether anybody waits on its topic by trying
the topic's lock exclusively and releasing it at once (one lookup in the lock table; held until
its commit, it would keep a consumer that begins to wait waiting for a publish in a long
transaction); ``notify_waiters`` picks the backends that hold a subscription's lock (``pg_locks``,
granted) instead of the rows that had not expired; ``wake_ordered_waiters`` looks for an ended
head among the rows its delete ended (a statement with none, every ack of an unordered group,
tries no lock), then tries the topic's lock as a publish does.

``receive_waiters`` stays for one release, unread: the clients of the version before, during a
rolling upgrade, still write and read it (their waiters are then woken by their re-check, within a
second, as are the new ones by an old publisher). A later migration drops it.

Revision ID: 0023
Revises: 0022
"""

from alembic import op

revision = "0023"
down_revision = "0022"

#: The backends of a database that wait on subscription (``{topic}``, ``{group}``): the granted
#: shares of its waiter lock (``{group}`` NULL: of any group of the topic; never the topic's lock).
WAITER_LOCKS = """pg_locks l
          WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND l.classid = (-({topic}))::oid AND l.objid <> 0
            AND ({group} IS NULL OR l.objid = ({group})::oid)"""

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
  -- none, nothing to send; of a topic nobody waits on (its waiter lock, tried exclusively for an
  -- instant, is granted), nothing either, and pg_locks is not read
  PERFORM notify_waiters(array_agg(h.topic_id), array_agg(h.group_id), array_agg(h.n))
  FROM (SELECT f.topic_id, f.group_id, count(*)::int AS n FROM finished f
        WHERE f.key IS NOT NULL AND f.state <> 'BLOCKED'
        GROUP BY f.topic_id, f.group_id) h
  WHERE CASE WHEN pg_try_advisory_lock(-h.topic_id, 0) THEN NOT pg_advisory_unlock(-h.topic_id, 0)
             ELSE true END
  HAVING count(*) > 0;
  RETURN NULL;
END $$;
"""


def upgrade() -> None:
    op.execute(NOTIFY_WAITERS)
    op.execute(WAKE_ORDERED_WAITERS)


def downgrade() -> None:
    from importlib import import_module

    before = import_module("redelivery.store.migrations.versions.0019_notify_waiters")
    op.execute(before.NOTIFY_WAITERS.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute(before.WAKE_ORDERED_WAITERS)
