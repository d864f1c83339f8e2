"""The tier DAGs in a real Airflow 3: import, structure, and dag.test() runs through the Spark
provider (spark-submit in local mode)."""

from datetime import timedelta

import pytest

from helpers import at

pytestmark = pytest.mark.airflow


def test_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert sorted(dagbag.dag_ids) == [
        "dlq_redrive",
        "redelivery_breaker",
        "redelivery_flights_consumer",
        "redelivery_maintenance",
        "redelivery_standing_redrives",
        "redelivery_tier_half_hours",
        "redelivery_tier_hours",
        "redelivery_tier_minutes",
        "redelivery_tier_seconds",
    ]


@pytest.mark.parametrize(
    "dag_id,window",
    [
        ("redelivery_tier_seconds", 10),
        ("redelivery_tier_minutes", 60),
        ("redelivery_tier_half_hours", 300),
        ("redelivery_tier_hours", 600),
    ],
)
def test_tier_dag_settings(dagbag, dag_id, window):
    """Issue 38: a DAG run an hour (24 a day per tier, not one per window) whose task applies the
    hour's windows of ``window`` seconds, and is stopped 10 minutes after its span at the latest."""
    from airflow.sdk import DeltaTriggerTimetable

    dag = dagbag.get_dag(dag_id)
    assert isinstance(dag.timetable, DeltaTriggerTimetable)
    assert dag.timetable.delta == timedelta(hours=1) and dag.timetable.interval == timedelta()
    assert dag.catchup is False and dag.max_active_runs == 2  # the hour's batch, and a manual window
    assert (
        {"redelivery", "tier"} <= set(dag.tags)
        and dag.doc_md
        and "60 windows of 1m" in dagbag.get_dag("redelivery_tier_minutes").doc_md
    )
    assert set(dag.params.keys()) == {"window_end", "levels", "dry_run"}
    [task] = dag.tasks
    assert task.task_id == "apply_window" and task.outlets == []
    assert task.execution_timeout == timedelta(minutes=70)


def test_a_tier_of_one_window_per_run_keeps_a_dag_run_per_window():
    """``run_span`` equal to ``window``: the design before issue 38, a DAG run per window whose
    data interval is the window."""
    from airflow.sdk import DeltaDataIntervalTimetable

    from redelivery.airflow.dags.tiers import tier_dag
    from redelivery.config import RedeliveryConfig, TierConfig, default_tiers

    one = TierConfig(name="seconds", levels=[1, 2], window="10s", run_span="10s")
    config = RedeliveryConfig(tiers=[one, *default_tiers()[1:]])
    dag = tier_dag(one, config)
    assert isinstance(dag.timetable, DeltaDataIntervalTimetable)
    assert dag.timetable.delta == timedelta(seconds=10) and dag.tasks[0].execution_timeout is None
    assert dag.max_active_runs == 1


@pytest.fixture()
def waiting(client, topic_group):
    client.publish("orders", [{"n": i} for i in range(40)], at=at(0))
    client.nack("billing", client.receive("billing", "orders", 40, 30, at=at(0)), error="x", at=at(0))
    return client


def return_value(run, task_id="apply_window"):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(run_id=run.run_id, dag_ids=run.dag_id, task_ids=task_id, key="return_value")
        ).first()
        return XComModel.deserialize_value(row)


def test_dag_test_promotes_the_window_and_returns_the_summary(dagbag, waiting):
    dag = dagbag.get_dag("redelivery_tier_seconds")
    run = dag.test(logical_date=at(10))
    assert str(run.state).endswith("success")
    assert waiting.stats()["orders"]["billing"]["READY"] == 40
    summary = return_value(run)
    assert summary["promoted"] == 40 and summary["window_end"] == at(10).isoformat()
    assert summary["window_start"] == at(0).isoformat()
    recorded = waiting.conn.execute("SELECT run_key, summary->>'promoted' FROM tier_runs").fetchall()
    assert (
        len(recorded) == 1
        and recorded[0][0].startswith("redelivery_tier_seconds/")
        and recorded[0][1] == "40"
    )
    # the same window again moves nothing
    again = dag.test(logical_date=at(10))
    assert str(again.state).endswith("success") and return_value(again)["promoted"] == 0


def test_manual_params_window_end_and_dry_run(dagbag, waiting):
    dag = dagbag.get_dag("redelivery_tier_seconds")
    run = dag.test(logical_date=at(5), run_conf={"window_end": at(10).isoformat(), "dry_run": True})
    assert str(run.state).endswith("success")
    summary = return_value(run)
    assert (
        summary["dry_run"] is True
        and summary["promoted"] == 40
        and summary["window_end"] == at(10).isoformat()
    )
    assert waiting.stats()["orders"]["billing"]["WAITING_RETRY"] == 40  # nothing moved


@pytest.fixture()
def spark_for_every_window(monkeypatch):
    """The config's spark_threshold at 0: every window and redrive runs on Spark."""
    from redelivery.config import RedeliveryConfig

    config = RedeliveryConfig(spark_threshold=0)
    monkeypatch.setattr("redelivery.airflow.engine.cached_config", lambda: config)


@pytest.mark.spark
@pytest.mark.parametrize("connection", ["spark_connect", "spark"])
def test_the_tier_dag_runs_its_window_on_either_spark(
    dagbag, waiting, spark_for_every_window, monkeypatch, connection
):
    """The connection picks the path: the warm Spark Connect server, or spark-submit to a master."""
    import json

    if connection == "spark":
        monkeypatch.setenv(
            "AIRFLOW_CONN_REDELIVERY_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"})
        )
    # a logical date of its own: dag.test finds an earlier test's run of the same date done
    run = dagbag.get_dag("redelivery_tier_seconds").test(
        logical_date=at(20 if connection == "spark" else 30), run_conf={"dry_run": False, "levels": []}
    )
    assert str(run.state).endswith("success")
    summary = return_value(run)
    assert summary["engine"] == ("spark" if connection == "spark_connect" else "spark-submit")
    assert summary["promoted"] == 40 and waiting.stats()["orders"]["billing"]["READY"] == 40


@pytest.mark.spark
@pytest.mark.parametrize("connection", ["spark_connect", "spark"])
def test_the_redrive_dag_runs_a_large_selection_on_either_spark(
    dagbag, client, topic_group, spark_for_every_window, monkeypatch, connection
):
    import json

    if connection == "spark":
        monkeypatch.setenv(
            "AIRFLOW_CONN_REDELIVERY_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"})
        )
    client.publish("orders", [{"n": i} for i in range(30)])
    client.reject("billing", client.receive("billing", "orders", 30, 30), error="bad")
    run = dagbag.get_dag("dlq_redrive").test(
        run_conf={"group": "billing", "dry_run": False, "rate_limit": None}
    )
    assert str(run.state).endswith("success")
    assert client.stats()["orders"]["billing"]["READY"] == 30


@pytest.mark.spark
def test_a_spark_submit_redrive_of_many_message_ids_is_not_one_long_argument(
    dagbag, client, topic_group, spark_for_every_window, monkeypatch
):
    """Issue 16.7: 30,000 message ids are a request of about 200 KB, past Linux's 128 KiB limit on
    one argument: the job reads its request from the state store by its run key."""
    import json

    monkeypatch.setenv(
        "AIRFLOW_CONN_REDELIVERY_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"})
    )
    client.publish("orders", [{"n": i} for i in range(30)])
    client.reject("billing", client.receive("billing", "orders", 30, 30), error="bad")
    ids = list(range(1_000_000, 1_030_000))[:-10] + [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    run = dagbag.get_dag("dlq_redrive").test(
        run_conf={"group": "billing", "dry_run": False, "rate_limit": None, "message_ids": ids}
    )
    assert str(run.state).endswith("success")
    assert client.stats()["orders"]["billing"]["READY"] == 10
    summary = return_value(run, "redrive")
    assert (summary["engine"], summary["matched"], summary["moved"]) == ("spark-submit", 10, 10)
