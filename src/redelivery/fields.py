"""A request model's fields as every form takes them: the one declaration of a request
(``DlqFilter``, ``RedriveRequest``, ``TierRunRequest``: pydantic models) and the forms derived from
it, so that a field added to a model appears everywhere under its own name. The Airflow Params
(``redelivery.airflow.params.params_of``), the CLI options (``redelivery.cli.common.with_fields``), the
operator page's inputs and address (``redelivery.airflow.ui.dead_letter_pages``) and the SQL
parameters of the dead-letter filter all read ``form_fields``.

What a field declares, in ``pydantic.Field``: its type and bounds (JSON schema), ``title`` (a
form's label), ``description`` (help, one sentence or two), and in ``json_schema_extra``
``operator_default``, the default a person sees in a form or on the command line when it differs
from the API's (a redrive's rate limit: 500 messages per second for a person, no limit for code).

Two rules every form applies: a blank text is no value (a form cannot send None), and an array
takes its values repeated or separated by commas or spaces.

A time field is declared ``Time`` or ``AwareTime`` (a zone required): ISO 8601 text or a
``datetime``, never a number, so that a time means one thing on every surface (pydantic's lax
``datetime`` reads ``20261120`` as Unix seconds, 1970-08-23; the Params' RFC 3339 refuses it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from pydantic import AwareDatetime, BaseModel, BeforeValidator

#: A field without a default: the form must be given it.
REQUIRED = object()


def iso_8601_only(value: Any) -> Any:
    """A time field's first check: ``value`` as given when it is not a number, for pydantic to
    read as ISO 8601 text (or a ``datetime``); raises ``ValueError`` for a number, or a text of
    one (``20261120``, ``1763596800``), which pydantic would read as Unix seconds."""
    if isinstance(value, bytes | bytearray):
        value = value.decode(errors="replace")
    number = isinstance(value, int | float | Decimal)
    if isinstance(value, str):
        try:
            float(value)
            number = True
        except ValueError:
            pass
    if number:
        raise ValueError(
            f"an ISO 8601 time is needed, e.g. 2026-11-20T00:00:00Z: a number ({str(value).strip()}) "
            "is never read as a date or as Unix seconds"
        )
    return value


#: A time: ISO 8601 text or a ``datetime`` (``iso_8601_only``); without a zone, as the model says.
Time = Annotated[datetime, BeforeValidator(iso_8601_only)]
#: A time with its zone: ISO 8601 text with an offset or ``Z``, or an aware ``datetime``.
AwareTime = Annotated[AwareDatetime, BeforeValidator(iso_8601_only)]


@dataclass(frozen=True)
class FormField:
    """One field of a request model as a form takes it. ``schema``: the value's JSON schema (a
    nullable field's ``type`` is ``["null", <type>]``, and a nullable text with a ``pattern`` also
    takes a blank); ``kind``: its JSON type (``"string"``, ``"integer"``, ``"number"``,
    ``"boolean"``, ``"array"``), ``item_kind`` and ``choices`` those of an array's items (or of a
    text's ``enum``); ``default``: what a form shows first (``REQUIRED`` when it must be given)."""

    name: str
    title: str
    description: str
    schema: dict
    kind: str
    item_kind: str | None
    choices: tuple | None
    default: Any
    nullable: bool

    @property
    def many(self) -> bool:
        return self.kind == "array"

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def is_time(self) -> bool:
        return self.schema.get("format") == "date-time"


def form_fields(
    model: type[BaseModel], include: tuple[str, ...] | None = None, exclude: tuple[str, ...] = ()
) -> list[FormField]:
    """The fields of ``model`` (in declaration order; ``include``: only these, in this order;
    ``exclude``: not these) as ``FormField``. Raises ``KeyError`` for a name ``include`` gives that
    the model lacks."""
    schema = model.model_json_schema(mode="validation")
    properties, required = schema["properties"], set(schema.get("required", ()))
    names = include if include is not None else tuple(properties)
    return [
        _form_field(model, name, properties[name], name in required) for name in names if name not in exclude
    ]


def _form_field(model: type[BaseModel], name: str, declared: dict, required: bool) -> FormField:
    value_schema, nullable = _without_null(declared)
    info = model.model_fields[name]
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if required:
        default = REQUIRED
    elif "operator_default" in extra:
        default = extra["operator_default"]
    else:
        default = info.get_default(call_default_factory=True)
    if nullable and value_schema.get("type") == "string" and "pattern" in value_schema:
        value_schema["pattern"] = f"^$|{value_schema['pattern']}"  # a blank is no value
    kind = value_schema["type"]
    items = value_schema.get("items", {})
    choices = items.get("enum") if kind == "array" else value_schema.get("enum")
    schema = {**value_schema, "type": ["null", kind] if nullable else kind}
    return FormField(
        name=name,
        title=info.title or name.replace("_", " ").capitalize(),
        description=info.description or "",
        schema=schema,
        kind=kind,
        item_kind=items.get("type") if kind == "array" else None,
        choices=tuple(choices) if choices else None,
        default=default,
        nullable=nullable,
    )


#: Keys of a field's schema that say what it is, not what values it takes.
_ANNOTATIONS = ("title", "description", "default", "operator_default")


def _without_null(declared: dict) -> tuple[dict, bool]:
    """A field's value schema without its ``null`` branch (pydantic writes ``X | None`` as
    ``anyOf: [X, {"type": "null"}]``) and whether it had one; the field's own keywords
    (``json_schema_extra``) kept."""
    own = {k: v for k, v in declared.items() if k not in (*_ANNOTATIONS, "anyOf")}
    branches = declared.get("anyOf")
    if branches is None:
        return own, False
    values = [b for b in branches if b.get("type") != "null"]
    if len(values) != 1:
        raise TypeError(f"a form field takes one type or None, not {branches}")
    return {**values[0], **own}, len(values) < len(branches)


def split_many(values: list[str]) -> list[str]:
    """An array's values as a form gives them: repeated, or separated by commas or spaces."""
    return [part for value in values for part in value.replace(",", " ").split()]


def query_pairs(request: BaseModel) -> list[tuple[str, str]]:
    """``request``'s non-empty fields as an address's (name, value) pairs, in the model's order:
    what a form reads back as the same request (a list of choices repeated, another list
    separated by commas: ``split_many``; a time in ISO 8601)."""
    pairs: list[tuple[str, str]] = []
    for field in form_fields(type(request)):
        name, value = field.name, getattr(request, field.name)
        if field.many and field.choices:
            pairs += [(name, str(v)) for v in value]
        elif field.many and value:
            pairs.append((name, ",".join(str(v) for v in value)))
        elif isinstance(value, datetime):
            pairs.append((name, value.isoformat()))
        elif value:
            pairs.append((name, value))
    return pairs


def query_string(request: BaseModel, **more: str) -> str:
    """The address's query of ``request`` (``query_pairs``), then ``more``."""
    return urlencode(query_pairs(request) + list(more.items()), quote_via=quote)


__all__ = [
    "AwareTime",
    "FormField",
    "REQUIRED",
    "Time",
    "form_fields",
    "iso_8601_only",
    "query_pairs",
    "query_string",
    "split_many",
]
