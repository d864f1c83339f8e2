"""Refuse a bad trigger of a redelivery DAG at trigger time, every problem named.

Airflow 3.3's REST trigger (``POST /api/v2/dags/{dag_id}/dagRuns``, which the UI's trigger form
uses too) accepts conf keys no Param declares without a word, and reports only the first Param
its JSON schema refuses, with a dump of the schema. For an operator's redrive that is a hazard: a
misspelt ``max_mesages`` would move the whole DLQ. ``RefuseBadConf``, a root middleware of the
api-server (the plugin registers it), answers such a trigger of a DAG tagged ``redelivery`` with
HTTP 400 and one line per problem (``redelivery.airflow.params.conf_problems``), before Airflow
creates the run: nothing runs. It acts only for a caller Airflow's auth manager allows to trigger
the DAG (as Airflow's route decides after it); anything else, or anything it cannot read, goes on
to Airflow unchanged, which then answers as it always does. Each task checks its run's conf keys
again before its first move (``params.check_run_conf``): runs made elsewhere (``dag.test``, the
CLI) meet that check.
"""

from __future__ import annotations

import json
import logging
import re

from redelivery.airflow.params import conf_problems

log = logging.getLogger(__name__)
#: The tag of the DAGs this check guards.
TAG = "redelivery"
_TRIGGER = re.compile(r"/api/v2/dags/(?P<dag_id>[^/]+)/dagRuns/?$")
#: A trigger body larger than this is left to Airflow (bytes).
MAX_BODY_BYTES = 8 * 1024 * 1024


class RefuseBadConf:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        match = _TRIGGER.search(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        messages, body, more = [], b"", True
        while more and len(body) <= MAX_BODY_BYTES:  # the body, kept to be replayed to Airflow
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            more = message["type"] == "http.request" and message.get("more_body", False)

        async def replay():
            return messages.pop(0) if messages else await receive()

        problems = None
        if len(body) <= MAX_BODY_BYTES:
            try:
                problems = await _problems(scope, match["dag_id"], body)
            except Exception:  # never in the way of Airflow's own answer
                log.exception("redelivery: the trigger check of %s failed; left to Airflow", match["dag_id"])
        if problems:
            return await _refuse(send, match["dag_id"], problems)
        return await self.app(scope, replay, send)


async def _problems(scope, dag_id: str, body: bytes) -> list[str] | None:
    """The conf's problems when the caller may trigger ``dag_id``, a DAG tagged redelivery (a
    refusal is written to Airflow's audit log, as Airflow's trigger route logs its own); None when
    the check does not apply."""
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request

    try:
        payload = json.loads(body or b"{}")
    except ValueError:
        return None  # Airflow answers a body that is not JSON
    conf = payload.get("conf") if isinstance(payload, dict) else None
    if conf is not None and not isinstance(conf, dict):
        return None
    user = await _trigger_user(Request(scope), dag_id)
    if user is None:
        return None
    return await run_in_threadpool(_checked, dag_id, conf, user)


async def _trigger_user(request, dag_id: str):
    """The request's user if Airflow's auth manager lets them trigger ``dag_id`` (as Airflow's
    trigger route decides: a bearer token first, then the UI's session), else None."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.api_fastapi.core_api import security

    header = request.headers.get("authorization", "")
    trusted = getattr(security, "USER_INJECTED_BY_TRUSTED_MIDDLEWARE", object())
    try:
        if header.lower().startswith("bearer "):
            user = await security.resolve_user_from_token(header[7:].strip())
        elif getattr(request.state, "user_authenticated_via", None) is trusted and request.state.user:
            user = request.state.user
        else:
            user = await security.resolve_user_from_token(request.cookies.get("_token"))
    except Exception:  # no valid credential: Airflow's answer (401 / 403)
        return None
    allowed = get_auth_manager().is_authorized_dag(
        method="POST", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id), user=user
    )
    return user if allowed else None


def _checked(dag_id: str, conf: dict | None, user) -> list[str] | None:
    """``conf_problems`` against the DAG's serialized Params; a refusal is audited."""
    from airflow.models.log import Log
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        dag = SerializedDagModel.get_dag(dag_id, session=session)
        if dag is None or TAG not in (dag.tags or ()):
            return None
        problems = conf_problems(dag.params, conf)
        if problems:
            name = user.get_name()
            extra = {"conf": conf, "method": "POST", "refused": problems}
            entry = Log(event="trigger_dag_run", owner=name, owner_display_name=name, extra=json.dumps(extra))
            entry.dag_id = dag_id
            session.add(entry)
        return problems


async def _refuse(send, dag_id: str, problems: list[str]) -> None:
    detail = f"the conf of {dag_id} is refused, nothing was triggered:\n" + "\n".join(problems)
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
