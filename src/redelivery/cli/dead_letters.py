"""``redelivery dlq list|show|count|summary`` and ``redelivery redrive``: dead letters by the
filter the redrive uses (one definition: ``redelivery.dead_letters.DlqFilter``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from redelivery.cli.common import (
    BeforeOpt,
    ErrorOpt,
    GroupOpt,
    IdOpt,
    JsonOpt,
    KeyOpt,
    ReasonOpt,
    SinceOpt,
    TopicOpt,
    _emit,
    _emit_lines,
    _filter,
    _migrated,
    app,
    dlq_app,
)
from redelivery.errors import RedeliveryError


@dlq_app.command("list")
def dlq_list(
    group: GroupOpt,
    topic: TopicOpt = None,
    since: SinceOpt = None,
    before: BeforeOpt = None,
    reason: ReasonOpt = None,
    error_contains: ErrorOpt = None,
    message_id: IdOpt = None,
    key: KeyOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 20,
    as_json: JsonOpt = False,
) -> None:
    """The oldest dead letters of a group that match the filters."""
    from redelivery.dead_letters import export, jsonable, select
    from redelivery.store.db import connect

    request = _filter(group, topic, since, before, reason, error_contains, message_id, key)
    _migrated()
    with connect() as conn:
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
def dlq_show(message_id: int, group: GroupOpt, as_json: JsonOpt = False) -> None:
    """One dead letter in full: body, properties, counts and its attempt history."""
    from redelivery.dead_letters import export
    from redelivery.store.db import connect

    _migrated()
    with connect() as conn:
        lines = list(export(conn, _filter(group, None, None, None, None, None, [message_id]), limit=1))
    if not lines:
        raise RedeliveryError(f"no dead letter {message_id} in group {group!r}")
    typer.echo(lines[0])  # its body as stored (``dead_letters.json_line``)


@dlq_app.command("count")
def dlq_count(
    group: GroupOpt,
    topic: TopicOpt = None,
    since: SinceOpt = None,
    before: BeforeOpt = None,
    reason: ReasonOpt = None,
    error_contains: ErrorOpt = None,
    message_id: IdOpt = None,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """How many dead letters of a group match the filters."""
    from redelivery.dead_letters import count
    from redelivery.store.db import connect

    _migrated()
    with connect() as conn:
        n = count(conn, _filter(group, topic, since, before, reason, error_contains, message_id, key))
    _emit({"group": group, "count": n}, as_json, str(n))


@dlq_app.command("summary")
def dlq_summary(
    group: Annotated[str | None, typer.Option(help="one group (default: all)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Per group: count, oldest, DLQs, top reasons and errors."""
    from redelivery.dead_letters import summary
    from redelivery.store.db import connect

    _migrated()
    with connect() as conn:
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
def redrive_command(
    group: GroupOpt,
    topic: TopicOpt = None,
    since: SinceOpt = None,
    before: BeforeOpt = None,
    reason: ReasonOpt = None,
    error_contains: ErrorOpt = None,
    message_id: IdOpt = None,
    key: KeyOpt = None,
    max_messages: Annotated[int | None, typer.Option(min=1, help="move at most this many")] = None,
    rate_limit: Annotated[float | None, typer.Option(min=0.001, help="messages per second")] = 500.0,
    destination_topic: Annotated[str | None, typer.Option(help="default: the original topic")] = None,
    reset_reconsume_times: Annotated[
        bool,
        typer.Option(
            "--reset-reconsume-times/--keep-reconsume-times",
            help="restore the retry budget (the delivery count is never reset)",
        ),
    ] = True,
    execute: Annotated[bool, typer.Option("--execute", help="really move (default: dry run)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Move dead letters back to READY: a dry run unless --execute."""
    import getpass

    from redelivery.redrive import redrive, summary_line

    request = _filter(
        group,
        topic,
        since,
        before,
        reason,
        error_contains,
        message_id,
        key,
        max_messages=max_messages,
        rate_limit=rate_limit,
        destination_topic=destination_topic,
        reset_reconsume_times=reset_reconsume_times,
        dry_run=not execute,
    )
    _migrated()
    result = redrive(
        request,
        run_key=f"cli/{datetime.now(UTC).isoformat()}",
        triggered_by=getpass.getuser(),
        log=lambda line: typer.echo(line, err=True),
    )
    _emit(result, as_json, f"group {group}: {summary_line(result)} (audit run {result['run_key']})")
