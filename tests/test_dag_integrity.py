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
