"""The ``redelivery_maintenance`` DAG: every hour, keep the log's partitions made ahead, drop those
past their retention that no group needs, and delete records older than their retention
(``redelivery.store.maintenance``)."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, get_current_context, task

from redelivery.airflow.dags.tiers import system_dag
from redelivery.airflow.hooks import RedeliveryHook
from redelivery.airflow.params import check_run_conf
from redelivery.config import cached_config
from redelivery.store.maintenance import cleanup

DOC = """
### Retention

Makes the log's partitions before publishers need them, and drops the partitions that ended more
than `retention.messages` ago once no consumer group needs any of their messages (a group that lags
holds them: the metric `redelivery_log_held_partitions` names it). Deletes what would otherwise grow
forever, each kind older than its `retention` setting in the config file: dead letters (only when
`retention.dead_letters` is set), publish batch ids (a batch id publishes once within its
retention), rows staged by publishes that never finished, tier run records, settle markers
(`settle_markers`: the parts a Spark settle answered), and redrive runs with their per-message
audit.
"""


def maintenance_dag() -> DAG:
    with system_dag(
        "redelivery_maintenance",
        tag="maintenance",
        retry_delay=timedelta(minutes=1),
        schedule=timedelta(hours=1),  # the log's partitions (1 h by default)
        is_paused_upon_creation=False,  # retention: the store grows without it
        doc_md=DOC,
    ) as dag:

        @task(task_id="cleanup")
        def run_cleanup() -> dict:
            check_run_conf(get_current_context())
            with RedeliveryHook().get_conn() as conn:
                conn.autocommit = True
                deleted = cleanup(conn, cached_config())
            print(f"retention: {deleted}")
            return deleted

        run_cleanup()
    return dag
