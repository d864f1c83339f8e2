"""The ``dlq_redrive`` DAG: a manual redrive of dead letters back to READY, from the trigger form
or the REST API. Params are validated by JSON schema before a run starts; the values reach the
database as query parameters only. Task ``dlq_summary`` logs and returns the group's DLQ summary;
task ``redrive`` moves (or, as a dry run, counts and samples) the selection and returns the audit
record. Large selections go to a Spark job through the Spark provider."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

from airflow.sdk import DAG, BaseOperator, Param, get_current_context, task

from ..config import cached_config
from ..dead_letters import MAX_ERROR_TEXT, MAX_MESSAGE_ID, MAX_MESSAGE_IDS, REASONS, count, summary
from ..names import NAME_REGEX
from ..policies import MAX_INT
from ..redrive import RedriveRequest, open_run, redrive, run_record
from ..settings import REPO_ROOT
from ..spark.session import submit_environment
from .dags import START
from .env import SPARK_CONN_ID
from .hooks import RedeliveryHook
from .operators import connect_session, spark_connection, spark_master
from .params import check_run_conf

#: A topic name, or empty (the form's blank field).
OPTIONAL_NAME = f"^({NAME_REGEX})?$"
#: Any text without a NUL character (PostgreSQL's text cannot hold one); ECMA 262 and Python alike.
NO_NUL = r"^[^\u0000]*$"
REDRIVE_APPLICATION = str(REPO_ROOT / "spark_jobs" / "dlq_redrive.py")

DOC = """
### Redrive dead letters

Moves dead letters of one consumer group back to READY, in batches (each one atomic) at no more
than the rate limit. **Dry run is on by default**: it changes nothing and reports how many messages
match and a sample. Every run writes an audit row (`redrive_runs`: who, the filter, counts, start
and end) and one row per moved message (`redrive_moves`). Retrying or repeating a run never moves a
message twice; marking the task failed stops it between batches, every message in one place.
"""


def request_from(params: dict) -> RedriveRequest:
    """The redrive the Params ask for (pydantic validates them once more)."""
    keys = (
        "group",
        "topic",
        "dead_lettered_from",
        "dead_lettered_to",
        "error_contains",
        "max_messages",
        "rate_limit",
        "destination_topic",
        "reset_reconsume_times",
        "dry_run",
    )
    values = {k: params.get(k) for k in keys}
    values["reasons"] = params.get("reasons") or []
    values["message_ids"] = params.get("message_ids") or []
    return RedriveRequest(**values)


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
        params={
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
        },
    ) as dag:

        @task(task_id="dlq_summary")
        def dlq_summary() -> list:
            context = get_current_context()
            check_run_conf(context)
            params = context["params"]
            request_from(
                params
            )  # a request the Params schema cannot refuse (a time range backwards): fail here
            with RedeliveryHook().get_conn() as conn:
                found = summary(conn, params["group"])
            for item in found or [{"group": params["group"], "count": 0}]:
                print(f"DLQ summary: {json.dumps(item)}")
            return found

        dlq_summary() >> RedriveOperator(task_id="redrive")
    return dag


class RedriveOperator(BaseOperator):
    """Runs the redrive the DAG run's Params ask for (``redelivery.redrive.redrive``) under the run
    key ``dlq_redrive/<run id>``, so a retried or cleared task resumes its run. Marking the task
    failed stops it between batches (Airflow calls ``on_kill``, then kills the task 5 s later if it
    is still running; a batch is one transaction either way). Selections of at least the config's
    ``spark_threshold`` (no max) run as Spark tasks: in this task's Spark Connect session, or as a
    spark-submit of spark_jobs/dlq_redrive.py, as the ``redelivery_spark`` connection says."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._stop = threading.Event()
        self._spark_hook = None

    def execute(self, context) -> dict:
        check_run_conf(context)  # a misspelt key must never widen a redrive: fail before any move
        request = request_from(context["params"])
        run_key = f"dlq_redrive/{context['run_id']}"
        who = getattr(context["dag_run"], "triggering_user_name", None)
        hook = RedeliveryHook()
        url = hook.get_database_url()
        spark = None
        if not request.dry_run and request.max_messages is None:
            with hook.get_conn() as conn:
                selected = count(conn, request)
            if selected >= cached_config().spark_threshold:
                connection = spark_connection(SPARK_CONN_ID)
                if connection.conn_type == "spark":
                    return self._redrive_with_spark_submit(request, run_key, who, url)
                spark = connect_session(connection, "redelivery-dlq-redrive")
        try:
            return redrive(
                request,
                spark_threshold=cached_config().spark_threshold,
                run_key=run_key,
                triggered_by=who,
                url=url,
                log=self.log.info,
                spark=spark,
                should_stop=self._stop.is_set,
                wait=self._stop.wait,
            )
        finally:
            if spark is not None:
                spark.stop()

    def on_kill(self) -> None:
        self._stop.set()
        if self._spark_hook is not None:
            self._spark_hook.on_kill()

    def _redrive_with_spark_submit(
        self, request: RedriveRequest, run_key: str, who: str | None, url: str
    ) -> dict:
        """Record the request under its run key, submit spark_jobs/dlq_redrive.py with the key
        through the Spark provider, and return the run's audit record."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        open_run(request, run_key=run_key, triggered_by=who, url=url)  # the request stays out of argv
        env_vars, conf = submit_environment(spark_master(SPARK_CONN_ID), url)
        args = ["--run-key", run_key, "--spark-threshold", str(cached_config().spark_threshold)]
        self._spark_hook = SparkSubmitHook(
            conn_id=SPARK_CONN_ID,
            conf=conf,
            name="redelivery-dlq-redrive",
            env_vars=env_vars,
            application_args=args,
        )
        self._spark_hook.submit(REDRIVE_APPLICATION)
        with RedeliveryHook().get_conn() as conn:
            record = run_record(conn, run_key)
        if record["status"] != "success":
            raise RuntimeError(f"redrive {run_key!r} did not finish (status {record['status']})")
        return {**record, "engine": "spark-submit"}
