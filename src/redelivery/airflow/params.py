"""A DAG run's conf checked against its DAG's Params: every problem, one line each.

Airflow 3.3 validates a run's conf Param by Param and stops at the first failure (with a dump of
the JSON schema), and accepts keys that no Param declares without a word, so that a misspelt
``max_mesages`` would leave a redrive without its cap. ``conf_problems`` lists an unknown key
(with the closest known one) and every Param its value fails, for the trigger refusal
(``redelivery.airflow.ui.trigger_check``), the page's form and each task's first step
(``check_run_conf``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from redelivery.fields import form_fields

#: The longest value quoted in a problem.
QUOTED_CHARS = 80


def _quoted(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= QUOTED_CHARS else text[: QUOTED_CHARS - 3] + "..."


def params_of(
    model: type[BaseModel],
    include: tuple[str, ...] | None = None,
    defaults: Mapping[str, Any] | None = None,
    refine: Mapping[str, dict] | None = None,
) -> dict:
    """The Airflow Params of a request model's fields (``redelivery.fields.form_fields``: ``include``
    only, in its order): each field's JSON schema, title, description and default, so that the
    trigger form and a REST trigger are refused before a run starts. ``defaults``: a DAG's own
    default of a field (a required field given one becomes nullable: the DAG fills it in);
    ``refine``: schema keywords a DAG narrows (a tier's own levels), or its own ``description``."""
    from airflow.sdk import Param

    defaults, refine, params = dict(defaults or {}), dict(refine or {}), {}
    for field in form_fields(model, include):
        narrowed = dict(refine.get(field.name, {}))
        description = narrowed.pop("description", field.description)
        schema = {**field.schema, **narrowed}
        default = defaults.get(field.name, field.default)
        if field.name in defaults and field.required and default is None:
            schema["type"] = ["null", field.kind]
        args = () if field.required and field.name not in defaults else (default,)
        params[field.name] = Param(*args, title=field.title, description=description, **schema)
    return params


def unknown_key(key: str, known: list[str]) -> str:
    """The line for a conf key no Param declares, naming the closest known key, if any."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"
    return f"{key}: unknown key{hint}"


def schema_problem(key: str, schema: dict, value: Any) -> str | None:
    """The line for ``value`` of Param ``key`` if its JSON schema refuses it (the most relevant of
    jsonschema's errors, as Airflow checks it: formats included), else None."""
    from jsonschema import FormatChecker
    from jsonschema.exceptions import best_match
    from jsonschema.validators import validator_for

    validator = validator_for(schema)(schema, format_checker=FormatChecker())
    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "".join(f"[{p!r}]" for p in error.absolute_path)
    # jsonschema's message quotes the value whole: a refused 100,000-character text, shortened
    message = error.message.splitlines()[0].replace(repr(error.instance), _quoted(error.instance))
    return f"{key}{where}: {message}"


def conf_problems(params: Mapping, conf: Mapping | None) -> list[str]:
    """Every problem of ``conf`` (a run's conf) against ``params`` (a DAG's ``ParamsDict``, SDK
    or serialized: anything with ``get_param(key)`` giving ``.schema`` and ``.value``), one line
    each, unknown keys first: [] when Airflow would take the conf and every key is a Param."""
    conf = dict(conf or {})
    known = list(params)
    problems = [unknown_key(key, known) for key in conf if key not in params]
    for key in known:
        param = params.get_param(key)
        value = conf[key] if key in conf else param.value
        if _unset(value):
            problems.append(f"{key}: required, no value given")
            continue
        problem = schema_problem(key, param.schema, value)
        if problem:
            problems.append(problem)
    return problems


def _unset(value: Any) -> bool:
    from airflow.sdk.definitions._internal.types import is_arg_set

    return not is_arg_set(value)


def check_run_conf(context: Mapping) -> None:
    """Fail a task before its first move when its run's conf has a key its DAG's Params do not
    declare (``ValueError`` naming the key and the closest known one): a run triggered where
    Airflow took the conf as it was (``dag.test``, the CLI, the database)."""
    conf = getattr(context["dag_run"], "conf", None) or {}
    # context["params"] has the conf merged in (dag_run_conf_overrides_params): the DAG's and the
    # task's own Params are the declared ones
    known = list(context["dag"].params) + list(getattr(context["task"], "params", None) or {})
    unknown = [unknown_key(key, known) for key in conf if key not in known]
    if unknown:
        raise ValueError(f"the run's conf is refused: {'; '.join(unknown)}")
