"""The operator's page in the Airflow UI (plugin ``redelivery``): a FastAPI app the api-server
mounts under /redelivery. ``GET /redelivery/dlq`` (the page), ``GET /redelivery/dlq.json``,
a group's dead letters ``GET /redelivery/dlq/messages`` (one of them ``/<id>``, the selection as
JSON Lines ``.jsonl``), ``POST /redelivery/dlq/messages/redrive`` (a redrive of the selection, a
dry run by default: the conf checked against the DAG's Params, Airflow's trigger permission, same
origin only, audited), ``GET /redelivery/dlq/runs/<run id>`` and ``GET /redelivery/metrics``.
``POST /redelivery/dlq/redrive``, the page's old dry-run form, answers 410 with the way to the
list for one release (``dry_run_form_gone``). Every route needs Airflow's permission to read the
dlq_redrive DAG. Routes, access and the audit of refusals in detail: docs/operator-page.md. A
state store that cannot serve (no connection, unreachable, the password refused, never migrated)
is answered 503 with what is wrong and where to fix it, one line each (``StoreUnavailable``), the
metrics 200 with ``redelivery_up 0``.
"""

from __future__ import annotations

import json
import logging
from html import escape
from typing import Annotated
from urllib.parse import quote, urlsplit

import psycopg
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.configuration import conf
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from redelivery.airflow.hooks import RedeliveryHook
from redelivery.airflow.params import conf_problems
from redelivery.airflow.ui.dead_letter_pages import (
    DOWNLOAD_ROWS,
    SELECTION_FIELDS,
    BadQuery,
    list_page,
    message_page,
    parse_query,
    posted_conf,
    problems_page,
    redrive_conf,
    selection_filter,
)
from redelivery.airflow.ui.outage import held_banners, outage_data, outage_sections
from redelivery.airflow.ui.page import (
    REDRIVE_DAG,
    STYLE,
    PauseEvent,
    page_data,
    pause_changes,
    render,
    run_url,
    tier_dags,
)
from redelivery.config import cached_config
from redelivery.dead_letters import MAX_MESSAGE_ID, DlqFilter, browse, export, message, summary
from redelivery.errors import UnknownGroupError, UnknownTopicError
from redelivery.fields import query_string
from redelivery.metrics import CONTENT_TYPE, STATEMENT_TIMED_OUT, render_unavailable, unavailable
from redelivery.metrics import render as render_metrics
from redelivery.settings import get_settings
from redelivery.store.db import check_schema, connect, read_url

#: Airflow's audit-log event of a refused read, per route (a refused POST of the selection is
#: ``trigger_dag_run``; any other route's, ``get_redelivery_page``).
READ_EVENTS = {
    "dead_letters_page": "get_dead_letters_page",
    "dead_letters_json": "get_dead_letters_json",
    "triggered": "get_dry_run_triggered",
    "metrics": "get_redelivery_metrics",
}
logger = logging.getLogger(__name__)
_may_read = requires_access_dag("GET", param_dag_id=REDRIVE_DAG)
_may_trigger = requires_access_dag("POST", DagAccessEntity.RUN, param_dag_id=REDRIVE_DAG)


class Refused(HTTPException):
    """A refused POST of the selection form, answered with the refusal page (``_refused``)."""

    def __init__(self, status_code: int, problems: list[str], dry_run: bool = True):
        super().__init__(status_code, "; ".join(problems))
        self.problems, self.dry_run = problems, dry_run


async def require_read_access(request: Request, user: GetUserDep) -> None:
    """Every route's check: Airflow's permission to read dlq_redrive. A refusal is written to
    Airflow's audit log, in a session of its own, before it is answered: a read as its
    ``READ_EVENTS`` event (the old form's POST too: it triggers nothing), a POST of the selection
    form as its trigger (``_refuse_post``). Raises HTTPException (403) when refused (``Refused`` for
    the selection's POST), or what Airflow's check raises."""
    try:
        await run_in_threadpool(_may_read, request, user)
    except HTTPException as exc:
        if exc.status_code != 403:
            raise
        refused = f"{_name(user)} may not read {REDRIVE_DAG} (Airflow: {exc.detail})"
        if _endpoint(request) == "redrive_selection":
            await _refuse_post(request, user, refused)
        await run_in_threadpool(_audit_read_now, user, request, [refused])
        raise


async def require_trigger_access(request: Request, user: GetUserDep) -> None:
    """The selection form's POST check, before its values are checked: its origin
    (``origin_refusal``) and the user's permission to trigger dlq_redrive (``trigger_refusal``); a
    refusal is audited as ``_refuse_post`` says. Raises ``Refused`` (403), or what Airflow's check raises."""
    refusal = origin_refusal(request) or await run_in_threadpool(trigger_refusal, request, user)
    if refusal:
        await _refuse_post(request, user, refusal)


async def _refuse_post(request: Request, user, refusal: str) -> None:
    """Write a refused POST of the selection form to Airflow's audit log as its trigger
    (``_audit``: the conf it posted as far as it can be read, ``posted_conf``, and ``refusal``),
    committed now in a session of its own (the request's rolls back), then raise ``Refused``
    (403)."""
    form = await request.form()  # parsed once: the route reads the same
    conf_ = posted_conf((k, str(v)) for k, v in form.multi_items())
    await run_in_threadpool(_audit_now, user, conf_, [refusal], request.url.path)
    raise Refused(403, [refusal], dry_run=conf_.get("dry_run", True) is not False)


def _endpoint(request: Request) -> str:
    """The name of the route function a request was routed to ('' before routing)."""
    return getattr(request.scope.get("endpoint"), "__name__", "")


app = FastAPI(
    title="redelivery",
    docs_url=None,
    redoc_url=None,
    dependencies=[Depends(require_read_access)],
)
#: The longest refusal line shown (a refused value is quoted in it).
MESSAGE_CHARS = 300
#: The longest group filter taken (names have at most 56 characters: a longer one matches none).
FILTER_CHARS = 1000


def _base_url() -> str:
    """``[api] base_url`` (empty when not set)."""
    return conf.get("api", "base_url", fallback="") or ""


def _ui_root() -> str:
    """The Airflow UI's root path, with a trailing slash ("/" unless base_url has a path)."""
    path = urlsplit(_base_url()).path or "/"
    return path if path.endswith("/") else path + "/"


def _origin(url: str | None) -> str | None:
    parts = urlsplit(url or "")
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else None


def origin_refusal(request: Request) -> str | None:
    """Why a request is refused when its ``Origin`` (else ``Referer``) is missing or another
    origin than this api-server's; None when it is its own."""
    sent = request.headers.get("origin")
    source = _origin(sent) if sent else _origin(request.headers.get("referer"))
    own = {_origin(str(request.url)), _origin(_base_url())} - {None}
    if source is None or source not in own:
        return f"a POST from origin {sent or source!r}, not this api-server's"
    return None


def trigger_refusal(request: Request, user) -> str | None:
    """Why ``user`` may not trigger dlq_redrive (Airflow's permission to create its runs, as its
    REST trigger endpoint requires), or None when it may. Raises HTTPException for anything
    Airflow's check answers other than a refusal (403)."""
    try:
        _may_trigger(request, user)
    except HTTPException as exc:
        if exc.status_code != 403:
            raise
        return f"{_name(user)} may not trigger {REDRIVE_DAG} (Airflow: {exc.detail})"
    return None


class StoreUnavailable(Exception):
    """The state store cannot serve a request: ``problem`` (``redelivery.metrics.unavailable``'s
    line: unreachable, login refused, no such database, never migrated, no connection) and
    ``fix``, where to fix it (the connection's id, or REDELIVERY_DATABASE_URL)."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem, self.fix = problem, fix


def _where_to_fix(hook: RedeliveryHook) -> str:
    """The line saying where the state store the page uses is defined."""
    if hook.source == "REDELIVERY_DATABASE_URL":
        return "Where to fix it: REDELIVERY_DATABASE_URL in the api-server's environment (it wins)."
    env = f"AIRFLOW_CONN_{hook.redelivery_conn_id.upper()}"
    return f"Where to fix it: {hook.source} (Admin > Connections, or {env} in Airflow's environment)."


def _conn() -> psycopg.Connection:
    """The state store for one request, its schema checked (``check_schema``), in one read-only
    snapshot (the charts, the counts and the tables agree). Raises ``StoreUnavailable``."""
    hook = RedeliveryHook()
    try:  # its statements cancelled after REDELIVERY_READ_TIMEOUT: a read-only surface
        conn = connect(read_url(hook.get_database_url()))
        try:
            check_schema(conn)
            conn.rollback()
        except BaseException:
            conn.close()
            raise
    except Exception as exc:
        problem = unavailable(exc)
        if problem is None:
            raise
        raise StoreUnavailable(problem, _where_to_fix(hook)) from exc
    conn.isolation_level, conn.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True
    return conn


@app.exception_handler(psycopg.OperationalError)
async def read_cut_short(request: Request, exc: psycopg.OperationalError) -> Response:
    """A read cut short (REDELIVERY_READ_TIMEOUT, the server gone): ``store_unavailable``'s 503."""
    if (problem := unavailable(exc)) is None:
        raise exc  # another error of the database: 500
    seconds = get_settings().read_timeout
    timed_out = f"Where to fix it: REDELIVERY_READ_TIMEOUT ({seconds:g} s) in Airflow's environment."
    fix = timed_out if problem.startswith(STATEMENT_TIMED_OUT) else _where_to_fix(RedeliveryHook())
    return await store_unavailable(request, StoreUnavailable(problem, fix))


@app.exception_handler(StoreUnavailable)
async def store_unavailable(request: Request, exc: StoreUnavailable) -> Response:
    """503 saying what is wrong and where to fix it, one line each (JSON for ``/dlq.json``);
    nothing was read or changed. Logged in the api-server's log."""
    logger.warning(
        "redelivery %s: the state store cannot serve: %s %s", request.url.path, exc.problem, exc.fix
    )
    if _endpoint(request) == "dead_letters_json":
        return JSONResponse({"detail": exc.problem, "fix": exc.fix}, status_code=503)
    lines = f"<ul class='refused'><li>{escape(exc.problem)}</li><li>{escape(exc.fix)}</li></ul>"
    note = "<p class='muted'>Nothing was read or changed.</p>"
    return _small_page("Dead letters: the state store cannot serve", lines + note, 503)


@app.get("/dlq", response_class=HTMLResponse)
def dead_letters_page(session: SessionDep, group: Annotated[str, Query(max_length=FILTER_CHARS)] = "") -> str:
    """The page; ``group``: list only groups whose name contains it (case-insensitive)."""
    pauses = {tier: pause_since(session, dag) for tier, dag in paused_tier_dags(session).items()}
    with _conn() as conn:
        data = page_data(conn, group, paused_tiers=list(pauses))
        outage = outage_data(conn)
    root = _ui_root()
    return render(data, root, pauses, held_banners(outage, root), outage_sections(outage, root))


def tier_pauses(session) -> dict[str, bool]:
    """``{tier: whether Airflow has its DAG paused}`` (``dag.is_paused`` through ``session``, a
    session of Airflow's metadata database) for each tier of the config whose DAG Airflow has
    registered."""
    from airflow.models.dag import DagModel
    from sqlalchemy import select

    dags = tier_dags()
    known = select(DagModel.dag_id, DagModel.is_paused).where(DagModel.dag_id.in_(list(dags.values())))
    paused = dict(session.execute(known).all())
    return {tier: bool(paused[dag]) for tier, dag in dags.items() if dag in paused}


def paused_tier_dags(session) -> dict[str, str]:
    """``{tier: its DAG id}`` of the tiers whose DAG Airflow has paused."""
    dags = tier_dags()
    return {tier: dags[tier] for tier, paused in tier_pauses(session).items() if paused}


def pause_since(session, dag_id: str) -> PauseEvent | None:
    """When ``dag_id`` was paused, from Airflow's audit log (table ``log``; Airflow keeps no time
    of a pause): the first pause after its latest unpause, so a repeated pause does not move it.
    None when the log has no pause since the latest unpause (paused at creation, by Airflow
    itself, or the entries are gone)."""
    since = None
    for at, paused, owner, via in pause_changes(session, dag_id):
        if not paused:
            break
        since = PauseEvent(at, owner, via)
    return since


@app.get("/dlq.json")
def dead_letters_json() -> list:
    with _conn() as conn:
        return summary(conn)


def one_line(detail) -> str:
    """The first line of an error (JSON schema errors go on with the schema), the keyword that
    failed appended, at most ``MESSAGE_CHARS`` characters (the middle cut out)."""
    lines = [line.strip() for line in str(detail).strip().splitlines() if line.strip()]
    text = lines[0] if lines else "refused"
    failed = next((line for line in lines if line.startswith("Failed validating")), None)
    if failed:
        text += f" ({failed.split(' in ')[0].removeprefix('Failed validating ').strip()} failed)"
    if len(text) > MESSAGE_CHARS:
        half = MESSAGE_CHARS // 2 - 2
        text = f"{text[:half]} … {text[-half:]}"
    return text


def _small_page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>{body}</body></html>",
        status_code=status,
    )


def _refused(request: Request, status: int, problems: list[str], dry_run: bool = True) -> HTMLResponse:
    """The answer to a refused post: every problem on a line of its own."""
    back = escape(request.url_for("dead_letters_page").path)  # in the UI's frame when posted from it
    lines = "".join(f"<li>{escape(problem)}</li>" for problem in problems)
    which = "dry run" if dry_run else "real run"
    return _small_page(
        "Redrive refused",
        f"<p>The {which} of {REDRIVE_DAG} was refused:</p><ul class='refused'>{lines}</ul>"
        "<p class='muted'>Nothing was triggered.</p>"
        f"<p><a href='{back}'>Back to Dead letters</a></p>",
        status,
    )


def run_page(run_id: str) -> str:
    """The path of a dlq_redrive run's page in the Airflow UI."""
    return run_url(_ui_root(), REDRIVE_DAG, run_id)


@app.exception_handler(Refused)
async def refusal_page(request: Request, exc: Refused) -> HTMLResponse:
    return _refused(request, exc.status_code, exc.problems, exc.dry_run)


#: The answer of ``POST /redelivery/dlq/redrive``, the page's old dry-run form (docs/changelog.md).
FORM_GONE = (
    "the dry-run form moved: open {list}, choose the messages, and redrive them (a dry run by default)"
)


@app.post("/dlq/redrive", response_class=HTMLResponse, name="dry_run_form_gone")
async def dry_run_form_gone(request: Request) -> HTMLResponse:
    """The page's old dry-run form, gone: 410 with the way to the list that replaced it, the
    filter it posted (group, reason, error contains) filled in when the filter takes it. Triggers
    and writes nothing; kept one release (docs/changelog.md)."""
    form = await request.form()
    posted = {name: str(form.get(name) or "") for name in ("group", "reasons", "error_contains")}
    path = request.url_for("dead_letter_list").path
    try:
        posted["reasons"] = [posted["reasons"]] if posted["reasons"] else []
        address = escape(f"{path}?{query_string(DlqFilter(**posted))}")
        way = f"<a href='{address}'>{address}</a>"
    except ValueError:  # none posted, or one the filter refuses: the address's form only
        way = escape(f"{path}?group=...")
    hint = FORM_GONE.format(list=way)
    return _small_page("Dry-run form moved", f"<p class='gone'>{hint}</p>", 410)


def trigger_redrive(request: Request, user, session, conf_: dict) -> Response:
    """Trigger dlq_redrive with ``conf_`` for ``user`` (whose origin and permission were checked):
    the conf checked against the DAG's Params first, every refused value a line (400, nothing
    triggered), then Airflow's own REST trigger function; audited either way (``_audit``). 303 to
    the run's page for a top-level page, else to ``triggered``."""
    # Airflow's REST trigger endpoint itself (Params validated by their JSON schema, run created in
    # this request's session, triggered by this user), imported here: plugins load in every
    # Airflow process, the REST routes matter in the api-server only.
    from airflow.api_fastapi.common.dagbag import create_dag_bag, get_latest_version_of_dag
    from airflow.api_fastapi.core_api.datamodels.dag_run import TriggerDAGRunPostBody
    from airflow.api_fastapi.core_api.routes.public.dag_run import trigger_dag_run

    if getattr(app.state, "dag_bag", None) is None:  # the api-server's own is on its root app
        app.state.dag_bag = create_dag_bag()
    status, run_id, via = 400, None, request.url.path
    try:
        # every refused value at once, one line each (Airflow's trigger stops at the first)
        dag = get_latest_version_of_dag(app.state.dag_bag, REDRIVE_DAG, session)
        problems = [one_line(problem) for problem in conf_problems(dag.params, conf_)]
        if not problems:
            body = TriggerDAGRunPostBody(logical_date=None, conf=conf_)
            run_id = trigger_dag_run(REDRIVE_DAG, body, app.state.dag_bag, user, session, request).run_id
    except HTTPException as exc:  # no such DAG, or a refusal the check above did not foresee
        status, problems = exc.status_code, [one_line(exc.detail)]
    if problems:
        session.rollback()  # nothing of a refused run may be committed by the session's teardown
        _audit(session, user, conf_, refused=problems, via=via)
        return _refused(request, status, problems, dry_run=conf_.get("dry_run", True))
    _audit(session, user, conf_, run_id=run_id, via=via)
    if request.headers.get("sec-fetch-dest") == "document":  # a top-level page: straight to the run
        return RedirectResponse(run_page(run_id), status_code=303)
    after = request.url_for("triggered", run_id=quote(run_id, safe="")).path
    return RedirectResponse(after + ("" if conf_.get("dry_run", True) else "?real=true"), status_code=303)


def _name(user) -> str:
    return user.get_name() if user else "anonymous"


def _log(session, user, event: str, extra: dict, run_id: str | None = None) -> None:
    """An entry of dlq_redrive in Airflow's audit log (Browse > Audit Log, ``/api/v2/eventLogs``),
    added to ``session``, the user as owner."""
    from airflow.models.log import Log

    name = _name(user)
    log = Log(event=event, owner=name, owner_display_name=name, extra=json.dumps(extra))
    log.dag_id, log.run_id = REDRIVE_DAG, run_id
    session.add(log)


def _audit(
    session, user, conf_: dict, run_id: str | None = None, refused: list[str] | None = None, via: str = ""
) -> None:
    """The audit-log entry of a trigger from the page, as Airflow's own REST trigger writes one
    (event ``trigger_dag_run``, the user as owner; ``via``: the path posted to): committed with the
    run by the request's session, or alone for a refused one."""
    extra = {"conf": conf_, "method": "POST", "via": via}
    if refused:
        extra["refused"] = refused
    _log(session, user, "trigger_dag_run", extra, run_id)


def _audit_now(user, conf_: dict, refused: list[str], via: str) -> None:
    """``_audit`` of a refused trigger, committed now in a session of its own."""
    from airflow.utils.session import create_session

    with create_session(scoped=False) as session:
        _audit(session, user, conf_, refused=refused, via=via)


def _audit_read_now(user, request: Request, refused: list[str]) -> None:
    """The audit-log entry of a refused read (event ``READ_EVENTS[route]``, the path in extra),
    committed now in a session of its own."""
    from airflow.utils.session import create_session

    endpoint = getattr(request.scope.get("endpoint"), "__name__", "")
    event = READ_EVENTS.get(endpoint, "get_redelivery_page")
    extra = {"method": request.method, "via": request.url.path, "refused": refused}
    with create_session(scoped=False) as session:
        _log(session, user, event, extra)


# Goes to the run once, after the frame's load (the UI has then mirrored the frame's address in its
# own: going back returns here, and must not bounce to the run again), and on a click of the link.
GO_TO_RUN = """<script>(function () {
  var url = %s, key = "redelivery-opened:" + url;
  function go() {
    if (window.top === window) { location.assign(url); return; }
    var a = window.top.document.createElement("a");
    a.href = url;
    window.top.document.body.appendChild(a);
    a.click();
  }
  document.getElementById("run").addEventListener("click", function (e) { e.preventDefault(); go(); });
  window.addEventListener("load", function () {
    if (sessionStorage.getItem(key)) return;
    sessionStorage.setItem(key, "1");
    setTimeout(go, 0);
  });
})();</script>"""


@app.get("/dlq/runs/{run_id}", response_class=HTMLResponse, name="triggered")
def triggered(run_id: str, real: bool = False) -> HTMLResponse:
    """The page after a form: the run's id and a link to its page; a script goes there.
    ``real``: the run moves (else a dry run)."""
    url = run_page(run_id)
    script = GO_TO_RUN % json.dumps(url).replace("<", "\\u003c")  # JSON inside <script>: no "</" possible
    kind = "a real run: it moves the dead letters back" if real else "a dry run: nothing moves"
    return _small_page(
        "Redrive triggered" if real else "Dry run triggered",
        f"<p class='triggered'>dlq_redrive run <b>{escape(run_id)}</b> ({kind}).</p>"
        f"<p>Open <a id='run' href='{escape(url)}' target='_top'>its page in the Airflow UI</a>.</p>{script}",
    )


@app.get("/metrics")
def metrics(session: SessionDep) -> Response:
    """The Prometheus metrics, read from the state store now (text exposition format), and each
    tier's ``redelivery_tier_paused`` from Airflow's metadata database (``tier_pauses``). A state
    store that cannot serve: 200 with ``redelivery_up 0`` (``render_unavailable``)."""
    paused = tier_pauses(session)
    retention = cached_config().retention.seconds("messages")
    try:
        conn = _conn()
    except StoreUnavailable as exc:  # as Prometheus exporters answer for a target that is down
        logger.warning("redelivery metrics: the state store cannot serve: %s %s", exc.problem, exc.fix)
        return Response(
            render_unavailable(f"{exc.problem} {exc.fix}", tier_paused=paused), media_type=CONTENT_TYPE
        )
    with conn:
        try:
            text = render_metrics(conn, tier_paused=paused, retention_seconds=retention)
        except psycopg.OperationalError as exc:  # a read cut short: REDELIVERY_READ_TIMEOUT
            if unavailable(exc) is None:
                raise
            text = render_unavailable(unavailable(exc), tier_paused=paused)
        return Response(text, media_type=CONTENT_TYPE)


# ---- the dead letters themselves (HTML: redelivery.airflow.ui.dead_letter_pages) ------------------


def _bad(title: str, problems: list[str], status: int = 400) -> HTMLResponse:
    return HTMLResponse(problems_page(title, problems), status_code=status)


@app.get("/dlq/messages", response_class=HTMLResponse, name="dead_letter_list")
def dead_letter_list(request: Request, user: GetUserDep) -> HTMLResponse:
    """A page of a group's dead letters, newest first, under the filter in the address
    (``dead_letter_pages``); 400 listing every refused name or value."""
    try:
        query = parse_query(request.query_params.multi_items(), ("after",))
        with _conn() as conn:
            rows, after = browse(conn, query.filter, after=query.after)
    except BadQuery as exc:
        return _bad("Dead letters: refused", exc.problems)
    except (UnknownGroupError, UnknownTopicError) as exc:
        return _bad("Dead letters: refused", [str(exc)])
    base, overview = request.url_for("dead_letter_list").path, request.url_for("dead_letters_page").path
    return HTMLResponse(list_page(query, rows, after, base, overview, trigger_refusal(request, user)))


@app.get("/dlq/messages.jsonl", name="dead_letter_download", response_model=None)
def dead_letter_download(request: Request) -> Response:
    """The selection (the ticked ids, or all matching the filter) as JSON Lines: the rows
    ``redelivery dlq list --json`` prints (``dead_letters.json_line``: a JSON body as stored, every
    number as written), oldest first, at most ``DOWNLOAD_ROWS``, streamed."""
    try:
        chosen = selection_filter(parse_query(request.query_params.multi_items(), SELECTION_FIELDS))
    except BadQuery as exc:
        return _bad("Download refused", exc.problems)
    conn = _conn()
    rows = export(conn, chosen, DOWNLOAD_ROWS)
    try:
        first = next(rows, None)  # an unknown group or topic is refused before any byte is sent
    except BaseException as exc:
        conn.close()
        if isinstance(exc, UnknownGroupError | UnknownTopicError):
            return _bad("Download refused", [str(exc)])
        raise

    def lines():
        with conn:
            for line in [first] if first is not None else []:
                yield line + "\n"
            for line in rows:
                yield line + "\n"

    name = f"dead-letters-{chosen.group}.jsonl".replace("%", "_")
    return StreamingResponse(
        lines(),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@app.get("/dlq/messages/{message_id}", response_class=HTMLResponse, name="dead_letter_message")
def dead_letter_message(
    request: Request, user: GetUserDep, message_id: Annotated[int, Path(ge=1, le=MAX_MESSAGE_ID)]
) -> HTMLResponse:
    """One dead letter of the address's group in full; 404 when the group has no such dead letter."""
    try:
        query = parse_query(request.query_params.multi_items())
        with _conn() as conn:
            letter = message(conn, query.filter.group, message_id)
    except BadQuery as exc:
        return _bad("Dead letter: refused", exc.problems)
    except UnknownGroupError as exc:
        return _bad("Dead letter: refused", [str(exc)])
    if letter is None:
        problem = f"group {query.filter.group!r} has no dead letter {message_id} (never, or redriven since)"
        return _bad("No such dead letter", [problem], 404)
    base = request.url_for("dead_letter_list").path
    return HTMLResponse(message_page(letter, query, base, _ui_root(), trigger_refusal(request, user)))


@app.post("/dlq/messages/redrive", dependencies=[Depends(require_trigger_access)], response_model=None)
async def redrive_selection(request: Request, user: GetUserDep, session: SessionDep) -> Response:
    """Trigger dlq_redrive for the list's selection (``dead_letter_pages.redrive_conf``: the ticked
    ids or the filter, dry run or real), with the origin and permission checks, the Params check
    and the audit of ``trigger_redrive``; a selection the filter refuses: 400, audited, nothing
    triggered."""
    form = await request.form()
    try:
        conf_ = redrive_conf(parse_query([(k, str(v)) for k, v in form.multi_items()], SELECTION_FIELDS))
    except BadQuery as exc:
        conf_ = posted_conf((k, str(v)) for k, v in form.multi_items())
        await run_in_threadpool(_audit_now, user, conf_, exc.problems, request.url.path)
        return _refused(request, 400, exc.problems, dry_run=conf_.get("dry_run", True) is not False)
    return await run_in_threadpool(trigger_redrive, request, user, session, conf_)
