"""Metrics: totals that never decrease (promoted, dead-lettered, redriven per group), cumulative
histograms per tier (tier-run duration, retry lateness), and an index that counts dead letters
without reading their payloads.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    # Dead letters per DLQ, group, topic and reason from this narrow index (an index-only scan);
    # dlq_messages rows carry the payloads and the attempt history. A plain build (PostgreSQL
    # cannot build an index on a partitioned table CONCURRENTLY): dead-lettering waits for it. In a
    # transaction of its own, before the ALTER below, whose lock on consumer_groups every publish
    # and receive needs: that one is held for an instant, not for the build.
    with op.get_context().autocommit_block():
        op.execute(
            "CREATE INDEX IF NOT EXISTS dlq_messages_reason"
            " ON redelivery.dlq_messages (dlq_id, group_id, topic_id, reason)"
        )
    op.execute("""
    SET LOCAL search_path TO redelivery;

    -- Prometheus counters (redelivery.metrics): each total is added to in the transaction of the
    -- change it counts, by what its guarded statement moved, and never decreases (retention deletes
    -- no group). stale_receipts (0003) is the fourth. Constant defaults: no table rewrite.
    ALTER TABLE consumer_groups
        ADD COLUMN promoted bigint NOT NULL DEFAULT 0 CHECK (promoted >= 0),
        ADD COLUMN dead_lettered bigint NOT NULL DEFAULT 0 CHECK (dead_lettered >= 0),
        ADD COLUMN redriven bigint NOT NULL DEFAULT 0 CHECK (redriven >= 0);

    -- Cumulative histograms per tier, kept apart from tier_runs (which retention deletes):
    -- counts[i] observations in (bounds[i-1], bounds[i]] (1-based; the last one above every bound,
    -- +Inf) and their sum; bounds and sum in seconds. Other bounds restart a row's counts.
    CREATE TABLE tier_histograms (
        tier text NOT NULL,
        metric text NOT NULL CHECK (metric IN ('run_duration', 'retry_lateness')),
        bounds float8[] NOT NULL,
        counts bigint[] NOT NULL CHECK (cardinality(counts) = cardinality(bounds) + 1),
        sum float8 NOT NULL DEFAULT 0,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (tier, metric)
    );
    """)
