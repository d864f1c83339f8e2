"""The ``redelivery_standing_redrives`` DAG in a real Airflow 3 (issue 41): a manual run ticks
once and brings back what a due standing redrive selects; a scheduled run ticks for an hour."""

import time
from datetime import timedelta

import pytest

from redelivery.rules.standing import StandingRedrive
from redelivery.standing import add, policies

pytestmark = pytest.mark.airflow


def return_value(run, task_id: str):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(run_id=run.run_id, dag_ids=run.dag_id, task_ids=task_id, key="return_value")
        ).first()
        return XComModel.deserialize_value(row)


def test_a_manual_run_ticks_once_and_returns_its_report(dagbag, client, topic_group):
    from airflow.sdk import DeltaTriggerTimetable

    dag = dagbag.get_dag("redelivery_standing_redrives")
    assert isinstance(dag.timetable, DeltaTriggerTimetable) and dag.timetable.delta == timedelta(hours=1)
    # a reject dead-letters at once, whatever the retry policy
    client.publish("orders", [{"n": i} for i in range(3)])
    client.reject("billing", client.receive("billing", "orders", 3, 60), error="bad schema")
    add(
        client.conn,
        StandingRedrive(name="nightly", group="billing", after="every", generation_wait="1s"),
        "test",
    )
    time.sleep(1.1)
    run = dag.test()
    assert str(run.state).endswith("success")
    report = return_value(run, "tick")
    [record] = report["runs"]
    assert (record["moved"], record["triggered_by"]) == (3, "standing:nightly")
    assert policies(client.conn)[0]["brought_back"] == 3
    assert client.conn.execute("SELECT count(*) FROM dlq_messages").fetchone()[0] == 0
