"""The ``dlq_redrive`` DAG: a manual redrive of dead letters back to READY, from the trigger form
or the REST API. Params are validated by JSON schema before a run starts; the values reach the
database as query parameters only. Task ``dlq_summary`` logs and returns the group's DLQ summary;
task ``redrive`` moves (or, as a dry run, counts and samples) the selection and returns the audit
record. Large selections run on Spark (``airflow.engine``)."""

from __future__ import annotations

import json
from datetime import timedelta

from airflow.sdk import DAG, get_current_context, task

from redelivery.airflow.dags.tiers import system_dag
from redelivery.airflow.hooks import RedeliveryHook
from redelivery.airflow.operators import RedriveOperator, redrive_request
from redelivery.airflow.params import check_run_conf, params_of
from redelivery.dead_letters import summary
from redelivery.redrive import RedriveRequest

DOC = """
### Redrive dead letters

Moves dead letters of one consumer group back to READY, in batches (each one atomic) at no more
than the rate limit. **Dry run is on by default**: it changes nothing and reports how many messages
match and a sample. Every run writes an audit row (`redrive_runs`: who, the filter, counts, start
and end) and one row per moved message (`redrive_moves`). Retrying or repeating a run never moves a
message twice; marking the task failed stops it between batches, every message in one place.
"""


def redrive_params(model: type[RedriveRequest] = RedriveRequest) -> dict:
    """The dlq_redrive DAG's Params: the fields of ``model`` (``RedriveRequest``, their one
    declaration) with their bounds as JSON schema, so the trigger form and a REST trigger are
    refused before a run starts."""
    return params_of(model)


def redrive_dag() -> DAG:
    with system_dag(
        "dlq_redrive",
        tag="dlq",
        # a retried redrive resumes its run key: it never moves a message twice
        retry_delay=timedelta(seconds=5),
        schedule=None,
        is_paused_upon_creation=False,  # the page's redrives and REST triggers need it active
        doc_md=DOC,
        params=redrive_params(),
    ) as dag:

        @task(task_id="dlq_summary")
        def dlq_summary() -> list:
            context = get_current_context()
            check_run_conf(context)
            params = context["params"]
            redrive_request(params)  # a request the Params schema cannot refuse (a time range backwards)
            with RedeliveryHook().get_conn() as conn:
                found = summary(conn, params["group"])
            for item in found or [{"group": params["group"], "count": 0}]:
                print(f"DLQ summary: {json.dumps(item)}")
            return found

        dlq_summary() >> RedriveOperator(task_id="redrive")
    return dag
