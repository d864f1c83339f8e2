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

from redelivery.store.migrations.online import build_index

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    # Rebuilt under the same names, concurrently: writes to deliveries go on during each build, and
    # the old index serves the tier job's scans until it is dropped.
    build_index(
        "deliveries_waiting",
        "deliveries (delay_level, due_at) INCLUDE (group_id, topic_id) WHERE state = 'WAITING_RETRY'",
        replace=True,
    )
    build_index(
        "deliveries_inflight",
        "deliveries (invisible_until) INCLUDE (group_id, topic_id) WHERE state = 'INFLIGHT'",
        replace=True,
    )
