"""Alembic environment: plain SQL migrations in the ``redelivery`` schema, one at a time."""

from alembic import context
from sqlalchemy import create_engine, text

SCHEMA = "redelivery"
MIGRATION_LOCK = 7_424_001  # pg_advisory_lock key: one migrating process at a time


def run_migrations_online() -> None:
    engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
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
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
            connection.commit()
    engine.dispose()


run_migrations_online()
