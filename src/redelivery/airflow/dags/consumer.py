"""A consumer DAG scheduled on its subscription's asset: deliver the group's READY messages to an
HTTP endpoint (``redelivery.airflow.http_delivery``) whenever there are new ones.

``http_consumer_dag(topic, group, conn_id)`` is scheduled on ``redelivery://<topic>/<group>``
with an ``AssetWatcher`` running ``ReadyMessagesTrigger`` in the triggerer, so a run starts when
messages are published, promoted by a tier run (which also emits an event for the asset) or
redriven. One run drains what is READY; events that arrive meanwhile start one more run after it
(one active run at a time). The watcher runs only while the DAG is unpaused.

The endpoint is the Airflow connection ``conn_id`` (type http): ``host`` (a host name, or a base
URL with its scheme), ``port``, ``schema`` the scheme when the host has none (default http), and
the path in the extra ``{"endpoint": "/in"}`` (default: the factory's ``endpoint``, ``/``). There
is no default connection: a run without it fails, saying how to define it.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, AssetWatcher, get_current_context, task
from pydantic import BaseModel, ConfigDict, Field

from redelivery.airflow.assets import asset_for
from redelivery.airflow.dags.tiers import system_dag
from redelivery.airflow.hooks import RedeliveryHook
from redelivery.airflow.http_delivery import HttpEndpoint, drain
from redelivery.airflow.params import check_run_conf, params_of
from redelivery.airflow.triggers import DEFAULT_POLL_SECONDS, ReadyMessagesTrigger
from redelivery.client import Client
from redelivery.messaging.leasing import MAX_INVISIBLE_SECONDS, MIN_INVISIBLE_SECONDS
from redelivery.messaging.waiting import MAX_WAIT_SECONDS


def endpoint_url(conn_id: str, endpoint: str = "/") -> str:
    """The URL of the http connection ``conn_id``: its path is the extra's ``endpoint``, else
    ``endpoint``. Raises ``RuntimeError`` saying how to define the connection when it is missing
    or has no host."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    example = (
        f'AIRFLOW_CONN_{conn_id.upper()}=\'{{"conn_type": "http", "host": "127.0.0.1", '
        f'"port": 8000, "extra": {{"endpoint": "{endpoint}"}}}}\''
    )
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as exc:
        raise RuntimeError(f"Airflow connection {conn_id!r} is missing: define it, e.g. {example}") from exc
    host = (conn.host or "").strip().rstrip("/")
    if not host:
        raise RuntimeError(f"Airflow connection {conn_id!r} has no host: define it, e.g. {example}")
    base = host if "://" in host else f"{conn.schema or 'http'}://{host}"
    if conn.port and "://" not in host:
        base += f":{conn.port}"
    endpoint = str((conn.extra_dejson or {}).get("endpoint") or endpoint)
    return f"{base}/{endpoint.lstrip('/')}"


class ConsumerRun(BaseModel):
    """What a run of a consumer DAG takes: its Params (``consumer_params``), the trigger form's
    fields. The lease is named as Airflow's SQS users know it, ``visibility_timeout`` (RocketMQ's
    invisible duration, ``Client.receive``'s ``invisible_duration``); the old Param name is taken
    for one release (``lease_seconds``)."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(
        100, ge=1, le=10_000, title="Batch size", description="Messages per lease and per HTTP request."
    )
    max_messages: int | None = Field(
        None,
        ge=1,
        title="Max messages",
        description="Stop after receiving this many. Empty: until nothing is READY "
        "(what is left waits for the next run).",
    )
    visibility_timeout: float = Field(
        60,
        ge=MIN_INVISIBLE_SECONDS,
        le=MAX_INVISIBLE_SECONDS,
        title="Visibility timeout (seconds)",
        description="How long each leased batch stays invisible to other consumers (SQS's visibility "
        "timeout, RocketMQ's invisible duration): a message not answered within it counts as a failed "
        "delivery.",
    )
    wait_seconds: float = Field(
        0,
        ge=0,
        le=MAX_WAIT_SECONDS,
        title="Wait (seconds)",
        description="Once nothing is READY, wait this long for a message before the run ends (a long "
        "poll, SQS's wait time: it returns as soon as one is published, promoted or redriven). 0: end "
        "at once.",
    )
    invisible_duration: float | None = Field(
        None,
        ge=MIN_INVISIBLE_SECONDS,
        le=MAX_INVISIBLE_SECONDS,
        title="Lease (seconds), old name",
        description="Renamed Visibility timeout; taken for one release, when set, with a hint in the "
        "task's log.",
    )


def consumer_params() -> dict:
    """The consumer DAG's Params, from ``ConsumerRun``'s fields (bounds, titles, defaults)."""
    return params_of(ConsumerRun)


def lease_seconds(run: ConsumerRun, log=print) -> float:
    """The lease of each batch, seconds: ``visibility_timeout``, or the old ``invisible_duration``
    when a run still sets it (``log`` gets the hint to rename it)."""
    if run.invisible_duration is None:
        return run.visibility_timeout
    log("the Param invisible_duration is now visibility_timeout: it is taken in this release, rename it")
    return run.invisible_duration


def http_consumer_dag(
    *,
    topic: str,
    group: str,
    conn_id: str,
    dag_id: str,
    endpoint: str = "/",
    body_field: str = "body",
    poll_interval: float = DEFAULT_POLL_SECONDS,
) -> DAG:
    """The DAG ``dag_id`` delivering ``group``'s messages of ``topic`` over HTTP, scheduled on the
    subscription's asset (its watcher, ``ReadyMessagesTrigger``). Raises ``InvalidNameError`` /
    ``ValueError`` for bad arguments.

    :param topic: the topic to consume.
    :param group: the consumer group it consumes as.
    :param conn_id: the Airflow HTTP connection the messages are posted to.
    :param dag_id: the DAG's id.
    :param endpoint: the path posted to, when the connection's extra names none.
    :param body_field: the JSON field each message's body goes under.
    :param poll_interval: seconds between the watcher's polls (0.1 to 3600).
    """
    watcher = AssetWatcher(
        name="redelivery_ready",
        trigger=ReadyMessagesTrigger(topic=topic, group=group, poll_interval=poll_interval),
    )
    doc = f"""
### Consumer of `{topic}` for group `{group}`

Scheduled on the asset `redelivery://{topic}/{group}`: a run starts when the watcher (trigger
`ReadyMessagesTrigger`, every {poll_interval:g} s) sees messages that became READY since its last
event, or when a tier run promoted some. The task leases batches, posts each to the endpoint of the
Airflow connection `{conn_id}` and acks, retries or rejects every message by the answer
(2xx: ack; 4xx other than 408/429: reject; anything else: retry), until nothing is READY.
"""
    with system_dag(
        dag_id,
        tag="consumer",
        retry_delay=timedelta(seconds=10),
        schedule=asset_for(topic, group, watchers=[watcher]),
        doc_md=doc,
        params=consumer_params(),
    ) as dag:

        @task(task_id="deliver")
        def deliver() -> dict:
            context = get_current_context()
            check_run_conf(context)
            for asset, events in (context.get("triggering_asset_events") or {}).items():
                for event in events:
                    print(f"started by an event of {asset}: {event.extra}")
            run = ConsumerRun(**{name: context["params"].get(name) for name in ConsumerRun.model_fields})
            target = HttpEndpoint(endpoint_url(conn_id, endpoint), body_field=body_field)
            with Client(RedeliveryHook().get_ready_url()) as client:  # a store that cannot serve: one line
                counts = drain(
                    client,
                    topic,
                    group,
                    target,
                    batch_size=run.batch_size,
                    max_messages=run.max_messages,
                    invisible_duration=lease_seconds(run),
                    wait_seconds=run.wait_seconds,
                )
            print(f"delivered to {target.url}: {counts}")
            return counts

        deliver()
    return dag
