"""The "Dead letters" page's content: its data, read in one snapshot of the state store, and its
HTML (served by ``redelivery.airflow.ui``).

Per consumer group: its deliveries per live state and its retries waiting per delay level (SVG
charts), its dead letters (count, oldest, DLQs, top reasons and errors), and a form that starts a
dry run of the ``dlq_redrive`` DAG for the group and a filter. Then the lateness of each tier's
recent runs (a chart per tier), the latest run of each tier and the latest redrives. Every value
is escaped.
"""

from __future__ import annotations

from html import escape

import psycopg

from .. import statements as S
from ..config import cached_config
from ..dead_letters import REASONS, summary
from .charts import Bar, Series, columns, horizontal_bars, lines

#: The DAG the page's form triggers.
REDRIVE_DAG = "dlq_redrive"
#: How many of each tier's latest runs the lateness chart shows.
RECENT_RUNS = 20
#: Live states in the state machine's order, with their colours (COMMITTED, the history, is not read).
STATES = {"READY": "#38a169", "INFLIGHT": "#3182ce", "WAITING_RETRY": "#dd6b20", "DLQ": "#e53e3e"}
P50, P99 = "#3182ce", "#e53e3e"

STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#1a202c}
table{border-collapse:collapse;margin:8px 0 16px}
td,th{border:1px solid #cbd5e0;padding:4px 10px;text-align:left;vertical-align:top}th{background:#edf2f7}
h1{font-size:22px}h2{font-size:18px;margin:28px 0 4px}.muted{color:#718096}
.row{display:flex;flex-wrap:wrap;gap:12px 28px;align-items:flex-start}
section.group{border-top:1px solid #e2e8f0;margin-top:16px}
form.redrive{background:#f7fafc;border:1px solid #e2e8f0;padding:8px 12px;margin:4px 0 8px;
display:inline-block}
form.redrive label{margin-right:12px}form.redrive input[type=text]{width:220px}
form.redrive button{background:#2b6cb0;color:#fff;border:0;padding:5px 12px;border-radius:4px;
cursor:pointer}"""


def page_data(conn: psycopg.Connection) -> dict:
    """Everything the page shows, read over ``conn`` (a redelivery connection) in one
    transaction; the caller picks its isolation (the page uses a read-only REPEATABLE READ one, so
    the charts and the tables agree). Shape: ``{"groups": summary() rows, "states": {group: {state:
    n}}, "waiting": {group: {delay level: n}}, "lateness": {tier: [(window end, promoted, p50, p99,
    max)]} (seconds, oldest run first), "tiers": LATEST_TIER_RUNS rows, "redrives": LATEST_REDRIVES
    rows}``. Raises psycopg errors."""
    with conn.transaction():
        states: dict[str, dict[str, int]] = {}
        for group, state, n in conn.execute(S.GROUP_STATE_COUNTS):
            states.setdefault(group, {})[state] = n
        waiting: dict[str, dict[int, int]] = {}
        for group, level, n in conn.execute(S.GROUP_WAITING_PER_LEVEL):
            waiting.setdefault(group, {})[level] = n
        lateness: dict[str, list[tuple]] = {}
        for tier, *run in conn.execute(S.RECENT_TIER_LATENESS, {"n": RECENT_RUNS}):
            lateness.setdefault(tier, []).append(tuple(run))
        return {
            "groups": summary(conn),
            "states": states,
            "waiting": waiting,
            "lateness": lateness,
            "tiers": conn.execute(S.LATEST_TIER_RUNS).fetchall(),
            "redrives": conn.execute(S.LATEST_REDRIVES).fetchall(),
        }


def table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(v) if v is not None else '')}</td>" for v in row) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def states_chart(group: str, counts: dict[str, int]) -> str:
    bars = [Bar(state, counts.get(state, 0), color) for state, color in STATES.items()]
    return horizontal_bars(
        f"states-{group}",
        f"Messages per state ({number_of(sum(b.value for b in bars))} live)",
        bars,
        "messages",
        {"chart": "states", "group": group},
    )


def levels_chart(group: str, counts: dict[int, int]) -> str:
    """Every level of the configured table (and any other level that has retries waiting)."""
    durations = str(cached_config().level_table).split()
    levels = sorted(set(range(1, len(durations) + 1)) | set(counts))
    bars = [
        Bar(f"level {level}", counts.get(level, 0), STATES["WAITING_RETRY"],
            durations[level - 1] if level <= len(durations) else "", str(level))
        for level in levels
    ]  # fmt: skip
    return columns(
        f"levels-{group}",
        f"Retries waiting per delay level ({number_of(sum(counts.values()))} in all)",
        bars,
        "retries waiting",
        {"chart": "levels", "group": group},
    )


def number_of(n: int) -> str:
    return f"{n:,}"


def redrive_form(group: str, reasons: list[str]) -> str:
    """A dry run of dlq_redrive for ``group``: optional reason and "error contains" filter. The
    POST route fixes dry run on, then takes the Airflow UI to the run (``redelivery.airflow.ui``)."""
    options = '<option value="">any</option>' + "".join(
        f'<option value="{escape(r)}">{escape(r)}{" (in this group)" if r in reasons else ""}</option>'
        for r in REASONS
    )
    return (
        '<form class="redrive" method="post" action="dlq/redrive" '
        f'data-group="{escape(group)}">'
        f'<input type="hidden" name="group" value="{escape(group)}">'
        f'<label>Reason <select name="reason">{options}</select></label>'
        '<label>Last error contains <input type="text" name="error_contains"></label>'
        f'<button type="submit">Dry run redrive of {escape(group)}</button>'
        '<div class="muted">Triggers <b>dlq_redrive</b> as a <b>dry run</b>: it counts and samples what '
        "would move, and moves nothing. To move them, trigger dlq_redrive with Dry run off.</div></form>"
    )


def group_section(group: str, data: dict, dead: dict | None) -> str:
    parts = [f'<section class="group" data-group="{escape(group)}">']
    if dead:
        parts.append(
            f"<h2>Group {escape(group)}: {dead['count']} dead letters</h2>"
            f"<p class='muted'>oldest {escape(dead['oldest'])}, newest {escape(dead['newest'])}.</p>"
        )
    else:
        parts.append(f"<h2>Group {escape(group)}: no dead letters</h2>")
    parts.append(
        '<div class="row">'
        + states_chart(group, data["states"].get(group, {}))
        + levels_chart(group, data["waiting"].get(group, {}))
        + "</div>"
    )
    if dead:
        parts.append(
            '<div class="row">'
            + table(["dead-letter queue", "messages"], [[q["value"], q["count"]] for q in dead["queues"]])
            + table(["top reasons", "messages"], [[r["value"], r["count"]] for r in dead["top_reasons"]])
            + table(["top last errors", "messages"], [[e["value"], e["count"]] for e in dead["top_errors"]])
            + "</div>"
        )
        parts.append(redrive_form(group, [r["value"] for r in dead["top_reasons"]]))
    return "".join(parts) + "</section>"


def lateness_chart(tier: str, runs: list[tuple]) -> str:
    xlabels = [end.strftime("%Y-%m-%d %H:%M:%S") for end, *_ in runs]
    return lines(
        f"lateness-{tier}",
        f"Tier {tier}: lateness of its latest {len(runs)} runs",
        xlabels,
        [Series("p50", P50, [r[2] for r in runs]), Series("p99", P99, [r[3] for r in runs])],
        "s",
        {"chart": "lateness", "tier": tier},
    )


def tier_order(tiers) -> list[str]:
    """The configured tiers in the config's order (shortest levels first), then any others by name."""
    configured = [t.name for t in cached_config().tiers]
    return [t for t in configured if t in tiers] + sorted(set(tiers) - set(configured))


def render(data: dict) -> str:
    """The whole page (HTML) from ``page_data``'s result."""
    dead = {g["group"]: g for g in data["groups"]}
    groups = list(dead) + sorted(set(data["states"]) - set(dead))
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Dead letters</title><style>{STYLE}</style>"
        "</head><body><h1>Dead letters</h1>",
        "<p class='muted'>Per consumer group, summed over its topics: live deliveries per state (the "
        "committed history is not counted) and retries waiting per delay level.</p>",
    ]
    if not groups:
        parts.append("<p class='muted'>No messages and no dead letters.</p>")
    parts.extend(group_section(g, data, dead.get(g)) for g in groups)
    parts.append("<h2>Lateness of recent tier runs</h2>")
    parts.append(
        "<p class='muted'>How late a promoted retry became READY: window end minus its due time, p50 and "
        f"p99 in seconds (0.1 s buckets) of each of the tier's latest {RECENT_RUNS} successful runs; a run "
        "that promoted nothing has no point.</p>"
    )
    if data["lateness"]:
        parts.append(
            '<div class="row">'
            + "".join(lateness_chart(t, data["lateness"][t]) for t in tier_order(data["lateness"]))
            + "</div>"
        )
    parts.append(
        table(
            ["tier", "window end", "status", "promoted", "dead-lettered", "lateness p99 (s)"],
            [list(r) for r in data["tiers"]],
        )
    )
    parts.append("<h2>Latest redrives</h2>")
    parts.append(
        table(
            [
                "run",
                "group",
                "triggered by",
                "dry run",
                "status",
                "matched",
                "max messages",
                "moved",
                "held by backlog cap",
                "started",
            ],
            [list(r) for r in data["redrives"]],
        )
    )
    parts.append("</body></html>")
    return "".join(parts)
