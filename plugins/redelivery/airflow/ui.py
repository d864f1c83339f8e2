"""The operator's page in the Airflow UI (plugin ``redelivery``): dead letters per group (count,
oldest, DLQs, top reasons and errors) and the latest tier and redrive runs. Served by the
api-server under /redelivery to users allowed to read the dlq_redrive DAG; the plugin adds it to
the navigation as "Dead letters"."""

from __future__ import annotations

from html import escape

from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse

from .. import statements as S
from ..dead_letters import summary
from .hooks import RedeliveryHook

# Same permission as reading the dlq_redrive DAG (Airflow's auth manager; the UI's session cookie
# reaches the page, which the UI shows in an iframe of the same origin).
app = FastAPI(
    title="redelivery",
    docs_url=None,
    redoc_url=None,
    dependencies=[Depends(requires_access_dag("GET", param_dag_id="dlq_redrive"))],
)

STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#1a202c}
table{border-collapse:collapse;margin:8px 0 24px}
td,th{border:1px solid #cbd5e0;padding:4px 10px;text-align:left;vertical-align:top}th{background:#edf2f7}
.n{text-align:right}h1{font-size:22px}h2{font-size:18px;margin-top:28px}.muted{color:#718096}"""


def _data() -> dict:
    with RedeliveryHook().get_conn() as conn:
        tiers = conn.execute(S.LATEST_TIER_RUNS).fetchall()
        redrives = conn.execute(S.LATEST_REDRIVES).fetchall()
        return {"groups": summary(conn), "tiers": tiers, "redrives": redrives}


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(v) if v is not None else '')}</td>" for v in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


@app.get("/dlq", response_class=HTMLResponse)
def dead_letters_page() -> str:
    data = _data()
    parts = [
        f"<!doctype html><html><head><title>Dead letters</title><style>{STYLE}</style></head><body>",
        "<h1>Dead letters</h1>",
    ]
    if not data["groups"]:
        parts.append("<p class='muted'>No dead letters.</p>")
    for group in data["groups"]:
        parts.append(
            f"<h2>Group {escape(group['group'])}: {group['count']} dead letters</h2>"
            f"<p class='muted'>oldest {escape(group['oldest'])}, newest {escape(group['newest'])}. "
            "Redrive them with the <b>dlq_redrive</b> DAG.</p>"
        )
        parts.append(
            _table(["dead-letter queue", "messages"], [[q["value"], q["count"]] for q in group["queues"]])
        )
        parts.append(
            _table(["top reasons", "messages"], [[r["value"], r["count"]] for r in group["top_reasons"]])
        )
        parts.append(
            _table(["top last errors", "messages"], [[e["value"], e["count"]] for e in group["top_errors"]])
        )
    parts.append("<h2>Latest tier runs</h2>")
    parts.append(
        _table(
            ["tier", "window end", "status", "promoted", "dead-lettered", "lateness p99 (s)"],
            [list(r) for r in data["tiers"]],
        )
    )
    parts.append("<h2>Latest redrives</h2>")
    parts.append(
        _table(
            ["run", "group", "triggered by", "dry run", "status", "selected", "moved", "started"],
            [list(r) for r in data["redrives"]],
        )
    )
    parts.append("</body></html>")
    return "".join(parts)


@app.get("/dlq.json")
def dead_letters_json() -> list:
    return _data()["groups"]
