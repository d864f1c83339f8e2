"""Every DAG of dags/ as Airflow loads it: no import errors, tags, retries, catch-up, one active
run, and documented Params."""

import pytest

from redelivery.settings import REPO_ROOT

pytestmark = pytest.mark.airflow


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO_ROOT / "dags"))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert len(dagbag.dags) >= 2


def test_every_dag_follows_the_rules(dagbag):
    for dag_id, dag in dagbag.dags.items():
        assert "redelivery" in dag.tags, dag_id
        assert dag.doc_md, dag_id
        assert dag.catchup is False, dag_id
        assert dag.max_active_runs >= 1, dag_id
        for task in dag.tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"
        for name, param in dag.params.items():
            assert param.schema.get("title") and param.description, f"{dag_id} param {name} is undocumented"


@pytest.fixture(scope="module")
def redrive_params(dagbag):
    """The dlq_redrive DAG's Params as the api-server holds them (the serialized DAG): a trigger's
    ``create_dagrun`` merges the conf into them and validates; a ParamValidationError is its HTTP 400."""
    from airflow.serialization.serialized_objects import DagSerialization

    dag = DagSerialization.from_dict(DagSerialization.to_dict(dagbag.dags["dlq_redrive"]))

    def validate(conf: dict) -> dict:
        return dag.params.deep_merge(conf).validate()  # the resolved params the tasks get

    return validate


@pytest.mark.parametrize(
    "conf,keyword",
    [
        ({"max_messages": 2**31}, "maximum"),  # RedriveRequest's bound: 2**31 - 1
        ({"error_contains": "ERP\x00timeout"}, "pattern"),
        ({"error_contains": "\x00"}, "pattern"),
        ({"message_ids": list(range(1, 100_002))}, "maxItems"),
        ({"reasons": ["SOMETHING_ELSE"]}, "enum"),
    ],
    ids=["max_messages 2**31", "NUL in error_contains", "only NUL", "100,001 message ids", "unknown reason"],
)
def test_the_redrive_params_refuse_what_the_redrive_would_refuse(redrive_params, conf, keyword):
    from airflow.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=f"'{keyword}'"):
        redrive_params({"group": "billing", **conf})


@pytest.mark.parametrize(
    "conf",
    [
        {"max_messages": 2**31 - 1},
        {"error_contains": "ERP timeout: 503 — service unavailable"},
        {"message_ids": list(range(1, 100_001))},
        {"reasons": ["UNDECODABLE"]},
        {
            "reasons": [
                "MAX_DELIVERIES_EXCEEDED",
                "LEASE_EXPIRED",
                "REJECTED",
                "NEGATIVE_LEVEL",
                "UNDECODABLE",
            ]
        },
    ],
    ids=["max_messages 2**31-1", "error text", "100,000 message ids", "UNDECODABLE", "every reason"],
)
def test_the_redrive_params_take_what_the_redrive_takes(redrive_params, conf):
    from redelivery.airflow.redrive_dag import request_from

    params = redrive_params({"group": "billing", **conf})
    request_from(params)  # and the request the tasks build from them is valid
