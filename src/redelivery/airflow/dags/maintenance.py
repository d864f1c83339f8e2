"""The ``redelivery_maintenance`` DAG: every hour, keep the log's partitions made ahead, drop those
past their retention that no group needs, and delete records older than their retention
(``redelivery.store.maintenance``); and delete what redelivery's own DAGs left in Airflow past
``retention.airflow_runs`` (``redelivery.airflow.retention``)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG, conf, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from redelivery.airflow.dags.tiers import system_dag
from redelivery.airflow.hooks import RedeliveryHook
from redelivery.airflow.params import check_run_conf
from redelivery.airflow.retention import api_access, apply_airflow_retention
from redelivery.config import cached_config
from redelivery.errors import ConfigError
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

### Airflow retention

Deletes the finished runs of the tier DAGs and of this DAG that ended more than
`retention.airflow_runs` ago (7 days by default; `null` keeps them) through Airflow's REST API, with
their task instances and XComs, and their task-log folders on this worker's disk. Never another
DAG's. The API is reached with the connection `redelivery_airflow_api` (a user allowed to delete
those runs), or the worker's own API server without credentials. A refusal fails this task alone,
without a retry, naming the connection.
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
        def run_cleanup() -> None:
            check_run_conf(get_current_context())
            with RedeliveryHook().get_conn() as conn:
                conn.autocommit = True
                deleted = cleanup(conn, cached_config())
            print(f"retention: {deleted}")

        @task(task_id="airflow_retention")
        def run_airflow_retention() -> None:
            check_run_conf(get_current_context())
            config = cached_config()
            if config.retention.airflow_runs is None:
                print("retention.airflow_runs is null: Airflow runs are kept")
                return
            try:
                apply_airflow_retention(
                    config,
                    api_access(),
                    Path(conf.get("logging", "base_log_folder")),
                    conf.get("logging", "log_filename_template"),
                )
            except ConfigError as exc:  # access to give, not a moment to wait out: no retry
                raise AirflowFailException(str(exc)) from None

        run_cleanup()
        run_airflow_retention()
    return dag
