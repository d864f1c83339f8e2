"""What redelivery's own DAGs leave in the user's Airflow, kept ``retention.airflow_runs`` (default
7 days) and then deleted by ``redelivery_maintenance``'s task ``airflow_retention`` (hourly),
through Airflow's own interfaces, never by writing to its tables:

- the finished runs (success or failed) of the tier DAGs and of ``redelivery_maintenance`` that
  ended before the cut-off, but each DAG's newest scheduled run (Airflow schedules the next from
  it, as ``airflow db clean`` knows: ``newest_automated_run``), through Airflow's REST API (``DELETE
  /api/v2/dags/{dag_id}/dagRuns/{dag_run_id}``, with the official client ``apache-airflow-client``):
  Airflow deletes their task instances, task-instance history, XComs and rendered fields with them
  (foreign keys ``ON DELETE CASCADE``). Never a run that is not finished, never another DAG's;
- the task-log folders of those DAGs' runs (``<base_log_folder>/dag_id=<dag>/run_id=<run>``, the
  default ``log_filename_template``) on the local disk of the worker that runs the task, once every
  file in one is older than the cut-off. With another template nothing is deleted (the task says
  so); logs on other workers' disks, or in remote storage, are the deployment's to expire (the Helm
  chart's log groomer, a bucket's lifecycle rule).

Why not ``airflow db clean --dag-ids``: Airflow 3 runs a task with its metadata database blocked
(the task SDK's supervisor points ``sql_alchemy_conn`` of the task's process, and so of any
command it starts, at ``airflow-db-not-allowed:///``), so a task cannot run it; the REST API is the
interface Airflow gives tasks. What stays: Airflow's audit log (table ``log``: about 3 rows a DAG
run, the deletion's own among them), which Airflow's ``airflow db clean --tables log`` keeps.

The API is reached with the Airflow connection ``redelivery_airflow_api`` when it exists (type
http: host the API server's base URL, e.g. ``http://airflow-api-server:8080``; login and password
of a user allowed to delete those DAGs' runs, exchanged at ``/auth/token``; or a token in the
extra, ``{"token": "..."}``), else at the API server the worker already talks to (``[api]
base_url``, or the base of ``[core] execution_api_server_url``) without credentials, which
Airflow's simple auth manager with ``simple_auth_manager_all_admins`` accepts.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from redelivery.config import RedeliveryConfig
from redelivery.errors import ConfigError

#: The connection of Airflow's REST API (module docstring).
API_CONN_ID = "redelivery_airflow_api"
#: The DAG runs listed per API call.
PAGE = 100
#: The log layout this module knows: Airflow's default ``log_filename_template`` starts so.
DEFAULT_LOG_LAYOUT = re.compile(r"^dag_id=\{\{\s*ti\.dag_id\s*\}\}/run_id=\{\{\s*ti\.run_id\s*\}\}/")
#: Seconds an API call may take.
API_TIMEOUT = 30


@dataclass(frozen=True)
class ApiAccess:
    """Where and how to call Airflow's REST API: ``base_url`` (no ``/api/v2``), a bearer ``token``
    or None, and ``source``, what it came from (said in the task's log)."""

    base_url: str
    token: str | None
    source: str


def own_dag_ids(config: RedeliveryConfig) -> list[str]:
    """The DAGs whose runs this retention deletes: every tier DAG, ``redelivery_maintenance`` and
    ``redelivery_standing_redrives`` (not ``dlq_redrive``: its runs are an operator's actions, kept
    with their audit)."""
    return [f"redelivery_tier_{tier.name}" for tier in config.tiers] + [
        "redelivery_maintenance",
        "redelivery_standing_redrives",
    ]


def api_access(conn_id: str = API_CONN_ID) -> ApiAccess:
    """How to reach the REST API (module docstring). Raises ``ConfigError`` naming the connection
    when its host is empty or ``/auth/token`` refuses its login."""
    from airflow.exceptions import AirflowNotFoundException
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return ApiAccess(_own_api_server(), None, "the worker's API server, no credentials")
    host = (conn.host or "").strip().rstrip("/")
    if not host:
        raise ConfigError(f"Airflow connection {conn_id!r} has no host: give it the API server's base URL")
    base = host if "://" in host else f"{conn.schema or 'http'}://{host}"
    if conn.port and "://" not in host:
        base += f":{conn.port}"
    token = (conn.extra_dejson or {}).get("token")
    if token is None and conn.login:
        token = _login(base, conn.login, conn.password or "", conn_id)
    return ApiAccess(base, token, f"connection {conn_id!r}")


def _own_api_server() -> str:
    from airflow.sdk import conf

    base = conf.get("api", "base_url", fallback=None)
    if not base:
        execution = conf.get("core", "execution_api_server_url", fallback=None) or ""
        base = execution.split("/execution", 1)[0] or "http://localhost:8080"
    return base.rstrip("/")


def _login(base: str, login: str, password: str, conn_id: str) -> str:
    import requests

    answer = requests.post(
        f"{base}/auth/token", json={"username": login, "password": password}, timeout=API_TIMEOUT
    )
    if answer.status_code not in (200, 201):
        raise ConfigError(
            f"Airflow's API refused the login of connection {conn_id!r} ({answer.status_code}): "
            "give it a user allowed to delete the runs of redelivery's DAGs"
        )
    return answer.json()["access_token"]


def expired_runs(api, dag_id: str, cutoff: datetime, keep: str | None = None) -> list[str]:
    """The run ids of ``dag_id``'s finished runs (success, failed) that ended before ``cutoff``,
    oldest first (``api``: an ``airflow_client.client.DagRunApi``), but the run ``keep``."""
    return [run_id for run_id in _finished_before(api, dag_id, cutoff) if run_id != keep]


def newest_automated_run(api, dag_id: str) -> str | None:
    """The run id of ``dag_id``'s scheduled or backfill run with the latest logical date, or None.
    Airflow's DAG processor computes a DAG's next run from it at every parse
    (``airflow.dag_processing.collection``): deleted, a DAG with ``catchup=False`` is given a run at
    once (the hourly maintenance, its scheduled run deleted past a retention under an hour by a
    maintenance run triggered by hand, ran again minutes later). ``airflow db clean`` keeps a
    DAG's newest run that is not manual for the same reason (``keep_last`` of table ``dag_run``)."""
    page = api.get_dag_runs(
        dag_id,
        run_type=["scheduled", "backfill"],
        logical_date_gte=datetime(1970, 1, 1, tzinfo=UTC),  # as Airflow's max(): none without one
        order_by=["-logical_date"],
        limit=1,
        _request_timeout=API_TIMEOUT,
    )
    return page.dag_runs[0].dag_run_id if page.dag_runs else None


def _finished_before(api, dag_id: str, cutoff: datetime) -> list[str]:
    found: list[str] = []
    while True:
        page = api.get_dag_runs(
            dag_id,
            end_date_lt=cutoff,
            state=["success", "failed"],
            order_by=["end_date"],
            limit=PAGE,
            offset=len(found),
            _request_timeout=API_TIMEOUT,
        )
        found += [run.dag_run_id for run in page.dag_runs]
        if len(page.dag_runs) < PAGE:
            return found


def apply_airflow_retention(
    config: RedeliveryConfig,
    access: ApiAccess,
    log_folder: Path,
    log_template: str,
    now: datetime | None = None,
    log: Callable[[str], object] = print,
) -> dict:
    """Delete what ``own_dag_ids`` left that ended more than ``retention.airflow_runs`` before
    ``now`` (default: this machine's clock): their finished runs through the API at ``access``,
    then their task-log folders under ``log_folder`` (only for Airflow's default layout,
    ``log_template``); each DAG's newest scheduled run and its logs stay (``newest_automated_run``).
    Returns ``{"cutoff", "runs_deleted": {dag_id: n}, "log_folders_deleted", "log_bytes_freed"}``,
    or ``{"kept": True}`` when the setting is None. Raises ``ConfigError`` (one line, naming the
    connection) when the API refuses the calls."""
    seconds = config.retention.seconds("airflow_runs")
    if seconds is None:
        return {"kept": True}
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    deleted, kept = _delete_runs(access, own_dag_ids(config), cutoff)
    log(f"Airflow runs ended before {cutoff.isoformat()} deleted through {access.source}: {deleted}")
    if not DEFAULT_LOG_LAYOUT.match(log_template.strip()):
        log(f"task logs left alone: log_filename_template {log_template!r} is not Airflow's default layout")
        folders, freed = 0, 0
    else:
        folders, freed = delete_log_folders(log_folder, own_dag_ids(config), cutoff, kept)
        log(f"task-log folders older than {cutoff.isoformat()} deleted under {log_folder}: {folders}")
    return {
        "cutoff": cutoff.isoformat(),
        "runs_deleted": deleted,
        "log_folders_deleted": folders,
        "log_bytes_freed": freed,
    }


def _delete_runs(
    access: ApiAccess, dag_ids: list[str], cutoff: datetime
) -> tuple[dict[str, int], dict[str, str]]:
    """Runs deleted, by DAG; and the run kept of each DAG (``newest_automated_run``)."""
    import airflow_client.client as airflow_api
    from airflow_client.client.exceptions import ApiException, NotFoundException
    from urllib3.exceptions import HTTPError

    configuration = airflow_api.Configuration(host=access.base_url, access_token=access.token)
    deleted: dict[str, int] = {}
    kept: dict[str, str] = {}
    with airflow_api.ApiClient(configuration) as client:
        runs = airflow_api.DagRunApi(client)
        try:
            airflow_api.VersionApi(client).get_version(_request_timeout=API_TIMEOUT)  # is it Airflow's API?
            for dag_id in dag_ids:
                try:
                    if keep := newest_automated_run(runs, dag_id):
                        kept[dag_id] = keep
                    expired = expired_runs(runs, dag_id, cutoff, keep)
                except NotFoundException:  # a tier the DAG processor has not seen yet: nothing to delete
                    continue
                for run_id in expired:
                    try:
                        runs.delete_dag_run(dag_id, run_id, _request_timeout=API_TIMEOUT)
                    except NotFoundException:  # deleted meanwhile (another maintenance run)
                        continue
                deleted[dag_id] = len(expired)
        except ApiException as exc:
            raise ConfigError(_refusal(f"answered {exc.status} {exc.reason}", access)) from exc
        except HTTPError as exc:
            raise ConfigError(_refusal(f"cannot be reached ({type(exc).__name__})", access)) from exc
        except ValueError as exc:  # an answer that is not the API's (a page of the UI)
            raise ConfigError(_refusal("does not answer as Airflow's API", access)) from exc
    return deleted, kept


def _refusal(what: str, access: ApiAccess) -> str:
    return (
        f"Airflow's REST API at {access.base_url} {what} ({access.source}): define the connection "
        f"{API_CONN_ID!r} with a user allowed to delete the runs of redelivery's DAGs, or set "
        "retention.airflow_runs: null to keep them"
    )


def delete_log_folders(
    log_folder: Path, dag_ids: list[str], cutoff: datetime, kept: dict[str, str] | None = None
) -> tuple[int, int]:
    """Delete ``<log_folder>/dag_id=<dag>/run_id=*`` folders of ``dag_ids`` whose every file was
    last written before ``cutoff``, but the folder of each DAG's run in ``kept`` (``{dag_id:
    run_id}``: the run left in Airflow); returns (folders deleted, bytes freed)."""
    limit, folders, freed, kept = cutoff.timestamp(), 0, 0, kept or {}
    for dag_id in dag_ids:
        for run in sorted((log_folder / f"dag_id={dag_id}").glob("run_id=*")):
            if dag_id in kept and run.name == f"run_id={kept[dag_id]}":
                continue
            files = [p for p in run.rglob("*") if p.is_file()]
            if any(p.stat().st_mtime >= limit for p in files):
                continue
            size = sum(p.stat().st_size for p in files)
            shutil.rmtree(run, ignore_errors=True)
            if not run.exists():
                folders, freed = folders + 1, freed + size
    return folders, freed
