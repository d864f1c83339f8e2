"""The ``redelivery_standing_redrives`` DAG: the standing redrive policies' ticks (issue 41), one
DAG run an hour whose task ticks every 30 seconds (``StandingRedriveOperator``); a manual run
ticks once."""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, DeltaTriggerTimetable

from redelivery.airflow.dags.tiers import BATCH_OVERRUN, system_dag
from redelivery.airflow.operators import STANDING_RUN_SPAN_SECONDS, StandingRedriveOperator

DOC = """
### Standing redrives

Each tick looks at every standing redrive policy (`standing_redrives:` of the config file, and those
added with `redelivery standing-redrive add`) and runs those that are due: after a breaker of their
group closed, or every `every`, never while a breaker of their group is open. A run is a redrive run
(`redrive_runs`, triggered by `standing:<name>`, the Dead letters page's latest redrives) of the
policy's dead letters whose redrive count is below its `max_generations` and whose generation's wait
has passed, at its `rate_limit`, at most `max_messages`. A policy whose brought-back messages die
again too often stops itself, with an ERROR line naming it; `redelivery standing-redrive resume`
starts it again. A run starts every hour and holds a worker slot for it; a manual run ticks once.
"""


def standing_dag() -> DAG:
    span = timedelta(seconds=STANDING_RUN_SPAN_SECONDS)
    with system_dag(
        "redelivery_standing_redrives",
        tag="dlq",
        retry_delay=timedelta(seconds=30),
        schedule=DeltaTriggerTimetable(span),
        # a manual run (one tick) need not wait for the hour's run: two ticks never run one policy
        max_active_runs=2,
        is_paused_upon_creation=False,  # a standing policy is a promise: it runs without a person
        doc_md=DOC,
    ) as dag:
        StandingRedriveOperator(task_id="tick", execution_timeout=span + BATCH_OVERRUN)
    return dag
