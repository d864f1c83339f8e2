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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

#: A field without a default: the form must be given it.
REQUIRED = object()


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


__all__ = ["FormField", "REQUIRED", "form_fields", "split_many"]
