"""The pauses of a DAG, read from Airflow's audit log: when a tier's DAG was paused, by whom and
through what (the operator page's banners, ``redelivery.airflow.ui.page``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class PauseEvent:
    """A pause of a DAG found in Airflow's audit log: when (timezone-aware), by whom (None:
    unknown), and through what (e.g. "the CLI")."""

    at: datetime
    owner: str | None
    via: str


#: How many of a DAG's pause changes, and of bulk ones, the audit log is read for (newest first).
PAUSE_CHANGES_READ = 200
#: Airflow's audit-log events that pause or unpause DAGs, and through what.
PAUSE_EVENTS = {
    "patch_dag": "the Airflow UI or REST API",
    "patch_dags": "a bulk change in the Airflow UI or REST API",
    "cli_dag_pause": "the Airflow CLI",
    "cli_dag_unpause": "the Airflow CLI",
}


def pause_changes(session, dag_id: str) -> list[tuple]:
    """``dag_id``'s pauses and unpauses in Airflow's audit log, newest first: ``(when, paused,
    owner, via)``. Events: ``patch_dag`` (the UI's toggle, ``PATCH /api/v2/dags/{dag_id}``;
    ``is_paused`` in extra), ``patch_dags`` (a bulk ``PATCH /api/v2/dags``, no DAG id: its
    query's patterns in extra say which DAGs), ``cli_dag_pause`` / ``cli_dag_unpause``."""
    from airflow.models.log import Log
    from sqlalchemy import select

    columns = (
        select(Log.dttm, Log.event, Log.owner, Log.extra).order_by(Log.dttm.desc()).limit(PAUSE_CHANGES_READ)
    )
    own = columns.where(
        Log.dag_id == dag_id, Log.event.in_(["patch_dag", "cli_dag_pause", "cli_dag_unpause"])
    )
    bulk = columns.where(Log.event == "patch_dags")
    changes = []
    for at, event, owner, extra in [*session.execute(own).all(), *session.execute(bulk).all()]:
        paused = _pauses(event, _json(extra), dag_id)
        if paused is not None and at is not None:
            changes.append((at, paused, owner, PAUSE_EVENTS[event]))
    return sorted(changes, key=lambda change: change[0], reverse=True)


def _json(text: str | None) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _pauses(event: str, extra: dict, dag_id: str) -> bool | None:
    """True: the event paused ``dag_id``; False: unpaused it; None: it did neither."""
    if event in ("cli_dag_pause", "cli_dag_unpause"):
        return event == "cli_dag_pause"
    if "is_paused" not in extra or (event == "patch_dags" and not bulk_covers(extra, dag_id)):
        return None
    return str(extra["is_paused"]).lower() == "true"


def bulk_covers(query: dict, dag_id: str) -> bool:
    """Whether a bulk ``PATCH /api/v2/dags`` with these query parameters matched ``dag_id``, as
    Airflow 3.3 matches: ``dag_id_pattern`` a case-insensitive ``LIKE '%term%'`` (``~``: every
    DAG), ``dag_id_prefix_pattern`` a prefix (trailing non-alphanumerics dropped), ``|`` between
    alternatives, both when both are given, neither: no DAG. Its other filters (tags, owners,
    paused) are not checked: a bulk pause they narrowed may be counted."""
    pattern, prefix = query.get("dag_id_pattern"), query.get("dag_id_prefix_pattern")
    if pattern is None and prefix is None:
        return False
    if pattern is not None and not any(_like(term, dag_id) for term in _terms(pattern)):
        return False
    strip = lambda term: re.sub(r"[^0-9A-Za-z]+$", "", term)  # noqa: E731
    return prefix is None or any(dag_id.startswith(strip(term)) for term in _terms(prefix))


def _terms(value) -> list[str]:
    text = str(value)
    terms = [t.strip() for t in text.split("|") if t.strip()] if "|" in text else []
    return terms or [text]


def _like(term: str, text: str) -> bool:
    """``text ILIKE '%term%'`` (``~`` is ``%``)."""
    term = "%" if term == "~" else term
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in term)
    return re.search(regex, text, re.IGNORECASE | re.DOTALL) is not None
