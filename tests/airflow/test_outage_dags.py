"""Issue 41's DAGs in a real Airflow 3: ``redelivery_standing_redrives`` (a manual run ticks once
and brings back what a due standing redrive selects; a scheduled run ticks for an hour) and
``redelivery_breaker`` (an operator opens or closes a breaker, audited as the triggering user)."""

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
        StandingRedrive(
            name="nightly", group="billing", after="every", generation_wait="1s", reasons=["REJECTED"]
        ),
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


def test_the_breaker_dag_opens_and_closes_a_breaker_audited_as_its_user(dagbag, client, topic_group):
    dag = dagbag.get_dag("redelivery_breaker")
    conf = {"topic": "orders", "group": "billing", "action": "open", "note": "payments down"}
    run = dag.test(run_conf=conf)
    assert str(run.state).endswith("success")
    assert return_value(run, "set_breaker")["to"] == "held"
    [breaker] = client.breakers("billing")
    assert breaker["state"] == "held" and breaker["changed_by"].startswith("airflow:")
    # (a DAG object of dag.test keeps the last run's conf as its Params' values: the note given again)
    run = dag.test(run_conf={"topic": "orders", "group": "billing", "action": "close", "note": None})
    assert return_value(run, "set_breaker")["to"] == "closed"
    assert [t["note"] for t in client.breaker_history("billing")] == [None, "payments down"]


def test_the_breaker_dag_refuses_a_subscription_that_does_not_exist(dagbag, client, topic_group):
    run = dagbag.get_dag("redelivery_breaker").test(
        run_conf={"topic": "orders", "group": "nobody", "action": "close"}
    )
    assert str(run.state).endswith("failed")
    assert client.breaker_history("billing") == []
    run = dagbag.get_dag("redelivery_breaker").test(
        run_conf={"topic": "orders", "group": "billing", "action": "close", "seconds": 60}
    )
    assert str(run.state).endswith("failed") and client.breaker_history("billing") == []
