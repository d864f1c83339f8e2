"""The ``dlq_redrive`` DAG: a manual redrive of dead letters back to READY, from the trigger form
or the REST API. Params are validated by JSON schema before a run starts; the values reach the
database as query parameters only. Task ``dlq_summary`` logs and returns the group's DLQ summary;
task ``redrive`` moves (or, as a dry run, counts and samples) the selection and returns the audit
record. Large selections run on Spark (``airflow.engine``)."""

from __future__ import annotations

import json
from datetime import timedelta

from airflow.sdk import DAG, Param, get_current_context, task

from redelivery.airflow.dags.tiers import START
from redelivery.airflow.hooks import RedeliveryHook
from redelivery.airflow.operators import RedriveOperator, redrive_request
from redelivery.airflow.params import check_run_conf
from redelivery.dead_letters import (
    MAX_ERROR_TEXT,
    MAX_KEY_CHARS,
    MAX_MESSAGE_ID,
    MAX_MESSAGE_IDS,
    REASONS,
    summary,
)
from redelivery.rules.names import NAME_REGEX
from redelivery.rules.policies import MAX_INT

#: A topic name, or empty (the form's blank field).
OPTIONAL_NAME = f"^({NAME_REGEX})?$"
#: Any text without a NUL character (PostgreSQL's text cannot hold one); ECMA 262 and Python alike.
NO_NUL = r"^[^\u0000]*$"

DOC = """
### Redrive dead letters

Moves dead letters of one consumer group back to READY, in batches (each one atomic) at no more
than the rate limit. **Dry run is on by default**: it changes nothing and reports how many messages
match and a sample. Every run writes an audit row (`redrive_runs`: who, the filter, counts, start
and end) and one row per moved message (`redrive_moves`). Retrying or repeating a run never moves a
message twice; marking the task failed stops it between batches, every message in one place.
"""


def redrive_params() -> dict:
    """The dlq_redrive DAG's Params: the fields of ``RedriveRequest`` with their bounds as JSON
    schema, so the trigger form and a REST trigger are refused before a run starts."""
    return {**_selection_params(), **_run_params()}


def _selection_params() -> dict:
    """Which dead letters: the filter the redrive and the page share (``DlqFilter``)."""
    return {
        "group": Param(
            type="string",
            pattern=f"^{NAME_REGEX}$",
            title="Consumer group",
            description="Required. The group whose dead letters move.",
        ),
        "topic": Param(
            None,
            type=["null", "string"],
            pattern=OPTIONAL_NAME,
            title="Topic",
            description="Only dead letters from this topic. Empty: every topic of the group.",
        ),
        "dead_lettered_from": Param(
            None,
            type=["null", "string"],
            format="date-time",
            title="Dead-lettered from",
            description="ISO 8601 time, inclusive. Empty: no lower bound.",
        ),
        "dead_lettered_to": Param(
            None,
            type=["null", "string"],
            format="date-time",
            title="Dead-lettered before",
            description="ISO 8601 time, exclusive. Empty: no upper bound.",
        ),
        "reasons": Param(
            [],
            type="array",
            items={"type": "string", "enum": list(REASONS)},
            uniqueItems=True,
            title="Reasons",
            description="Only these dead-letter reasons. Empty: all.",
        ),
        "error_contains": Param(
            None,
            type=["null", "string"],
            maxLength=MAX_ERROR_TEXT,
            pattern=NO_NUL,
            title="Error text contains",
            description="Case-insensitive text of the last error. Empty: any.",
        ),
        "message_ids": Param(
            [],
            type="array",
            items={"type": "integer", "minimum": 1, "maximum": MAX_MESSAGE_ID},
            maxItems=MAX_MESSAGE_IDS,
            title="Message ids",
            description=f"Only these message ids (at most {MAX_MESSAGE_IDS:,}). Empty: any.",
        ),
        "key": Param(
            None,
            type=["null", "string"],
            maxLength=MAX_KEY_CHARS,
            pattern=NO_NUL,
            title="Message key",
            description="Only dead letters with exactly this key. Empty: any.",
        ),
    }


def _run_params() -> dict:
    """How the run moves them."""
    return {
        "max_messages": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            maximum=MAX_INT,
            title="Max messages",
            description="Move at most this many. Empty: all that match.",
        ),
        "rate_limit": Param(
            500,
            type=["null", "number"],
            exclusiveMinimum=0,
            maximum=1000000,
            title="Rate limit (messages per second)",
            description="Empty: no limit.",
        ),
        "destination_topic": Param(
            None,
            type=["null", "string"],
            pattern=OPTIONAL_NAME,
            title="Destination topic",
            description="Empty: back to the original topic. Otherwise a copy is "
            "published there and the dead letter is closed.",
        ),
        "reset_reconsume_times": Param(
            True,
            type="boolean",
            title="Restore the retry budget",
            description="On: reconsume times back to 0, so a redriven message gets its retries "
            "again. The delivery count is never reset, and the redrive is counted.",
        ),
        "dry_run": Param(
            True,
            type="boolean",
            title="Dry run",
            description="On: only count and sample what would move.",
        ),
    }


def redrive_dag() -> DAG:
    with DAG(
        dag_id="dlq_redrive",
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=False,  # the page's dry-run form and REST triggers need it active
        tags=["redelivery", "dlq"],
        # a retried redrive resumes its run key: it never moves a message twice
        default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
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
