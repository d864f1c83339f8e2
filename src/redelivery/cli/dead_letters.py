"""``redelivery dlq list|show|count|groups|summary`` and ``redelivery redrive``: dead letters by the
filter the redrive uses. Their options are the fields of ``redelivery.dead_letters.DlqFilter`` and
``redelivery.redrive.RedriveRequest`` under the same names (``with_fields``): one declaration."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from redelivery.cli.common import JsonOpt, _emit, _emit_lines, _migrated, _reading, app, dlq_app, with_fields
from redelivery.dead_letters import DlqFilter
from redelivery.errors import RedeliveryError
from redelivery.redrive import RedriveRequest


@dlq_app.command("list")
@with_fields(DlqFilter)
def dlq_list(
    fields: dict,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="at most this many")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """The oldest dead letters of a group that match the filters."""
    from redelivery.dead_letters import export, jsonable, select

    request = DlqFilter(**fields)  # pydantic names a bad option
    with _reading() as conn:
        if as_json:  # the download's lines: each JSON body as stored, every number as written
            _emit_lines(export(conn, request, limit))
            return
        rows = jsonable(select(conn, request, limit=limit, with_body=True))
    text = (
        "\n".join(
            f"{r['message_id']:>10} {r['dead_letter_queue']:<24} {r['reason']:<24} "
            f"reconsumed {r['reconsume_times']:>2}x  {r['last_error'] or ''}"
            for r in rows
        )
        or "(no dead letters)"
    )
    _emit(rows, as_json, text)


@dlq_app.command("show")
@with_fields(DlqFilter, include=("group",))
def dlq_show(message_id: int, fields: dict, as_json: JsonOpt = False) -> None:
    """One dead letter in full: body, properties, counts and its attempt history."""
    from redelivery.dead_letters import export

    request = DlqFilter(**fields, message_ids=[message_id])
    with _reading() as conn:
        lines = list(export(conn, request, limit=1))
    if not lines:
        raise RedeliveryError(f"no dead letter {message_id} in group {request.group!r}")
    typer.echo(lines[0])  # its body as stored (``dead_letters.json_line``)


@dlq_app.command("count")
@with_fields(DlqFilter)
def dlq_count(fields: dict, as_json: JsonOpt = False) -> None:
    """How many dead letters of a group match the filters."""
    from redelivery.dead_letters import count

    request = DlqFilter(**fields)
    with _reading() as conn:
        n = count(conn, request)
    _emit({"group": request.group, "count": n}, as_json, str(n))


@dlq_app.command("groups")
@with_fields(DlqFilter)
def dlq_groups(
    fields: dict,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="at most this many signatures")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """The dead letters of a group that match the filters, grouped by failure signature."""
    from redelivery.dead_letters import groups, jsonable

    request = DlqFilter(**fields)
    with _reading() as conn:
        rows = jsonable(groups(conn, request, limit))
    text = (
        "\n".join(
            f"{r['signature'] or '(none)':<12} {r['count']:>8}  {r['first_dead_lettered_at']}"
            f" .. {r['last_dead_lettered_at']}"
            f"  {','.join(r['topics'])}  {r['error_class'] or '(text)'}  {r['last_error'] or ''}"
            f"{'  at ' + r['error_frame'] if r['error_frame'] else ''}"
            for r in rows
        )
        or "(no dead letters)"
    )
    _emit(rows, as_json, text)


@dlq_app.command("summary")
def dlq_summary(
    group: Annotated[str | None, typer.Option(help="one group (default: all)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Per group: count, oldest, DLQs, top reasons and errors."""
    from redelivery.dead_letters import summary

    with _reading() as conn:
        data = summary(conn, group)
    text = (
        "\n".join(
            f"{g['group']}: {g['count']} dead letters since {g['oldest']}; "
            + ", ".join(f"{r['value']} {r['count']}" for r in g["top_reasons"])
            for g in data
        )
        or "(no dead letters)"
    )
    _emit(data, as_json, text)


@app.command("redrive")
@with_fields(RedriveRequest)
def redrive_command(fields: dict, as_json: JsonOpt = False) -> None:
    """Move dead letters back to READY: a dry run unless --no-dry-run."""
    import getpass

    from redelivery.redrive import redrive, summary_line

    request = RedriveRequest(**fields)
    _migrated()
    result = redrive(
        request,
        run_key=f"cli/{datetime.now(UTC).isoformat()}",
        triggered_by=getpass.getuser(),
        log=lambda line: typer.echo(line, err=True),
    )
    _emit(result, as_json, f"group {request.group}: {summary_line(result)} (audit run {result['run_key']})")
