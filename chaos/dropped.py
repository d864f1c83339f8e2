"""The record of the partitions retention drops (``chaos.dropped_partitions``), which invariants
4 and 18 read: set up on the suite's database by ``install``."""

from __future__ import annotations

import psycopg

#: The partitions retention dropped, recorded by a trigger in the transaction that forgets each one
#: (a partition of the same times may be made again later: a publish at an old time, a redrive
#: putting a dead letter's message back). ``install`` sets it up on the suite's database.
_RECORD_DROPS = """
    CREATE SCHEMA IF NOT EXISTS chaos;
    CREATE TABLE IF NOT EXISTS chaos.dropped_partitions (
        partition_name text, starts_at timestamptz, ends_at timestamptz,
        dropped_at timestamptz DEFAULT now());
    TRUNCATE chaos.dropped_partitions;
    CREATE OR REPLACE FUNCTION chaos.record_dropped_partition() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO chaos.dropped_partitions (partition_name, starts_at, ends_at)
      VALUES (OLD.partition_name, OLD.starts_at, OLD.ends_at);
      RETURN OLD;
    END $$;
    CREATE OR REPLACE TRIGGER chaos_record_dropped AFTER DELETE ON redelivery.log_partitions
        FOR EACH ROW EXECUTE FUNCTION chaos.record_dropped_partition()"""


def install(conn: psycopg.Connection) -> None:
    """Record the partitions retention drops from now on (``chaos.dropped_partitions``), emptied."""
    conn.execute(_RECORD_DROPS)


def uninstall(conn: psycopg.Connection) -> None:
    """Stop recording dropped partitions (a test database shared with other tests)."""
    conn.execute("DROP TRIGGER IF EXISTS chaos_record_dropped ON redelivery.log_partitions")
