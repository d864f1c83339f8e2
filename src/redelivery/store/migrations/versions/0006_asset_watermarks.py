"""Asset watchers: the watermark of each asset's event trigger, and an index of the READY
deliveries by the time they became READY.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

from redelivery.store.migrations.online import build_index

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    # The READY deliveries of a subscription by ready_at: the trigger's poll reads those since its
    # watermark (without it, every READY row of the group: about 65 ms per poll for 500,000), and
    # the metrics read the oldest one. Only rows that become READY get an entry (publish,
    # promotion, redrive); receives, acks and nacks write no more than before. Built concurrently.
    build_index("deliveries_ready_at", "deliveries (group_id, topic_id, ready_at) WHERE state = 'READY'")
    op.execute("""
    SET LOCAL search_path TO redelivery;

    -- One row per asset (redelivery://<topic>/<group>) whose trigger fired: the deliveries that
    -- became READY before the watermark have had their event (airflow.triggers.ReadyMessagesTrigger).
    CREATE TABLE asset_watermarks (
        asset_uri text PRIMARY KEY,
        watermark timestamptz NOT NULL,
        events bigint NOT NULL DEFAULT 1,
        fired_at timestamptz NOT NULL DEFAULT now()
    );
    """)
