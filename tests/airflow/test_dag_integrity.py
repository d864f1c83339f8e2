"""Every DAG of dags/ as Airflow loads it: no import errors, tags, retries, catch-up, one active
run, and documented Params."""

import pytest

pytestmark = pytest.mark.airflow


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
            if (dag_id, task.task_id) == ("redelivery_breaker", "set_breaker"):
                # an operator's open or close: a retry after an error could undo a later one
                assert task.retries == 0
                continue
            assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"
        for name, param in dag.params.items():
            assert param.schema.get("title") and param.description, f"{dag_id} param {name} is undocumented"


@pytest.fixture()
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
    from redelivery.airflow.operators import redrive_request

    params = redrive_params({"group": "billing", **conf})
    redrive_request(params)  # and the request the tasks build from them is valid


def test_the_system_dags_are_active_when_airflow_first_sees_them(dagbag):
    """Issue 17.1: the tier DAGs (the heartbeat), dlq_redrive (the page's form, REST triggers), the
    maintenance DAG and the standing redrives' (issue 41) start unpaused; the example consumer
    waits for its user."""
    active = {dag_id for dag_id, dag in dagbag.dags.items() if dag.is_paused_upon_creation is False}
    assert active == {d for d in dagbag.dag_ids if d.startswith("redelivery_tier_")} | {
        "dlq_redrive",
        "redelivery_breaker",
        "redelivery_maintenance",
        "redelivery_standing_redrives",
    }
    assert dagbag.dags["redelivery_flights_consumer"].is_paused_upon_creation is not False


def serialized(dagbag, dag_id):
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dagbag.dags[dag_id]))


def test_a_misspelt_conf_key_is_named_with_the_closest_known_one(dagbag):
    """Issue 17.2: Airflow takes {"max_mesages": 10} without a word (the redrive would move the
    whole DLQ); conf_problems names it and the key meant."""
    from redelivery.airflow.params import conf_problems

    dag = serialized(dagbag, "dlq_redrive")
    conf = {"group": "flights-http", "max_mesages": 10, "dry_run": False}
    dag.params.deep_merge(conf).validate()  # Airflow's own check takes it
    assert conf_problems(dag.params, conf) == ["max_mesages: unknown key (did you mean 'max_messages'?)"]
    assert conf_problems(dag.params, {"group": "flights-http"}) == []
    tier = serialized(dagbag, "redelivery_tier_seconds")
    assert conf_problems(tier.params, {"dryrun": True}) == ["dryrun: unknown key (did you mean 'dry_run'?)"]


def test_every_bad_field_is_one_line(dagbag):
    """Issue 17.4: every Param its value fails, one line each, no schema dump (Airflow: the first)."""
    from redelivery.airflow.params import conf_problems

    dag = serialized(dagbag, "dlq_redrive")
    problems = conf_problems(
        dag.params,
        {
            "group": "no spaces",
            "max_messages": 0,
            "reasons": ["SOMETIMES"],
            "rate_limit": -1,
            "colour": "red",
        },
    )
    assert [p.split(":")[0] for p in problems] == [
        "colour",
        "group",
        "reasons[0]",
        "max_messages",
        "rate_limit",
    ]
    assert all("\n" not in p and "schema" not in p.lower() for p in problems), problems
    assert conf_problems(dag.params, {})[0] == "group: required, no value given"


def test_a_run_with_an_unknown_conf_key_fails_before_it_moves(dagbag, client, topic_group):
    """Issue 17.2: a run Airflow created with the typo (dag.test, the CLI) fails its first task."""
    client.publish("orders", [{"n": i} for i in range(3)])
    client.reject("billing", client.receive("billing", "orders", 3, 30), error="bad")
    run = dagbag.get_dag("dlq_redrive").test(
        run_conf={"group": "billing", "max_mesages": 1, "dry_run": False, "rate_limit": None}
    )
    assert str(run.state).endswith("failed")
    assert client.stats()["orders"]["billing"]["DLQ"] == 3
    assert client.conn.execute("SELECT count(*) FROM redrive_runs").fetchone()[0] == 0
