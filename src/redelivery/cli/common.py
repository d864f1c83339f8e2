"""What the ``redelivery`` commands share: the Typer apps, the client and schema set-up, output, and
the dead-letter filter options."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated

import typer

app = typer.Typer(
    help="Batch retry and dead-letter queues for data pipelines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The state store (PostgreSQL).", no_args_is_help=True)
dlq_app = typer.Typer(help="Dead-letter queues.", no_args_is_help=True)
tier_app = typer.Typer(help="Tier windows.", no_args_is_help=True)
policy_app = typer.Typer(help="Retry and dead-letter policies.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(dlq_app, name="dlq")
app.add_typer(tier_app, name="tier")
app.add_typer(policy_app, name="policy")


def _migrated() -> None:
    """Start the embedded PostgreSQL if needed and bring the schema up to date."""
    from redelivery.store.db import migrate

    migrate()


def _client():
    from redelivery.client import Client

    _migrated()
    return Client()


def _emit(data, as_json: bool, text: str | None = None) -> None:
    if as_json or text is None:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        typer.echo(text)


def _emit_lines(lines) -> None:
    """JSON ``lines`` (each one JSON value on one line, e.g. ``dead_letters.json_line``'s) as a JSON
    array, a line each, as they come: printed as they are, never parsed and written again."""
    first = True
    for line in lines:
        typer.echo(("[" if first else ",\n ") + line, nl=False)
        first = False
    typer.echo("[]" if first else "]")


def _filter(group, topic, since, before, reason, error_contains, message_id, key=None, **extra):
    from redelivery.dead_letters import DlqFilter
    from redelivery.redrive import RedriveRequest

    values = dict(
        group=group,
        topic=topic,
        dead_lettered_from=since,
        dead_lettered_to=before,
        reasons=reason or [],
        error_contains=error_contains,
        message_ids=message_id or [],
        key=key,
    )
    return (RedriveRequest if extra else DlqFilter)(**values, **extra)  # pydantic names a bad option


GroupOpt = Annotated[str, typer.Option(help="consumer group")]
TopicOpt = Annotated[str | None, typer.Option(help="only this topic")]
SinceOpt = Annotated[datetime | None, typer.Option("--from", help="dead-lettered at or after (ISO time)")]
BeforeOpt = Annotated[datetime | None, typer.Option("--to", help="dead-lettered before (ISO time)")]
ReasonOpt = Annotated[
    list[str] | None,
    typer.Option(
        help="MAX_DELIVERIES_EXCEEDED, LEASE_EXPIRED, REJECTED, NEGATIVE_LEVEL, UNDECODABLE; repeatable"
    ),
]
ErrorOpt = Annotated[str | None, typer.Option(help="last error contains this text (case-insensitive)")]
IdOpt = Annotated[list[int] | None, typer.Option("--message-id", help="only these message ids; repeatable")]
KeyOpt = Annotated[str | None, typer.Option(help="only dead letters with exactly this message key")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]
