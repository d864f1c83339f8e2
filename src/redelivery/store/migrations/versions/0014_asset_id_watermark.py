"""Asset watchers tell new log messages by their ids (issue 27, item 4): besides the time
watermarks (READY delivery rows by ``ready_at``), each asset keeps the highest message id its
events claimed (``id_watermark``) and the highest Airflow confirmed stored (``id_confirmed``). A
message's ``published_at`` is its publisher's ``at`` (a Spark publish stamps its job's start), so a
watermark of publish times missed every backdated publish; a topic's ids grow in commit order
under its publish lock, as the consume offsets rely on.

Rows from before have no id watermark (NULL): their trigger's next poll counts from the group's
consume offset, so it fires once for the messages waiting past it (those a backdated publish left
unannounced among them), at least once as ever.

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    # Nullable, no default: a change of the catalog only (no table rewrite), under the migrations'
    # lock_timeout; the triggers' claims hold the table for a moment each.
    op.execute("""
    ALTER TABLE redelivery.asset_watermarks ADD COLUMN id_watermark bigint, ADD COLUMN id_confirmed bigint;
    """)


def downgrade() -> None:
    op.execute("ALTER TABLE redelivery.asset_watermarks DROP COLUMN id_watermark, DROP COLUMN id_confirmed")
