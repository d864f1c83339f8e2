"""Metrics: the partial indexes of the WAITING_RETRY and INFLIGHT deliveries carry their group and
topic, so the scrape counts those states per subscription from the indexes alone.

Measured with bench/bench_metrics.py on 10 million deliveries (500,000 not COMMITTED, spread over
the table): counting 150,000 WAITING_RETRY rows through the old index read nearly every heap page
(about as long as counting all 10 million); from the index alone it reads none once VACUUM has
marked the pages all-visible. INCLUDE columns are not keys: the tier job's scans (level, due time;
lease end) and the entries' number stay as they were, each a few bytes larger.

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    # Rebuilt under the same names (a plain CREATE INDEX: writes to deliveries wait for the build,
    # which reads the table once per index).
    op.execute("""
    SET LOCAL search_path TO redelivery;

    DROP INDEX deliveries_waiting;
    CREATE INDEX deliveries_waiting ON deliveries (delay_level, due_at) INCLUDE (group_id, topic_id)
        WHERE state = 'WAITING_RETRY';
    DROP INDEX deliveries_inflight;
    CREATE INDEX deliveries_inflight ON deliveries (invisible_until) INCLUDE (group_id, topic_id)
        WHERE state = 'INFLIGHT';
    """)
