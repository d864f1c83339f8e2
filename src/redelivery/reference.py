"""The configuration reference, generated: the ``REDELIVERY_*`` environment (``redelivery.settings``)
and every key of the config file (``redelivery.config``, the policies of ``redelivery.rules``) as
Markdown tables, from the models' fields: name, type and bounds, default, description.

docs/configuration.md holds the tables between marker comments, hand-written text around them;
``python -m redelivery.reference docs/configuration.md`` writes the tables in (``make
docs-reference``), ``--check`` only says whether the page is current (a test runs it: a new setting
or key, or a changed default, fails until the page is written again). A field without a description
is an error, so that no row says nothing. A field's ``default_text`` (in ``json_schema_extra``) is
shown instead of its default where the value alone would mislead (computed, or unset with a
meaning)."""

from __future__ import annotations

import re
import sys
import types
import typing
from pathlib import Path

from annotated_types import MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from redelivery.config import RedeliveryConfig
from redelivery.settings import Settings

#: The generated parts of the page: each between its begin and end comment.
SECTIONS = ("settings", "config")
BEGIN = "<!-- generated: {name} (python -m redelivery.reference; edit the models' descriptions) -->"
END = "<!-- end of generated: {name} -->"


def _args(annotation) -> tuple:
    return tuple(a for a in typing.get_args(annotation) if a is not type(None))


def _is_union(annotation) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _models(annotation) -> list[type[BaseModel]]:
    """The models an annotation holds: itself, an optional one, a list's, a union's members."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if _is_union(annotation) or typing.get_origin(annotation) is list:
        return [model for arg in _args(annotation) for model in _models(arg)]
    return []


def _type_name(annotation) -> str:
    if typing.get_origin(annotation) is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if _is_union(annotation):
        names = [_type_name(arg) for arg in _args(annotation)]
        return " or ".join(dict.fromkeys(names))
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        return f"list of {_type_name(item)}"
    if typing.get_origin(annotation) is dict:
        return "JSON object"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return {str: "text", int: "integer", float: "number", bool: "boolean", Path: "path"}.get(
        annotation, getattr(annotation, "__name__", str(annotation))
    )


def _bounds(info: FieldInfo) -> str:
    """The field's bounds as text (``>= 0, <= 100``, ``at least 1``, a pattern), or nothing."""
    parts = []
    for item in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{sign} {value:,}" if isinstance(value, int) else f"{sign} {value}")
        if isinstance(item, MinLen):
            parts.append(f"at least {item.min_length}")
        if getattr(item, "pattern", None):
            parts.append(f"`{item.pattern}`")
    return ", ".join(parts)


def _default(info: FieldInfo) -> str:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "default_text" in extra:
        return str(extra["default_text"])
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, BaseModel):
        return "below"
    if value == "":
        return '`""`'
    return f"`{value}`"


def _description(owner: str, name: str, info: FieldInfo) -> str:
    if not info.description:
        raise ValueError(f"{owner}.{name} has no description: the reference would say nothing of it")
    return " ".join(info.description.split())


def _row(*cells: str) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


def _type_cell(info: FieldInfo) -> str:
    bounds = _bounds(info)
    return _type_name(info.annotation) + (f" ({bounds})" if bounds else "")


def settings_table() -> str:
    """One row per ``REDELIVERY_*`` variable: the fields of ``Settings``."""
    lines = [_row("variable", "type", "default", "meaning"), "|---|---|---|---|"]
    for name, info in Settings.model_fields.items():
        lines.append(
            _row(
                f"`REDELIVERY_{name.upper()}`",
                _type_cell(info),
                _default(info),
                _description("Settings", name, info),
            )
        )
    return "\n".join(lines)


def _config_rows(model: type[BaseModel], prefix: str, note: str = "") -> list[str]:
    rows = []
    for name, info in model.model_fields.items():
        if typing.get_origin(info.annotation) is typing.Literal and name == "kind":
            continue  # a union member's discriminator: its own row, below
        key = f"{prefix}{name}"
        rows.append(
            _row(
                f"`{key}`{note}",
                _type_cell(info),
                _default(info),
                _description(model.__name__, name, info),
            )
        )
        members = _models(info.annotation)
        inner = f"{key}[]." if typing.get_origin(info.annotation) is list else f"{key}."
        if len(members) == 1:
            rows.extend(_config_rows(members[0], inner))
        for member in members if len(members) > 1 else ():
            kind = typing.get_args(member.model_fields["kind"].annotation)[0]
            doc = " ".join((member.__doc__ or "").split())
            rows.append(_row(f"`{inner}kind: {kind}`", "", "", doc))
            rows.extend(_config_rows(member, inner, f" (kind `{kind}`)"))
    return rows


def config_table() -> str:
    """One row per key of the config file, nested keys as paths (``tiers[].window``)."""
    lines = [_row("key", "type", "default", "meaning"), "|---|---|---|---|"]
    lines.extend(_config_rows(RedeliveryConfig, ""))
    return "\n".join(lines)


def render(page: str) -> str:
    """``page`` with every generated part written anew between its markers."""
    tables = {"settings": settings_table, "config": config_table}
    for name in SECTIONS:
        begin, end = BEGIN.format(name=name), END.format(name=name)
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
        if len(pattern.findall(page)) != 1:
            raise ValueError(f"the page needs exactly one generated part {name!r}: {begin} ... {end}")
        page = pattern.sub(lambda _, n=name, b=begin, e=end: f"{b}\n{tables[n]()}\n{e}", page)
    return page


def main(argv: list[str] | None = None) -> int:
    """``python -m redelivery.reference PAGE [--check]``: write the tables into PAGE, or (--check)
    exit 1 when PAGE is not what they render."""
    args = sys.argv[1:] if argv is None else argv
    check = "--check" in args
    paths = [a for a in args if a != "--check"]
    if len(paths) != 1:
        print("usage: python -m redelivery.reference PAGE [--check]", file=sys.stderr)
        return 2
    path = Path(paths[0])
    page = path.read_text()
    rendered = render(page)
    if rendered == page:
        return 0
    if check:
        print(f"{path} is not current: run `make docs-reference`", file=sys.stderr)
        return 1
    path.write_text(rendered)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
