"""The "Dead letters" page's content: its data, read in one snapshot of the state store, and its
HTML (served by ``redelivery.airflow.ui.app``).

At the top, each tier whose DAG Airflow has paused: the delay levels it leaves unpromoted (with
their durations and the retries waiting at them) and since when (Airflow's audit log:
``pause_changes``). Then the consumer groups: every
group with live deliveries (READY, INFLIGHT, WAITING_RETRY) or dead letters, most dead letters
first, then by name, those whose name contains the filter (``?group=``: a filtered view is a link
to share), at most ``GROUP_LIMIT`` (the page says how many more). An overview table, then per
group its deliveries per live state and its retries waiting per delay level (SVG charts), its dead
letters (count, oldest, DLQs, reasons, top errors) and links to its dead-letter list
(``redelivery.airflow.ui.dead_letter_pages``: all of them, and those of each reason the group has,
most first), where a selection is redriven (a dry run by default). Then the lateness of each
tier's recent runs (a chart per tier), the latest run of each tier and the latest redrives, each
run that is an Airflow DAG run linked to its page in the Airflow UI.

One format everywhere: counts with thousands separators (``charts.number``: 8,245), times in UTC
to the second, booleans as words. Every value is escaped.

Cost: each statement costs what it counts (docs/ARCHITECTURE.md; statements.py, "operator page"):
the live states through their partial indexes and the messages past each offset through the log's
primary key, the dead letters of the listed groups, the latest runs of each tier through
``tier_runs_window``; COMMITTED messages (no rows in the log layout) are not counted here.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from html import escape
from urllib.parse import quote

import psycopg
from pydantic import ValidationError

from redelivery.airflow.ui.charts import Bar, Series, columns, horizontal_bars, lines, number, sparkline
from redelivery.airflow.ui.pauses import PauseEvent, bulk_covers, pause_changes  # noqa: F401  (the page's names)
from redelivery.airflow.ui.style import STYLE, TOP_LINKS  # noqa: F401  (the page's names)
from redelivery.config import cached_config
from redelivery.dead_letters import DlqFilter
from redelivery.fields import query_string
from redelivery.store import statements as S

#: The DAG that redrives dead letters (the list's selection triggers it; the page links its runs).
REDRIVE_DAG = "dlq_redrive"
#: How many of each tier's latest runs the lateness chart shows.
RECENT_RUNS = 20
#: At most this many groups are listed (after the filter); the page says how many more matched.
GROUP_LIMIT = 200
#: Per listed group: its DLQs and its most frequent last errors shown.
TOP_QUEUES, TOP_FAILURES = 20, 5
#: A failure of the page (``PAGE_DLQ_TOP_FAILURES``), and the characters of its error text shown.
FAILURE_FIELDS = ("signature", "count", "failed_again", "first", "last", "error_class", "error", "frame")
FAILURE_CHARS = 200
#: The spans of a failure's sparkline on the page (the group's dead letters, oldest to newest).
TIMELINE_SPANS = 24
#: Live states in the state machine's order, with their colours (COMMITTED is not shown).
STATES = {
    "READY": "#38a169",
    "INFLIGHT": "#3182ce",
    "WAITING_RETRY": "#dd6b20",
    "DLQ": "#e53e3e",
    "BLOCKED": "#805ad5",
}
#: The held keys of a group the page lists, held longest first; characters of a key it shows.
HELD_KEYS, KEY_CHARS = 20, 60
#: Why a key is held, by its head's state.
HELD_WHY = {"WAITING_RETRY": "waiting for its retry", "HALTED": "dead letter, on_exhausted halt"}
P50, P99 = "#3182ce", "#e53e3e"


class Html(str):
    """HTML made in this module from escaped parts: a table cell shows it as it is."""


# ---- data ----------------------------------------------------------------------------------------


def page_data(
    conn: psycopg.Connection,
    name_filter: str = "",
    limit: int = GROUP_LIMIT,
    paused_tiers: Iterable[str] = (),
) -> dict:
    """Everything the page shows, read over ``conn`` (a redelivery connection) in one
    transaction; the caller picks its isolation (the page uses a read-only REPEATABLE READ one, so
    the charts and the tables agree). ``name_filter``: list only groups whose name contains it
    (case-insensitive; a value, never SQL or a pattern); ``limit``: at most this many groups;
    ``paused_tiers``: tiers of the config whose retries waiting are counted for their banners.

    Shape: ``{"filter": name_filter, "groups": [group], "matched": groups that matched before the
    limit, "lateness": {tier: [(window end, promoted, p50, p99, max)]} (seconds, oldest run first),
    "tier_runs": {tier: (tier, run key, window end, status, dry run, promoted, dead-lettered,
    lateness p99 s, last finished at)}, "redrives": LATEST_REDRIVES rows, "waiting_at": {tier:
    (retries waiting at its levels, of them due)}}``; a group is ``{"id", "name", "READY",
    "INFLIGHT", "WAITING_RETRY", "DLQ", "BLOCKED": counts, "oldest", "newest": dead-lettering times
    or None, "waiting": {delay level: n}, "queues", "reasons": [(value, count)], most first,
    "failures": [{"signature", "count", "failed_again", "first", "last", "error_class", "error",
    "frame", "timeline": dead letters per ``TIMELINE_SPANS`` equal spans of time}]: the
    dead letters by the signature of their last failure, most first (``TOP_FAILURES``), "held":
    {"keys": keys an ordered subscription holds by a failure, "list": the
    ``HELD_KEYS`` held longest ({"topic", "key", "message_id", "why", "since", "due_at",
    "behind"}), "since": when the oldest BLOCKED message was passed by the offset}}``: a key is
    held when its head waits for a retry or is a dead letter holding it (on_exhausted halt); one
    whose head is in flight or READY is busy, not held.
    Raises psycopg errors."""
    with conn.transaction():
        groups, matched = _groups(conn, name_filter, limit)
        lateness: dict[str, list[tuple]] = {}
        for tier, *run in conn.execute(S.RECENT_TIER_LATENESS, {"runs": RECENT_RUNS}):
            lateness.setdefault(tier, []).append(tuple(run))
        return {
            "filter": name_filter,
            "groups": groups,
            "matched": matched,
            "lateness": lateness,
            "tier_runs": {row[0]: row for row in conn.execute(S.PAGE_TIER_RUNS)},
            "redrives": conn.execute(S.LATEST_REDRIVES).fetchall(),
            "waiting_at": {tier: _waiting_at(conn, tier) for tier in paused_tiers},
        }


def _add_timelines(conn: psycopg.Connection, group: dict) -> None:
    """Each of ``group``'s failures gets ``timeline``: its dead letters in each of
    ``TIMELINE_SPANS`` equal spans from the group's oldest dead letter to its newest."""
    failures = [f for f in group["failures"] if f["signature"]]
    if not failures:
        return
    low = group["oldest"].timestamp()
    high = max(group["newest"].timestamp(), low + 1)  # width_bucket needs two bounds
    params = {"group_id": group["id"], "signatures": [f["signature"] for f in failures], "low": low,
              "high": high, "buckets": TIMELINE_SPANS}  # fmt: skip
    spans: dict[str, list[int]] = {f["signature"]: [0] * TIMELINE_SPANS for f in failures}
    for signature, span, n in conn.execute(S.PAGE_DLQ_FAILURE_TIMELINE, params):
        spans[signature][span - 1] = n
    for f in failures:
        f["timeline"] = spans[f["signature"]]


def _groups(conn: psycopg.Connection, name_filter: str, limit: int) -> tuple[list[dict], int]:
    """The listed groups with their details, and how many matched before ``limit``."""
    if "\x00" in name_filter:  # no name has one, and PostgreSQL text cannot carry it
        return [], 0
    rows = conn.execute(S.PAGE_GROUPS, {"name": name_filter, "limit": limit}).fetchall()
    groups = {
        gid: {"id": gid, "name": name, "READY": ready, "INFLIGHT": inflight, "WAITING_RETRY": waiting,
              "DLQ": dead, "BLOCKED": blocked, "oldest": oldest, "newest": newest, "waiting": {},
              "queues": [], "reasons": [], "failures": [], "held": {"keys": 0, "list": [], "since": None}}
        for gid, name, ready, inflight, waiting, dead, blocked, oldest, newest, _ in rows
    }  # fmt: skip
    ids = list(groups)
    for gid, level, n in conn.execute(S.PAGE_WAITING_PER_LEVEL, {"ids": ids}):
        groups[gid]["waiting"][level] = n
    for gid, _, since in conn.execute(S.PAGE_BLOCKED, {"ids": ids}):
        groups[gid]["held"]["since"] = since
    for gid, topic, key, message_id, state, since, due_at, behind, total in conn.execute(
        S.PAGE_HELD_KEYS, {"ids": ids, "limit": HELD_KEYS}
    ):
        groups[gid]["held"]["keys"] = total
        groups[gid]["held"]["list"].append({"topic": topic, "key": key, "message_id": message_id,
                                            "why": HELD_WHY[state], "since": since, "due_at": due_at,
                                            "behind": behind})  # fmt: skip
    with_dead = [gid for gid in ids if groups[gid]["DLQ"]]
    details = (
        ("queues", S.PAGE_DLQ_QUEUES, TOP_QUEUES),
        ("reasons", S.PAGE_DLQ_REASONS, None),
    )
    for key, statement, top in details:
        for gid, value, n in conn.execute(statement, {"ids": with_dead, "limit": top}):
            groups[gid][key].append((value, n))
    params = {"ids": with_dead, "limit": TOP_FAILURES, "error_chars": FAILURE_CHARS}
    for gid, *values in conn.execute(S.PAGE_DLQ_TOP_FAILURES, params):
        groups[gid]["failures"].append(dict(zip(FAILURE_FIELDS, values, strict=True)))
    for gid in with_dead:
        _add_timelines(conn, groups[gid])
    return list(groups.values()), rows[0][-1] if rows else 0


def _waiting_at(conn: psycopg.Connection, tier: str) -> tuple[int, int]:
    """(retries waiting at ``tier``'s delay levels, of them due now); (0, 0) for an unknown tier."""
    levels = next((t.levels for t in cached_config().tiers if t.name == tier), [])
    return tuple(conn.execute(S.PAGE_WAITING_AT_LEVELS, {"levels": list(levels), "at": None}).fetchone())


def tier_dags() -> dict[str, str]:
    """``{tier name: its DAG id}`` for every tier of the config, in the config's order."""
    from redelivery.airflow.dags.tiers import dag_id  # the DAG factory's naming, imported when a page is made

    return {t.name: dag_id(t) for t in cached_config().tiers}


# ---- formatting ----------------------------------------------------------------------------------


def when(moment: datetime | None) -> str:
    """A time as the page writes it: UTC, to the second (``2026-03-01 12:00:13 UTC``); '' for None."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else ""


def cell(value) -> str:
    """A table cell's HTML: ``Html`` as it is, counts with thousands separators, booleans as
    yes/no, times by ``when``, anything else escaped text; None is empty."""
    if isinstance(value, Html):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):  # before int: a bool is an int
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return number(value)
    if isinstance(value, datetime):
        return when(value)
    return escape(str(value))


def table(headers: list[str], rows: list[list]) -> str:
    """A table; numeric cells are right-aligned."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)

    def td(v) -> str:
        numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
        return f"<td class='n'>{cell(v)}</td>" if numeric else f"<td>{cell(v)}</td>"

    body = "".join("<tr>" + "".join(td(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def link(text: str, href: str, top: bool = True) -> Html:
    """A link; ``top``: a page of the Airflow UI, opened by the whole UI (``TOP_LINKS``)."""
    return Html(f'<a href="{escape(href)}"{" data-top" if top else ""}>{escape(text)}</a>')


def run_url(ui_root: str, dag_id: str, run_id: str) -> str:
    """The path of a DAG run's page in the Airflow UI (``ui_root``: the UI's root path, with a
    trailing slash)."""
    return f"{ui_root}dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def run_link(run_key: str, ui_root: str, dags: Iterable[str]) -> str:
    """A run key as a link to its Airflow run, or as text when it is no Airflow run (the CLI's
    ``cli/...``, a test's). Keys of Airflow runs: a redrive's ``dlq_redrive/<run id>``
    (``redrive_dag``), a tier run's ``<tier DAG id>/<run id>/<try number>`` (``TierWindowOperator``,
    one key per try); ``dags``: the tier DAG ids."""
    dag, _, rest = run_key.partition("/")
    if dag == REDRIVE_DAG and rest:
        return link(run_key, run_url(ui_root, dag, rest))
    run_id, _, attempt = rest.rpartition("/")
    if dag in set(dags) and run_id and attempt.isdigit():
        return link(run_key, run_url(ui_root, dag, run_id))
    return run_key


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _plural(n: int, one: str, many: str) -> str:
    return f"{number(n)} {one if n == 1 else many}"


# ---- parts of the page ---------------------------------------------------------------------------


def paused_banner(tier: str, event: PauseEvent | None, data: dict, ui_root: str) -> str:
    """The alert for a tier whose DAG Airflow has paused: its delay levels (with durations) that
    are not promoted, the retries waiting at them, and since when: ``event``, the pause in
    Airflow's audit log; else when the tier's last run finished."""
    config = cached_config()
    levels = next((t.levels for t in config.tiers if t.name == tier), [])
    durations = str(config.level_table).split()
    named = [f"{lvl} ({durations[lvl - 1]})" if lvl <= len(durations) else str(lvl) for lvl in levels]
    dag = tier_dags().get(tier, f"redelivery_tier_{tier}")
    waiting, due = data["waiting_at"].get(tier, (0, 0))
    them = "it" if len(levels) == 1 else "them"
    waits = (
        f"{_plural(waiting, 'retry waits', 'retries wait')} at {them}, {number(due)} of {them} due"
        if waiting
        else f"no retry waits at {them}"
    )
    if event:
        by = f" by {escape(event.owner)}" if event.owner else ""
        since = f"It has been paused since {when(event.at)}{by} through {escape(event.via)}."
    else:
        last = data["tier_runs"].get(tier)
        since = (
            f"Since when is unknown: no pause of it is in Airflow's audit log; its last run finished at "
            f"{when(last[-1])}."
            if last and last[-1]
            else "Since when is unknown: no pause of it is in Airflow's audit log and no run of it is "
            "recorded."
        )
    subject = "delay level" if len(levels) == 1 else "delay levels"
    verb = "is" if len(levels) == 1 else "are"
    dag_page = link(dag, f"{ui_root}dags/{quote(dag, safe='')}")
    return (
        f'<div class="paused" role="alert" data-tier="{escape(tier)}"><b>Tier {escape(tier)} is paused in '
        f"Airflow</b> (DAG {dag_page}): {subject} {escape(_listed(named)) if named else '(none configured)'} "
        f"{verb} not promoted; {waits}. {since} Unpause the DAG to promote them again.</div>"
    )


def filter_form(name_filter: str) -> str:
    """The group filter: a GET form, so the filtered view's address can be shared."""
    return (
        '<form class="filter" method="get" action="dlq"><label>Group name contains '
        f'<input type="search" name="group" value="{escape(name_filter)}"></label> '
        '<button type="submit">Filter</button> <a href="dlq">all groups</a></form>'
    )


def groups_summary(data: dict) -> str:
    """How many groups are listed (and how many more the cap left out)."""
    shown, matched, name_filter = len(data["groups"]), data["matched"], data["filter"]
    if not matched:
        if name_filter:
            return (
                f"<p class='muted'>No group's name contains “{escape(name_filter)}” (or it has no live "
                "message and no dead letter).</p>"
            )
        return "<p class='muted'>No messages and no dead letters.</p>"
    which = f" whose name contains “{escape(name_filter)}”" if name_filter else ""
    if shown < matched:
        return (
            f"<p class='muted'>{number(shown)} of {number(matched)} groups shown, "
            f"{number(matched - shown)} more{which}: narrow the filter to see them.</p>"
        )
    return f"<p class='muted'>{_plural(matched, 'group', 'groups')}{which}.</p>"


def overview(groups: list[dict]) -> str:
    """One row per listed group, linked to its section."""
    rows = [
        [
            link(g["name"], f"#group-{g['name']}", top=False),
            g["DLQ"],
            g["READY"],
            g["INFLIGHT"],
            g["WAITING_RETRY"],
            g["BLOCKED"],
        ]
        for g in groups
    ]
    return table(["group", "dead letters", "READY", "INFLIGHT", "WAITING_RETRY", "BLOCKED"], rows)


def short_key(key: str) -> Html:
    """A key as the page shows it: its first ``KEY_CHARS`` characters, and its length when longer."""
    if len(key) <= KEY_CHARS:
        return Html(escape(key))
    return Html(f"{escape(key[:KEY_CHARS])}… <span class='muted'>({number(len(key))} characters)</span>")


def held_keys(held: dict, blocked: int) -> str:
    """An ordered group's keys held by a failure, with the message holding each, why, since when
    (its first failure), when its retry is due and how many messages wait BLOCKED behind it; and
    the group's BLOCKED messages (behind held keys and busy ones: a head in flight)."""
    oldest = f", the oldest waiting since {when(held['since'])}" if held["since"] else ""
    waiting = f"{_plural(blocked, 'message', 'messages')} BLOCKED in all{oldest}"
    if not held["keys"]:
        return (f"<p class='held'>Ordered: No key is held by a failure (a retry or a dead letter); "
                f"{waiting}, behind keys whose head is in flight.</p>")  # fmt: skip
    shown = len(held["list"])
    listed = f" (the {number(shown)} held longest)" if shown < held["keys"] else ""
    rows = [[h["topic"], short_key(h["key"]), h["message_id"], h["why"], h["since"], h["due_at"], h["behind"]]
            for h in held["list"]]  # fmt: skip
    return (
        f"<p class='held'>Ordered: {_plural(held['keys'], 'key', 'keys')} held by a failure{listed}; "
        f"{waiting}.</p>"
        + table(["topic", "key", "held by message", "why", "since", "retry due", "BLOCKED behind"], rows)
    )


def states_chart(group: str, counts: dict[str, int]) -> str:
    bars = [Bar(state, counts.get(state, 0), color) for state, color in STATES.items()]
    return horizontal_bars(
        f"states-{group}",
        f"Messages per state ({number(sum(b.value for b in bars))} live)",
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
        f"Retries waiting per delay level ({number(sum(counts.values()))} in all)",
        bars,
        "retries waiting",
        {"chart": "levels", "group": group},
    )


def list_link(
    text: str, group: str, reasons: tuple[str, ...] = (), css: str = "", signature: str | None = None
) -> str:
    """A link to ``group``'s dead-letter list under the filter ``reasons`` or ``signature`` (the
    address written as the list reads it: ``fields.query_string`` of a ``DlqFilter``), relative
    like the page's other links to its own pages, so it opens in the UI's frame; the text alone
    when the filter refuses the name or a reason (a row older than the naming rule: the list would
    refuse it too)."""
    try:
        request = DlqFilter(group=group, reasons=list(reasons), signature=signature)
        href = "dlq/messages?" + query_string(request)
    except ValidationError:
        return escape(text)
    attributes = f' class="{css}"' if css else ""
    if reasons:
        attributes += f' data-reason="{escape(reasons[0])}"'
    if signature:
        attributes += f' data-signature="{escape(signature)}"'
    return f'<a{attributes} href="{escape(href)}">{escape(text)}</a>'


def failures_table(group: str, failures: list[dict], oldest=None, newest=None) -> str:
    """The group's dead letters by failure (issue 40): per signature, linked to its dead letters
    on the list (where they are redriven), the newest one's class, text and top frame, how many,
    how many of them had been redriven before (a fix that did not hold), when the first and the
    last were dead-lettered, and a sparkline of them from the group's ``oldest`` dead letter to
    its ``newest``."""
    rows = [
        [
            # a dead letter without a signature (made during an upgrade) has no list of its own
            Html(list_link(f["signature"], group, signature=f["signature"], css="failure"))
            if f["signature"]
            else "(none)",
            f["error_class"] or "(text)",
            f["error"] or "",
            f["frame"] or "",
            f["count"],
            f["failed_again"],
            when(f["first"]),
            when(f["last"]),
            Html(
                sparkline(
                    f"failure-{group}-{f['signature']}",
                    f["signature"],
                    f["timeline"],
                    when(oldest),
                    when(newest),
                )
            )
            if "timeline" in f
            else "",
        ]
        for f in failures
    ]
    headers = ["failure", "class", "newest error", "top frame", "dead letters", "failed again",
               "first", "last", "over time"]  # fmt: skip
    return '<div class="failures">' + table(headers, rows) + "</div>"


def browse_links(group: str, dead: int, reasons: list[tuple[str, int]]) -> str:
    """The ways to ``group``'s dead letters on the list, where they are inspected and a selection
    redriven (``dlq_redrive``, a dry run by default): all ``dead`` of them, then those of each
    reason the group has (``reasons``: most first, with their counts)."""
    every = ("all " if dead > 1 else "") + _plural(dead, "dead letter", "dead letters")
    links = [list_link(every, group, css="browse")]
    links += [list_link(f"{reason} ({number(n)})", group, (reason,), "reason") for reason, n in reasons]
    return (
        f'<p class="browse-links" data-group="{escape(group)}">Browse and redrive: {" · ".join(links)}</p>'
        "<p class='muted'>The list filters them by every field of dlq_redrive's filter, shows each in "
        "full, downloads them, and starts <b>dlq_redrive</b> for the ticked ones or all matching: a "
        "<b>dry run</b> by default (it counts and samples what would move, and moves nothing), or a "
        "real run.</p>"
    )


def group_section(group: dict) -> str:
    name, dead = group["name"], group["DLQ"]
    parts = [
        f'<section class="group" data-group="{escape(name)}">',
        f'<h2 id="group-{escape(name)}">Group {escape(name)}: '
        f"{_plural(dead, 'dead letter', 'dead letters') if dead else 'no dead letters'}</h2>",
    ]
    if dead:
        parts.append(f"<p class='muted'>oldest {when(group['oldest'])}, newest {when(group['newest'])}.</p>")
    if group["held"]["keys"] or group["BLOCKED"]:
        parts.append(held_keys(group["held"], group["BLOCKED"]))
    parts.append(
        '<div class="row">'
        + states_chart(name, {state: group[state] for state in STATES})
        + levels_chart(name, group["waiting"])
        + "</div>"
    )
    if dead:
        parts.append(
            '<div class="row">'
            + table(["dead-letter queue", "messages"], [list(q) for q in group["queues"]])
            + table(["reason", "messages"], [list(r) for r in group["reasons"]])
            + "</div>"
        )
        parts.append(failures_table(name, group["failures"], group["oldest"], group["newest"]))
        parts.append(browse_links(name, dead, group["reasons"]))
    return "".join(parts) + "</section>"


def lateness_chart(tier: str, runs: list[tuple]) -> str:
    xlabels = [end.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") for end, *_ in runs]
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


def kind(dry_run: bool | None) -> str:
    return "" if dry_run is None else "dry run" if dry_run else "real"


def tier_runs_table(data: dict, ui_root: str, dags: list[str]) -> str:
    """The latest run of each tier (configured ones without a run too)."""
    rows = []
    for tier in tier_order(set(data["tier_runs"]) | {t.name for t in cached_config().tiers}):
        run = data["tier_runs"].get(tier)
        if run is None:
            rows.append([tier, "no run recorded", None, None, None, None, None, None])
            continue
        _, key, window_end, status, dry_run, promoted, dead, p99, _ = run
        rows.append(
            [tier, run_link(key, ui_root, dags), window_end, status, kind(dry_run), promoted, dead, p99]
        )
    headers = ["tier", "run", "window end", "status", "kind", "promoted", "dead-lettered", "lateness p99 (s)"]
    return table(headers, rows)


def redrives_table(data: dict, ui_root: str) -> str:
    rows = [
        [run_link(key, ui_root, ()), group, who, kind(dry_run), *rest]
        for key, group, who, dry_run, *rest in data["redrives"]
    ]
    headers = ["run", "group", "triggered by", "kind", "status", "matched", "max messages", "moved",
               "held by backlog cap", "started"]  # fmt: skip
    return table(headers, rows)


def render(data: dict, ui_root: str = "/", paused: dict | None = None, alerts=(), sections: str = "") -> str:
    """The whole page (HTML) from ``page_data``'s result. ``ui_root``: the Airflow UI's root path
    (trailing slash), for links to its pages; ``paused``: each tier whose DAG Airflow has paused,
    with the pause found in its audit log (a ``PauseEvent``, None: none found), in banners at the
    top; ``alerts``:
    more banners (HTML: ``airflow.ui.outage``'s held breakers), ``sections`` more sections (HTML,
    before the tiers': its breakers and standing redrives)."""
    dags = list(tier_dags().values())
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Dead letters</title><style>{STYLE}</style>"
        "</head><body><h1>Dead letters</h1>",
    ]
    parts.extend(paused_banner(t, (paused or {})[t], data, ui_root) for t in tier_order(paused or {}))
    parts.extend(alerts)
    parts.append(
        "<p class='muted'>Every consumer group with live messages or dead letters, most dead letters first, "
        "summed over its topics: live messages per state (READY counts the messages past its offsets; "
        "COMMITTED is not shown) and "
        "retries waiting per delay level.</p>"
    )
    parts.append(filter_form(data["filter"]))
    parts.append(groups_summary(data))
    if data["groups"]:
        parts.append(overview(data["groups"]))
    parts.extend(group_section(g) for g in data["groups"])
    parts.append(sections)
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
    parts.append("<h2>Latest tier runs</h2>")
    parts.append(tier_runs_table(data, ui_root, dags))
    parts.append("<h2>Latest redrives</h2>")
    parts.append(redrives_table(data, ui_root))
    parts.append(TOP_LINKS + "</body></html>")
    return "".join(parts)
