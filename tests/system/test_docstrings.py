"""The Airflow surface documents its parameters as Airflow's providers do (issue 39.4): every
parameter of an operator, hook, trigger or DAG factory of the provider has its ``:param`` line in
the docstring Airflow's docs, the UI's operator view and an IDE show."""

from __future__ import annotations

import inspect
import re

import pytest

SURFACE = [
    ("redelivery.airflow.operators", "TierWindowOperator"),
    ("redelivery.airflow.operators", "RedriveOperator"),
    ("redelivery.airflow.hooks", "RedeliveryHook"),
    ("redelivery.airflow.engine", "EngineHook"),
    ("redelivery.airflow.triggers", "ReadyMessagesTrigger"),
    ("redelivery.airflow.dags.consumer", "http_consumer_dag"),
    ("redelivery.airflow.assets", "asset_for"),
]


@pytest.mark.parametrize(("module", "name"), SURFACE)
def test_every_parameter_has_its_param_line(module, name):
    import importlib

    target = getattr(importlib.import_module(module), name)
    function = target.__init__ if inspect.isclass(target) else target
    wanted = [
        p.name
        for p in inspect.signature(function).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    documented = re.findall(r"^\s*:param (\w+):", inspect.getdoc(target) or "", re.M)
    assert wanted and documented == wanted, f"{name}: document {wanted} in order, has {documented}"
