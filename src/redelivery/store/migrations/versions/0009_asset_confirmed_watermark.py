"""Asset watchers at least once per edge: besides the watermark an event claims before it leaves
the trigger, the watermark up to which Airflow confirmed the events stored (Airflow 3.3's ack mode
for shared-stream triggers). A trigger re-created after a triggerer crash starts from the
confirmed one, so an event claimed but never stored fires again.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    # Nullable, no default: no table rewrite (and asset_watermarks holds a row per asset). What
    # was claimed before counts as confirmed: those events left under the old at-most-once rule,
    # and a NULL would fire each asset's whole READY backlog again.
    op.execute("""
    ALTER TABLE redelivery.asset_watermarks ADD COLUMN confirmed timestamptz;
    UPDATE redelivery.asset_watermarks SET confirmed = watermark;
    """)


def downgrade() -> None:
    op.execute("ALTER TABLE redelivery.asset_watermarks DROP COLUMN confirmed")
