"""The Dead letters page's outage parts (issue 41): a banner per breaker held open (until an
operator closes it), the breakers that are not closed, their audit (the latest transitions, with
their figures and who made them), and the standing redrives (their rule, what they brought back,
whether and why they stopped). An operator opens or closes a breaker with the
``redelivery_breaker`` DAG, linked from here (Airflow's trigger form: its permission and audit)."""

from __future__ import annotations

from html import escape
from urllib.parse import quote

import psycopg

from redelivery.airflow.ui.page import Html, link, table, when
from redelivery.messaging.breaking import breakers, history
from redelivery.standing import policies

#: The breaker transitions the page lists, newest first.
TRANSITIONS = 20
BREAKER_DAG = "redelivery_breaker"


def outage_data(conn: psycopg.Connection) -> dict:
    """``{"breakers": the breakers that are not closed (``messaging.breaking.breakers``' dicts),
    "transitions": the latest ``TRANSITIONS`` (``history``'s), "standing": every standing redrive
    (``standing.policies``' dicts)}``, read over ``conn`` in one transaction. Raises psycopg
    errors."""
    with conn.transaction():
        return {
            "breakers": [b for b in breakers(conn) if b["state"] != "closed"],
            "transitions": history(conn, limit=TRANSITIONS),
            "standing": policies(conn),
        }


def held_banners(data: dict, ui_root: str) -> list[str]:
    """An alert per breaker held open: its group's messages wait until an operator closes it."""
    dag = link(BREAKER_DAG, f"{ui_root}dags/{quote(BREAKER_DAG, safe='')}")
    return [
        f'<div class="paused" role="alert" data-breaker="{escape(b["topic"])}/{escape(b["group"])}"><b>The '
        f"breaker of group {escape(b['group'])} on topic {escape(b['topic'])} is held open</b> since "
        f"{when(b['changed_at'])} (by {escape(b['changed_by'])}): its consumers are handed nothing and its "
        f"retries wait until an operator closes it (DAG {dag}, or <code>redelivery breaker close --topic "
        f"{escape(b['topic'])} --group {escape(b['group'])}</code>).</div>"
        for b in data["breakers"]
        if b["state"] == "held"
    ]


def outage_sections(data: dict, ui_root: str) -> str:
    """The breakers and standing redrives sections (HTML)."""
    dag = link(BREAKER_DAG, f"{ui_root}dags/{quote(BREAKER_DAG, safe='')}")
    parts = [
        "<h2>Circuit breakers</h2>",
        f"<p class='muted'>A subscription's breaker opens when the failures it counts pass its ratio: "
        f"nothing is handed out, failures are parked, due retries wait. Open or close one with the DAG "
        f"{dag} (Trigger), or <code>redelivery breaker open|close</code>.</p>",
    ]
    if data["breakers"]:
        rows = [
            [b["topic"], b["group"], b["state"], "until closed" if b["state"] == "held" else b["open_until"],
             b["opened_at"], b["changed_by"], b["failed"], b["succeeded"]]
            for b in data["breakers"]
        ]  # fmt: skip
        headers = ["topic", "group", "state", "open until", "opened", "by", "failed (1 min)", "ok (1 min)"]
        parts.append(table(headers, rows))
    else:
        parts.append("<p class='breakers-closed'>Every breaker is closed.</p>")
    if data["transitions"]:
        parts.append("<h3>Latest transitions</h3>")
        rows = [
            [t["at"], t["topic"], t["group"], f"{t['from']} → {t['to']}", t["changed_by"], t["failed"],
             t["succeeded"], t["open_until"], t["note"]]
            for t in data["transitions"]
        ]  # fmt: skip
        headers = ["at", "topic", "group", "transition", "by", "failed", "ok", "open until", "note"]
        parts.append(table(headers, rows))
    parts.append("<h2>Standing redrives</h2>")
    if not data["standing"]:
        parts.append(
            "<p class='muted'>None: dead letters come back only by a redrive. Declare one in the config "
            "file's <code>standing_redrives:</code> or with <code>redelivery standing-redrive add</code>.</p>"
        )
        return "".join(parts)
    rows = []
    for p in data["standing"]:
        spec = p["spec"]
        rule = "after a breaker closed" if spec["after"] == "breaker_closed" else f"every {spec['every']}"
        state = (
            Html(escape(p["state"]))
            if p["state"] == "active"
            else Html(f"<b>stopped</b> by {escape(p['changed_by'])}: {escape(p['stopped_reason'] or '')}")
        )
        rows.append([p["name"], p["group"], rule, spec["max_generations"], p["brought_back"], p["runs"],
                     p["last_run_at"], state])  # fmt: skip
    headers = ["name", "group", "when", "generations", "brought back", "runs", "last looked", "state"]
    parts.append(table(headers, rows))
    return "".join(parts)
