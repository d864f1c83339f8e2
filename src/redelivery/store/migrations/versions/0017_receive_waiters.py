"""Consumers that wait for a message (issue 42): ``receive(..., wait_seconds=...)`` long-polls.

A waiting consumer LISTENs on its backend's channel (``redelivery_wait_<pid>``) and says so in
``receive_waiters``: one row per topic, group and backend, until ``expires_at``. What makes
messages receivable (a publish, a tier run's promotion, a redrive) NOTIFYs some of those backends
(per group, as many as it made messages receivable) after its commit, only when a row of the topic
has not expired: PostgreSQL serialises the commits of every notifying
transaction of the cluster on one lock and queues a notification whether or not anybody listens,
so a publish with nobody waiting must not notify (it reads this table in a statement it runs
anyway). There is no other way for a session to know whether another LISTENs.

Unlogged: presence is worth nothing after a crash (the table is emptied by recovery, and a waiter
re-checks within a second whatever it missed), and its rows change with every wait, so they cost
no WAL. No foreign keys: a topic deleted while somebody waits on it leaves a row that expires.
Rows of a consumer that died expire and are deleted by the next waiter's statement.

Revision ID: 0017
Revises: 0016
"""

from alembic import op

revision = "0017"
down_revision = "0016"


def upgrade() -> None:
    op.execute("""
    CREATE UNLOGGED TABLE redelivery.receive_waiters (
        topic_id integer NOT NULL,
        group_id integer NOT NULL,
        backend_pid integer NOT NULL,
        expires_at timestamptz NOT NULL,
        PRIMARY KEY (topic_id, group_id, backend_pid)
    );
    """)


def downgrade() -> None:
    op.execute("DROP TABLE redelivery.receive_waiters")
