"""Alembic environment: plain SQL migrations in the ``redelivery`` schema, one at a time."""

import time

from alembic import context
from sqlalchemy import create_engine, make_url, text

from redelivery.store.db import MIGRATION_LOCK_TIMEOUT_SECONDS, connect_timeouts

SCHEMA = "redelivery"
MIGRATION_LOCK = 7_424_001  # pg_advisory_lock key: one migrating process at a time
LOCK_POLL_SECONDS = 0.5
APPLICATION_NAME = "redelivery-migrate"


def take_migration_lock(connection) -> None:
    """Wait for the migration lock as long as it takes, between transactions: a session blocked
    inside ``pg_advisory_lock`` holds a snapshot, and a concurrent index build of the process that
    has the lock waits for every older snapshot, so the two would wait for each other."""
    while True:
        result = connection.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
        taken = result.scalar_one()
        connection.commit()
        if taken:
            return
        time.sleep(LOCK_POLL_SECONDS)


def run_migrations_online() -> None:
    url = make_url(context.config.get_main_option("sqlalchemy.url"))
    libpq = url.set(drivername="postgresql").render_as_string(hide_password=False)
    engine = create_engine(
        url,  # named in pg_stat_activity; REDELIVERY_CONNECT_TIMEOUT, as every connection
        connect_args={"application_name": APPLICATION_NAME, **connect_timeouts(libpq)},
    )
    try:
        _run(engine)
    finally:
        engine.dispose()


def _run(engine) -> None:
    with engine.connect() as connection:
        take_migration_lock(connection)
        # Taken after the advisory lock (a second migrating process waits for the first as long
        # as it takes): from here a step that waits longer for a table lock gives up, so that the
        # writers queued behind its request go on; redelivery.store.db.migrate runs the migrations again.
        connection.execute(
            text("SELECT set_config('lock_timeout', :t, false)"),
            {"t": f"{int(MIGRATION_LOCK_TIMEOUT_SECONDS * 1000)}ms"},
        )
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        connection.commit()
        try:
            context.configure(
                connection=connection, version_table_schema=SCHEMA, transaction_per_migration=True
            )
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
        finally:
            connection.rollback()  # a failed migration's transaction: the unlock needs a fresh one
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
            connection.commit()


run_migrations_online()
