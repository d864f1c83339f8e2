"""What the ``redelivery`` commands share: the Typer apps, the client and schema set-up, output, and
the options of a request model's fields (``with_fields``: one declaration, ``redelivery.fields``)."""

from __future__ import annotations

import inspect
import json
from typing import Annotated

import typer
from pydantic import BaseModel

from redelivery.fields import REQUIRED, form_fields, split_many


def command_group(help_text: str, **kwargs) -> typer.Typer:
    """A Typer app of ``redelivery``'s: its help (and no arguments) shows its commands. Click's
    plain help formatter, not Rich's panels: Rich cut option names at 80 columns
    (``--dead-lettered-…``); Click's wraps the descriptions and keeps every name whole."""
    return typer.Typer(help=help_text, no_args_is_help=True, rich_markup_mode=None, **kwargs)


app = command_group("Batch retry and dead-letter queues for data pipelines.", pretty_exceptions_enable=False)
db_app = command_group("The state store (PostgreSQL).")
dlq_app = command_group("Dead-letter queues.")
tier_app = command_group("Tier windows.")
policy_app = command_group("Retry and dead-letter policies.")
app.add_typer(db_app, name="db")
app.add_typer(dlq_app, name="dlq")
app.add_typer(tier_app, name="tier")
app.add_typer(policy_app, name="policy")


def _migrated() -> None:
    """Start the embedded PostgreSQL if needed and bring the schema up to date."""
    from redelivery.store.db import migrate

    migrate()


def _client(reading: bool = False):
    """A ``Client`` of the state store, migrated first; ``reading``: a read-only command's, whose
    statements are cancelled after ``REDELIVERY_READ_TIMEOUT`` seconds (``db.read_url``)."""
    from redelivery.client import Client
    from redelivery.store.db import database_url, read_url

    _migrated()
    return Client(read_url(database_url()) if reading else None)


def _reading():
    """A connection of a read-only command (``db.read_url``: ``REDELIVERY_READ_TIMEOUT``), after
    the migrations."""
    from redelivery.store.db import connect, database_url, read_url

    _migrated()
    return connect(read_url(database_url()))


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


_OPTION_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list[str]}


def field_parameters(
    model: type[BaseModel],
    include: tuple[str, ...] | None = None,
    exclude: tuple[str, ...] = (),
    defaults: dict | None = None,
) -> list[inspect.Parameter]:
    """A request model's fields (``redelivery.fields.form_fields``) as Typer options: ``--<field
    name>`` with ``-`` for ``_`` (a yes/no field ``--<name>/--no-<name>``), the field's description
    as help, its operator default (``defaults``: a command's own). Times and lists are taken as
    text: pydantic reads them, so its one-line error names the field."""
    parameters = []
    for field in form_fields(model, include, exclude):
        default = (defaults or {}).get(field.name, field.default)
        flag = "--" + field.name.replace("_", "-")
        help_text = field.description
        if field.choices:
            help_text += f" One of {', '.join(map(str, field.choices))}."
        if field.many:
            help_text += " Repeatable, or separated by commas."
        declared = f"{flag}/--no-{flag[2:]}" if field.kind == "boolean" else flag
        python_type = _OPTION_TYPES[field.kind]
        if default is not REQUIRED and field.kind != "boolean":
            python_type = python_type | None
        option = typer.Option(declared, help=help_text, show_default=not field.many)
        annotation = Annotated[python_type, option]
        shown = inspect.Parameter.empty if default is REQUIRED else None if field.many else default
        parameters.append(inspect.Parameter(field.name, _KEYWORD, default=shown, annotation=annotation))
    return parameters


_KEYWORD = inspect.Parameter.KEYWORD_ONLY


def with_fields(
    model: type[BaseModel],
    include: tuple[str, ...] | None = None,
    exclude: tuple[str, ...] = (),
    defaults: dict | None = None,
):
    """A command taking ``model``'s fields as options (``field_parameters``) besides its own
    parameters: the command is called with ``fields``, the options given as a dict for the model
    (lists split by commas, ``None`` for an absent list)."""

    def decorate(command):
        own = [
            p.replace(kind=_KEYWORD)
            for p in inspect.signature(command, eval_str=True).parameters.values()
            if p.name != "fields"
        ]
        from_model = field_parameters(model, include, exclude, defaults)
        names = [p.name for p in from_model]

        def run(**given):
            values = {name: given.pop(name) for name in names}
            values = {k: split_many(v) if isinstance(v, list) else v for k, v in values.items()}
            return command(fields={k: v for k, v in values.items() if v is not None}, **given)

        arguments = [p for p in own if p.default is inspect.Parameter.empty]
        rest = [p for p in own if p.default is not inspect.Parameter.empty]
        run.__signature__ = inspect.Signature([*arguments, *from_model, *rest])
        run.__name__, run.__doc__, run.__module__ = command.__name__, command.__doc__, command.__module__
        return run

    return decorate


JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]

#: Options renamed (old -> new) when the request models' fields became the options (issue 30).
RENAMED_OPTIONS = {
    "--execute": "--no-dry-run",
    "--keep-reconsume-times": "--no-reset-reconsume-times",
    "--from": "--dead-lettered-from",
    "--to": "--dead-lettered-to",
    "--reason": "--reasons",
    "--message-id": "--message-ids",
}


def renamed_option(exc: Exception) -> str | None:
    """The one line for an option given under its old name (Click's ``NoSuchOption`` of a
    ``RENAMED_OPTIONS`` name whose new name the command takes): both names; else None."""
    old, ctx = getattr(exc, "option_name", None), getattr(exc, "ctx", None)
    new = RENAMED_OPTIONS.get(old)
    if new is None or ctx is None:
        return None
    takes = {name for param in ctx.command.params for name in (*param.opts, *param.secondary_opts)}
    if new not in takes:
        return None
    return f"no such option {old}: it was renamed {new} (`{ctx.command_path} --help` lists the options)"
