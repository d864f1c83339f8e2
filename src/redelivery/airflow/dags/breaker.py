"""The ``redelivery_breaker`` DAG: an operator opens or closes a subscription's circuit breaker
(issue 41) from Airflow's trigger form or its REST API, audited in ``breaker_transitions`` as
``airflow:<user who triggered the run>`` (and by Airflow as any trigger). No schedule."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from airflow.sdk import DAG, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from redelivery.airflow.dags.tiers import system_dag
from redelivery.airflow.hooks import RedeliveryHook
from redelivery.airflow.params import check_run_conf, params_of
from redelivery.client import Client
from redelivery.errors import RedeliveryError
from redelivery.rules.breaker import MAX_BREAKER_SECONDS
from redelivery.rules.names import NAME_REGEX

DAG_ID = "redelivery_breaker"
DOC = """
### Open or close a circuit breaker

**Open**: the subscription's consumers are handed nothing, the failures it counts are parked (no
reconsume time spent, never dead-lettered), due retries wait: for `seconds` (then half-open: a
probe), or, empty, held open until closed. **Close**: deliveries go on, parked retries are promoted
by their tier's next window. Each is recorded in the breaker's audit (`redelivery breaker history`,
the Dead letters page) as `airflow:<you>`, with the note.
"""


class BreakerRequest(BaseModel):
    """A run of ``redelivery_breaker``: which subscription, open or close, for how long, why."""

    model_config = ConfigDict(extra="forbid")

    topic: str = Field(pattern=f"^{NAME_REGEX}$", title="Topic", description="The subscription's topic.")
    group: str = Field(
        pattern=f"^{NAME_REGEX}$", title="Consumer group", description="The subscription's consumer group."
    )
    action: Literal["open", "close"] = Field(title="Action", description="Open or close its breaker.")
    seconds: float | None = Field(
        default=None,
        ge=1,
        le=MAX_BREAKER_SECONDS,
        title="Open for (seconds)",
        description="With open: this long, then half-open. Empty: held open until closed.",
    )
    note: str | None = Field(
        default=None, max_length=1000, title="Note", description="Why, for the audit. Empty: none."
    )

    @model_validator(mode="after")
    def _seconds_only_to_open(self) -> BreakerRequest:
        if self.action == "close" and self.seconds is not None:
            raise ValueError("seconds is for open: a close takes none")
        return self


def breaker_dag() -> DAG:
    with system_dag(
        DAG_ID,
        tag="dlq",
        retry_delay=timedelta(seconds=5),
        schedule=None,
        is_paused_upon_creation=False,  # an operator's hands: ready when the outage comes
        doc_md=DOC,
        params=params_of(BreakerRequest),
    ) as dag:
        # no retry: a retry after an error could open again a breaker an operator closed meanwhile
        @task(task_id="set_breaker", retries=0)
        def set_breaker() -> dict:
            context = get_current_context()
            try:  # a conf that is no request: one line, and no retry mends it
                check_run_conf(context)
                request = BreakerRequest.model_validate(dict(context["params"]))
            except ValidationError as exc:
                raise AirflowFailException("; ".join(
                    f"{'.'.join(map(str, e['loc'])) or 'conf'}: {e['msg']}" for e in exc.errors()
                )) from None  # fmt: skip
            except ValueError as exc:
                raise AirflowFailException(str(exc)) from None
            user = getattr(context["dag_run"], "triggering_user_name", None) or "unknown"
            with Client(RedeliveryHook().get_ready_url()) as client:
                try:
                    if request.action == "open":
                        done = client.open_breaker(
                            request.topic, request.group, seconds=request.seconds, by=f"airflow:{user}",
                            note=request.note,
                        )  # fmt: skip
                    else:
                        done = client.close_breaker(
                            request.topic, request.group, by=f"airflow:{user}", note=request.note
                        )
                except (RedeliveryError, ValueError) as exc:  # a wrong name: no retry mends it
                    raise AirflowFailException(str(exc)) from None
            print(f"breaker of {request.group} on {request.topic}: {done['from']} -> {done['to']}")
            return {**done, "open_until": None if done["open_until"] is None else str(done["open_until"])}

        set_breaker()
    return dag
