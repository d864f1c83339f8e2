"""The dead letters themselves on the operator's page (HTML; the routes are
``redelivery.airflow.ui.app``'s): a group's list, keyset pages newest first (``dead_letters.browse``)
under the filter the redrive uses (``DlqFilter``: one definition, so what the list shows is what a
redrive of it would move), the filter in the address so that a view is a link to share; one dead
letter in full (``dead_letters.message``); and the form that starts ``dlq_redrive`` for a selection
(ticked messages or all matching the filter, dry run or real) or downloads it as JSON Lines.

The address: ``group`` (required), ``topic``, ``reasons`` (repeated), ``dead_lettered_from`` and
``dead_lettered_to`` (ISO 8601; UTC without a zone), ``error_contains``, ``key``, ``message_ids``
(separated by commas or spaces, or repeated), and on the list ``after`` (the page cursor): written
by ``redelivery.fields.query_string`` (here, and by the "Dead letters" page's links to a group's
list), read back by ``parse_query``. A name or a value the filter refuses is a ``BadQuery``, every
problem one line. Everything user-written
(keys, errors, bodies, properties, names) is escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape
from urllib.parse import quote

from pydantic import ValidationError

from redelivery.airflow.params import unknown_key
from redelivery.airflow.ui.charts import number
from redelivery.airflow.ui.page import STYLE, TOP_LINKS, Html, _plural, cell, run_link, table, when
from redelivery.dead_letters import BODY_PREVIEW_BYTES, ERROR_CHARS, Cursor, DlqFilter
from redelivery.fields import FormField, form_fields, query_pairs, query_string, split_many
from redelivery.messaging.codec import RETRY_PROPERTIES

#: The selection form's own fields: ticked ids, "selected" or "all" matching, "dry_run" or "real".
SELECTION_FIELDS = ("selected", "selection", "run")
#: The longest value of any field taken (the filter's own limits are lower, message ids aside).
VALUE_CHARS = 2_000_000
#: A download has at most this many dead letters (the oldest first, as ``redelivery dlq list``).
DOWNLOAD_ROWS = 100_000

EXTRA_STYLE = """table.letters td{max-width:420px;overflow-wrap:anywhere}
pre{background:#f7fafc;border:1px solid #e2e8f0;padding:8px;max-width:1100px;overflow:auto;
white-space:pre-wrap;overflow-wrap:anywhere}
form.dlqfilter{background:#f7fafc;border:1px solid #e2e8f0;padding:8px 12px;margin:8px 0;max-width:1100px}
form.dlqfilter label{display:inline-block;margin:2px 12px 2px 0}
form.select{margin:8px 0}.actions{background:#f7fafc;border:1px solid #e2e8f0;padding:8px 12px;
max-width:1100px}.actions label{margin-right:12px}
button{background:#2b6cb0;color:#fff;border:0;padding:5px 12px;border-radius:4px;cursor:pointer}
button:disabled{background:#a0aec0;cursor:not-allowed}.pages a{margin-right:16px}.broker{color:#718096}"""


class BadQuery(ValueError):
    """What a list's address, a download's or the selection form asked for and the filter refuses:
    ``problems``, one line each (escaped when shown)."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Query:
    """A parsed request: the filter, the page cursor (lists), and the selection form's values
    (``selected``: ticked message ids; ``everything``: all matching the filter; ``dry_run``)."""

    filter: DlqFilter
    after: Cursor | None = None
    selected: tuple[int, ...] = ()
    everything: bool = False
    dry_run: bool = True


def _ids(values: list[str], field: str, problems: list[str]) -> list[int]:
    ids = []
    for part in split_many(values):
        if part.isascii() and part.isdigit():
            ids.append(int(part))
        else:
            problems.append(f"{field}: {part[:40]!r} is not a message id")
    return ids


def _many(field: FormField, values: list[str], problems: list[str]) -> list:
    """An array field's values as the address gives them (repeated or separated by commas)."""
    if field.item_kind == "integer":
        return _ids(values, field.name, problems)
    return split_many(values)


def _filter_problems(error: ValidationError) -> list[str]:
    """pydantic's errors, one line each: field, message, the value refused (shortened)."""
    lines = []
    for e in error.errors():
        where = ".".join(str(p) for p in e["loc"]) or "filter"
        given = e.get("input")
        value = "" if isinstance(given, dict) or given is None else f" (got {str(given)[:60]!r})"
        lines.append(f"{where}: {e['msg'].removeprefix('Value error, ')}{value}")
    return lines


def parse_query(
    items: Iterable[tuple[str, str]], extra: Sequence[str] = (), model: type[DlqFilter] = DlqFilter
) -> Query:
    """A ``Query`` from an address's or a form's (name, value) pairs: the fields of ``model`` (the
    filter, under its own names) and ``extra`` of ``("after",) + SELECTION_FIELDS``; an empty value
    is no condition. Raises ``BadQuery`` listing every problem (an unknown name with the closest
    known one, a field given twice, a value the filter refuses, a bad cursor)."""
    fields = {f.name: f for f in form_fields(model)}
    known = (*fields, *extra)
    given: dict[str, list[str]] = {}
    problems = []
    for name, value in items:
        if name not in known:
            problems.append(unknown_key(name, list(known)).replace("unknown key", "unknown parameter"))
        else:
            given.setdefault(name, []).append(value[:VALUE_CHARS])
    many = {name for name, f in fields.items() if f.many}
    for name, values in given.items():
        if name not in many and name != "selected" and len(values) > 1:
            problems.append(f"{name}: given {len(values)} times, takes one value")
    one = {name: values[0] for name, values in given.items() if name not in many and values[0] != ""}
    values = {k: v for k, v in one.items() if k in fields}
    values |= {name: _many(fields[name], given.get(name, []), problems) for name in many}
    selected = _ids(given.get("selected", []), "selected", problems)
    after = None
    try:
        after = Cursor.parse(one["after"]) if "after" in one else None
    except ValueError as exc:
        problems.append(f"after: {exc}")
    if one.get("selection", "selected") not in ("selected", "all"):
        problems.append(f"selection: {one['selection'][:40]!r} is neither 'selected' nor 'all'")
    if one.get("run", "dry_run") not in ("dry_run", "real"):
        problems.append(f"run: {one['run'][:40]!r} is neither 'dry_run' nor 'real'")
    try:
        request = model.model_validate({"group": "", **values})
    except ValidationError as exc:
        problems += _filter_problems(exc)
    if problems:
        raise BadQuery(problems)
    everything = one.get("selection") == "all"
    return Query(request, after, tuple(selected), everything, one.get("run", "dry_run") == "dry_run")


def selection_filter(query: Query) -> DlqFilter:
    """What the selection form acts on: every dead letter the filter matches, or (``selected``)
    the ticked ones among them. Raises ``BadQuery`` when no message is ticked."""
    if query.everything:
        return query.filter
    if not query.selected:
        raise BadQuery(["selected: no message is ticked: tick some, or choose all matching the filter"])
    return query.filter.model_copy(update={"message_ids": list(query.selected)})


def redrive_conf(query: Query) -> dict:
    """The ``dlq_redrive`` conf of the selection: the filter's non-empty fields (the ticked ids as
    ``message_ids``) and ``dry_run``; checked against the DAG's Params by the route."""
    chosen = selection_filter(query).model_dump(mode="json")
    return {**{k: v for k, v in chosen.items() if v not in (None, [])}, "dry_run": query.dry_run}


def posted_conf(items: Iterable[tuple[str, str]]) -> dict:
    """The conf a selection form's post asks for, as far as it can be read, for the audit log of a
    post refused before its values are checked: ``redrive_conf``, or its fields as posted (each
    cut at 2,000 characters)."""
    pairs = list(items)
    try:
        return redrive_conf(parse_query(pairs, SELECTION_FIELDS))
    except (BadQuery, ValueError):
        raw: dict = {}
        for name, value in pairs:
            raw.setdefault(name[:100], []).append(value[:2000])
        many = {f.name for f in form_fields(DlqFilter) if f.many}
        return {k: v[0] if len(v) == 1 and k not in many else v for k, v in raw.items()}


# ---- HTML ----------------------------------------------------------------------------------------


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{STYLE}\n{EXTRA_STYLE}</style></head><body><h1>{escape(title)}</h1>{body}"
        f"{TOP_LINKS}</body></html>"
    )


def _input(label: str, name: str, value: str, kind: str = "text", width: int = 200) -> str:
    return (
        f'<label>{escape(label)} <input type="{kind}" name="{name}" value="{escape(value)}" '
        f'style="width:{width}px"></label>'
    )


def _checked(on: bool) -> str:
    return " checked" if on else ""


#: An input's width on the filter form, pixels, by what it takes.
_WIDTHS = {"string": 170, "time": 230, "array": 420}


def _field_input(field: FormField, value) -> str:
    """One field of the filter form: ticks for a list of choices, else a text input (a list's
    values separated by commas, a time in ISO 8601)."""
    if field.many and field.choices:
        ticks = "".join(
            f'<label><input type="checkbox" name="{field.name}" value="{escape(str(c))}"'
            f"{_checked(c in value)}> {escape(str(c))}</label>"
            for c in field.choices
        )
        return f"<br>{escape(field.title)}: {ticks}<br>"
    if field.many:
        text = ",".join(str(v) for v in value)
    else:
        text = value.isoformat() if isinstance(value, datetime) else "" if value is None else str(value)
    width = _WIDTHS["time" if field.is_time else "array" if field.many else "string"]
    label = f"{field.title} (ISO 8601, UTC if no zone)" if field.is_time else field.title
    return _input(label, field.name, text, width=width)


def filter_form(request: DlqFilter, base: str) -> str:
    """The list's filter, a field for each of the filter model's (``type(request)``): a GET form,
    so a filtered view is an address to share."""
    inputs = "".join(_field_input(f, getattr(request, f.name)) for f in form_fields(type(request)))
    cleared = type(request)(group=request.group)
    return (
        f'<form class="dlqfilter" method="get" action="{escape(base)}">'
        + inputs
        + ' <button type="submit">Filter</button> '
        + f'<a href="{escape(base)}?{escape(query_string(cleared))}">clear</a></form>'
    )


def _error_cell(row: dict) -> Html:
    text = row["last_error"] or ""
    if (row["error_length"] or 0) > ERROR_CHARS:
        return Html(f"{escape(text)}… <span class='muted'>({number(row['error_length'])} characters)</span>")
    return Html(escape(text))


def letters_table(rows: list[dict], request: DlqFilter, base: str) -> str:
    """The page's rows, each with its tick box and a link to the message's page."""
    query = escape(query_string(request))
    headers = ["", "message id", "key", "topic", "DLQ", "reason", "last error", "delivery count",
               "reconsume times", "redrive count", "dead-lettered at", "holds its key"]  # fmt: skip
    body = []
    for r in rows:
        mid = r["message_id"]
        tick = f'<input type="checkbox" name="selected" value="{mid}" aria-label="select {mid}">'
        values = [Html(tick), Html(f'<a href="{escape(base)}/{mid}?{query}">{mid}</a>'), r["key"], r["topic"],
                  r["dead_letter_queue"], r["reason"], _error_cell(r), r["delivery_count"],
                  r["reconsume_times"], r["redrive_count"], r["dead_lettered_at"], _holds(r)]  # fmt: skip
        body.append(f'<tr data-message-id="{mid}">' + "".join(_td(v) for v in values) + "</tr>")
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f"<table class='letters'><tr>{head}</tr>{''.join(body)}</table>"


def _holds(row: dict) -> Html:
    """Whether a dead letter holds its key (an ordered subscription's, on_exhausted halt: the key's
    later messages wait until it is redriven) and how many wait behind it."""
    if not row.get("halting"):
        return Html("")
    return Html(f"<b class='halting'>holds its key: {number(row['behind'] or 0)} behind</b>")


def _td(value) -> str:
    numeric = isinstance(value, int) and not isinstance(value, bool)
    return f"<td class='n'>{cell(value)}</td>" if numeric else f"<td>{cell(value)}</td>"


def actions(request: DlqFilter, base: str, refusal: str | None, selected: Sequence[int] = ()) -> str:
    """The selection's actions: dlq_redrive (dry run by default, or real) for the ticked messages or
    all matching the filter, and the download. ``refusal``: why this user may not trigger
    dlq_redrive (its buttons are off, and Airflow would refuse the post), or None.
    ``selected``: ids ticked by the form itself (a message's page)."""
    hidden = "".join(
        f'<input type="hidden" name="{escape(name)}" value="{escape(value)}">'
        for name, value in [*query_pairs(request), *(("selected", str(i)) for i in selected)]
    )
    off = " disabled" if refusal else ""
    note = f"<p class='muted refusal'>{escape(refusal)}: the buttons are off.</p>" if refusal else ""
    which = (
        "this message<input type='hidden' name='selection' value='selected'>"
        if selected
        else "<label><input type='radio' name='selection' value='selected' checked> the ticked messages"
        "</label><label><input type='radio' name='selection' value='all'> all matching the filter</label>"
    )
    return (
        f'<div class="actions">{hidden}<b>Act on</b> {which}<br><b>dlq_redrive</b> '
        "<label><input type='radio' name='run' value='dry_run' checked> dry run (counts, moves nothing)"
        "</label>"
        "<label><input type='radio' name='run' value='real'> real: move them back to READY</label>"
        f'<button type="submit" formaction="{escape(base)}/redrive"{off}>'
        "Start dlq_redrive</button> "
        f'<button type="submit" formmethod="get" formaction="{escape(base)}.jsonl" class="download">'
        "Download JSON Lines</button>"
        f"<p class='muted'>The download holds what <code>redelivery dlq list --json</code> prints, one dead "
        f"letter a line, oldest first, at most {number(DOWNLOAD_ROWS)}.</p>{note}</div>"
    )


def list_page(
    query: Query, rows: list[dict], after: Cursor | None, base: str, overview: str, refusal: str | None
) -> str:
    """A page of a group's dead letters (``browse``'s ``rows`` and the next page's cursor
    ``after``): the filter, the rows with tick boxes, the selection's actions, the way to the
    next page. ``base``: the list's path; ``overview``: the page of every group;
    ``refusal``: ``actions``'."""
    request = query.filter
    group = request.group
    pages = (
        [f'<a href="{escape(base)}?{escape(query_string(request))}">first page</a>'] if query.after else []
    )
    if after is not None:
        more = escape(query_string(request, after=after.token()))
        pages.append(f'<a class="next" href="{escape(base)}?{more}">next page (older) →</a>')
    shown = (
        f"<p class='muted'>{len(rows)} dead letters on this page, newest first"
        f"{' (after the page before)' if query.after else ''}; "
        f"{'more on the next page' if after else 'no more'}.</p>"
        if rows
        else "<p class='muted none'>No dead letter of this group matches the filter.</p>"
    )
    body = (
        f'<p><a href="{escape(overview)}?group={escape(quote(group, safe=""))}">← every group</a></p>'
        + filter_form(request, base)
        + shown
        + f'<form class="select" method="post" action="{escape(base)}/redrive">'
        + (letters_table(rows, request, base) if rows else "")
        + actions(request, base, refusal)
        + "</form>"
        + f"<p class='pages'>{' '.join(pages)}</p>"
    )
    return _page(f"Dead letters of {group}", body)


def _when_text(value) -> str:
    """An attempt's time (ISO text in the history) as the page writes times."""
    try:
        return when(datetime.fromisoformat(str(value)))
    except ValueError:
        return str(value)


def _body(letter: dict) -> str:
    size, shown = letter["body_size"], letter["body_shown"]
    kind = escape(letter["content_type"])
    if letter["body_hex"] is not None:
        previewed = len(letter["body_hex"].split())
        return (
            f"<p class='muted'>{kind}, {number(size)} bytes: the first {number(previewed)} as hex.</p>"
            f"<pre class='body hex'>{escape(letter['body_hex'])}</pre>"
        )
    cut = (
        f" Only the first {number(shown)} bytes are shown (at most {number(BODY_PREVIEW_BYTES)})."
        if shown < size
        else ""
    )
    text = escape(letter["body_text"])
    return f"<p class='muted'>{kind}, {number(size)} bytes.{cut}</p><pre class='body'>{text}</pre>"


def message_page(letter: dict, query: Query, base: str, ui_root: str, refusal: str | None) -> str:
    """One dead letter in full (``dead_letters.message``): its fields, last error, body,
    properties (those the broker adds marked), attempts and redrives, and the selection's actions
    for it alone. ``base``: the list's path; ``ui_root``: the Airflow UI's root path (run links)."""
    mid, request = letter["message_id"], query.filter
    fields = [
        ("message id", mid), ("key", letter["key"]), ("topic", letter["topic"]),
        ("dead-letter queue", letter["dead_letter_queue"]), ("reason", letter["reason"]),
        ("delivery count", letter["delivery_count"]), ("reconsume times", letter["reconsume_times"]),
        ("redrive count", letter["redrive_count"]), ("origin message id", letter["origin_message_id"]),
        ("published at", letter["published_at"]), ("first failure at", letter["first_failure_at"]),
        ("last failure at", letter["last_failure_at"]), ("dead-lettered at", letter["dead_lettered_at"]),
        ("failure signature", letter["signature"]), ("error class", letter["error_class"] or "(text)"),
        ("top frame", letter["error_frame"]),
    ]  # fmt: skip
    properties = [
        [name, Html(f"{escape(value)} <span class='broker'>(added on redelivery)</span>")]
        if name in RETRY_PROPERTIES
        else [name, value]
        for name, value in letter["properties"].items()
    ]
    attempts = [[_when_text(a.get("at")), a.get("delivery"), a.get("outcome"), a.get("error"),
                 a.get("signature")] for a in letter["attempts"]]  # fmt: skip
    redrives = [[run_link(r["run_key"], ui_root, ()), r["triggered_by"], r["moved_at"], r["destination_topic"]
                 or "its own topic"] for r in letter["redrives"]]  # fmt: skip
    holds = ""
    if letter.get("halting"):
        behind = letter["behind"] or 0
        holds = (
            "<p class='halting'><b>It holds its key</b> (an ordered subscription with on_exhausted halt): "
            f"{_plural(behind, 'message', 'messages')} of the key wait behind it, BLOCKED, until it is "
            "redriven (a redrive to its own topic delivers it first).</p>"
        )
    body = (
        f'<p><a href="{escape(base)}?{escape(query_string(request))}">← the list</a></p>'
        + holds
        + table(["field", "value"], [list(f) for f in fields])
        + failed_again(letter)
        + f"<h2>Last error</h2><pre class='error'>{escape(letter['last_error'] or '')}</pre>"
        + (f"<pre class='stack'>{escape(letter['error_stack'])}</pre>" if letter["error_stack"] else "")
        + f"<h2>Body</h2>{_body(letter)}"
        + "<h2>Properties</h2>"
        + (table(["name", "value"], properties) if properties else "<p class='muted'>none</p>")
        + f"<h2>Failed deliveries</h2><p class='muted'>The last {len(attempts)} kept (at most 20).</p>"
        + table(["at", "delivery", "outcome", "error", "signature"], attempts)
        + "<h2>Redrives</h2>"
        + (
            table(["run", "triggered by", "moved at", "to"], redrives)
            if redrives
            else "<p class='muted'>never</p>"
        )
        + f'<h2>Act on it</h2><form class="select" method="post" action="{escape(base)}/redrive">'
        + actions(request, base, refusal, selected=[mid])
        + "</form>"
    )
    return _page(f"Dead letter {mid} of {request.group}", body)


def failed_again(letter: dict) -> str:
    """For a dead letter redriven before (issue 40): it failed again after redrive N, with the
    signature of the failure before the latest redrive and of this one, and whether they are the
    same (a fix that did not work) or not; '' for one never redriven."""
    if not letter["redrive_count"]:
        return ""
    before, now = letter["signature_before_redrive"], letter["signature"]
    verdict = (
        "the failure before it has no signature in its history (recorded before signatures, or no "
        "longer among the last 20)"
        if before is None or now is None
        else "the same failure as before: the fix did not hold"
        if before == now
        else "another failure than before"
    )
    return (
        f"<p class='failed-again'><b>Failed again after redrive {letter['redrive_count']}</b>: "
        f"signature before {escape(before or '?')}, now {escape(now or '?')} ({verdict}).</p>"
    )


def problems_page(title: str, problems: list[str], back: str | None = None) -> str:
    """A refused address or form: every problem on a line of its own; nothing was read or changed."""
    lines = "".join(f"<li>{escape(problem)}</li>" for problem in problems)
    link = f"<p><a href='{escape(back)}'>Back</a></p>" if back else ""
    return _page(title, f"<ul class='refused'>{lines}</ul><p class='muted'>Nothing was changed.</p>{link}")
