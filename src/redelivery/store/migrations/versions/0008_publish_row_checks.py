"""Publish without a foreign-key check per row: messages -> topics, deliveries -> messages and
deliveries -> consumer_groups are dropped.

Each was a trigger run for every inserted row (three checks per message with two groups), about
half of a publish's time (bench/bench_publish.py: FAN_OUT of 336,776 flights 19.4 s with them,
9.7 s without). What they guaranteed is kept by statements, once per transaction instead of once
per row:

- a publish or a redrive to another topic locks the topic row FOR KEY SHARE before it writes
  (statements.LOCK_TOPIC_SHARED), as the checks did row by row, so a topic cannot be deleted under
  it and a deleted topic cannot get messages;
- deleting a topic locks its row FOR UPDATE (waiting for those writers), then deletes its
  deliveries (their dead letters cascade, that key stays), messages and the topic
  (statements.LOCK_TOPIC_FOR_DELETE, DELETE_TOPIC);
- deliveries are only inserted for the subscriptions of a topic, and groups are never deleted.

The crash suite checks that every delivery has its message in its topic (chaos/invariants.py).
Upgrade every client (Airflow workers, Spark jobs) with the schema: an older client deletes a topic
without its messages and publishes without holding the topic. Downgrading re-adds the keys, and
fails if rows without their parent exist.

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.execute("""
    SET LOCAL search_path TO redelivery;
    ALTER TABLE messages DROP CONSTRAINT messages_topic_id_fkey;
    ALTER TABLE deliveries DROP CONSTRAINT deliveries_message_id_fkey;
    ALTER TABLE deliveries DROP CONSTRAINT deliveries_group_id_fkey;
    """)


def downgrade() -> None:
    op.execute("""
    SET LOCAL search_path TO redelivery;
    ALTER TABLE messages ADD CONSTRAINT messages_topic_id_fkey FOREIGN KEY (topic_id)
        REFERENCES topics (id) ON DELETE CASCADE;
    ALTER TABLE deliveries ADD CONSTRAINT deliveries_message_id_fkey FOREIGN KEY (message_id)
        REFERENCES messages (id) ON DELETE CASCADE;
    ALTER TABLE deliveries ADD CONSTRAINT deliveries_group_id_fkey FOREIGN KEY (group_id)
        REFERENCES consumer_groups (id) ON DELETE CASCADE;
    """)
