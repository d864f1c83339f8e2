"""Times mean one thing (issue 37.3): the same inputs fed to every surface that takes a time (the
CLI, the operator page's address, the Airflow Params, the Python API), for a dead-letter filter's
``dead_lettered_from`` and a tier run's ``window_end``. A bare number is refused by each, naming
the field (pydantic's lax datetime read ``20261120`` as Unix seconds: 1970-08-23, and the tier
run's ``datetime.fromisoformat`` as 2026-11-20); an ISO 8601 time means the same instant wherever
it is taken. The Params, JSON for machines, take RFC 3339 only (a zone required); the forms for a
person read a time without a zone as UTC. Real PostgreSQL for the CLI, real Airflow Params."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from helpers import run_cli

REFUSED = None
NOV_20 = datetime(2026, 11, 20, tzinfo=UTC)
#: (input, the instant it means, whether it has a zone); REFUSED: every surface refuses it. A time
#: without a zone is refused where a zone is required (the Params, and ``TierRunRequest`` whose
#: Python API never guesses one), read as UTC elsewhere.
INPUTS = [
    ("20261120", REFUSED, False),  # the report: --dead-lettered-from 20261120 became 1970
    ("2026", REFUSED, False),  # became 1970-01-01T00:33:46Z
    ("1763596800", REFUSED, False),  # Unix seconds of 2025-11-20: a bare number all the same
    ("1763596800.5", REFUSED, False),
    (" 20261120 ", REFUSED, False),
    ("2026-11-20T00:00:00Z", NOV_20, True),
    ("2026-11-20T01:00:00+01:00", NOV_20, True),
    ("2026-11-20T00:00:00", NOV_20, False),  # no zone: UTC for a person, refused as JSON
]
#: Values only the Params and the Python API can be given (the CLI and an address are text).
NUMBERS = [20261120, 1763596800.5]


def python_api(field: str, value):
    from redelivery.redrive import RedriveRequest
    from redelivery.tiers.run import TierRunRequest

    if field == "dead_lettered_from":
        return RedriveRequest(group="billing", dead_lettered_from=value).dead_lettered_from
    return TierRunRequest(tier="seconds", run_key="k", window_end=value).window_end


def params(field: str, value):
    """The value as a run's conf gives it: refused by the DAG's Params (every problem), or the
    instant the task's request reads from it."""
    from airflow.sdk.definitions.param import ParamsDict

    from redelivery.airflow.dags.redrive import redrive_params
    from redelivery.airflow.dags.tiers import tier_params
    from redelivery.airflow.operators import redrive_request
    from redelivery.airflow.params import conf_problems
    from redelivery.config import RedeliveryConfig

    if field == "dead_lettered_from":
        conf = {"group": "billing", field: value}
        problems = conf_problems(ParamsDict(redrive_params()), conf)
        return problems or redrive_request(conf).dead_lettered_from
    tier = RedeliveryConfig().tiers[0]
    problems = conf_problems(ParamsDict(tier_params(tier)), {field: value})
    if problems:
        return problems
    from redelivery.tiers.run import TierRunRequest

    return TierRunRequest(tier=tier.name, run_key="k", window_end=value).window_end


def page(field: str, value: str):
    from redelivery.airflow.ui.dead_letter_pages import BadQuery, parse_query

    try:
        return parse_query([("group", "billing"), (field, value)]).filter.dead_lettered_from
    except BadQuery as exc:
        return exc.problems


def cli(field: str, value: str, url: str):
    if field == "dead_lettered_from":  # a dry run: its audit record holds the filter it read
        done = run_cli(
            "redrive", "--group", "billing", f"--dead-lettered-from={value}", "--json", database_url=url
        )
        read = lambda out: json.loads(out)["filter"]["dead_lettered_from"]  # noqa: E731
    else:
        args = ("tier", "run", "seconds", f"--window-end={value}", "--dry-run", "--no-spark")
        done = run_cli(*args, database_url=url)
        read = lambda out: json.loads(out)["window_end"]  # noqa: E731
    if done.returncode == 2:
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
        return [done.stderr]
    assert done.returncode == 0, done.stderr
    return datetime.fromisoformat(read(done.stdout).replace("Z", "+00:00"))


def _refusal(surface: str, field: str, outcome) -> None:
    assert isinstance(outcome, list), (surface, field, outcome)
    assert any(field in line for line in outcome), (surface, outcome)


@pytest.mark.parametrize("field", ["dead_lettered_from", "window_end"])
def test_every_surface_reads_a_time_the_same_way_and_refuses_a_bare_number(clean_db, field):
    from redelivery.client import Client

    with Client(clean_db) as client:
        client.create_group("billing")
    for value, instant, zoned in INPUTS:
        outcomes = {"cli": cli(field, value, clean_db), "params": params(field, value)}
        if field == "dead_lettered_from":
            outcomes["page"] = page(field, value)
        try:
            outcomes["python"] = python_api(field, value)
        except ValidationError as exc:
            outcomes["python"] = [str(exc)]
        for surface, outcome in outcomes.items():
            zone_required = surface == "params" or (surface == "python" and field == "window_end")
            refused = instant is REFUSED or (zone_required and not zoned)
            if refused:
                _refusal(surface, field, outcome)
            else:
                assert outcome == instant, (value, surface, outcome)
    for number in NUMBERS:
        _refusal("params", field, params(field, number))
        with pytest.raises(ValidationError, match=field):
            python_api(field, number)


def test_a_bare_number_says_what_a_time_is():
    from redelivery.dead_letters import DlqFilter

    with pytest.raises(ValidationError) as refused:
        DlqFilter(group="billing", dead_lettered_to="20261120")
    [error] = refused.value.errors()
    assert error["loc"] == ("dead_lettered_to",) and "ISO 8601" in error["msg"]
    assert "2026-11-20T00:00:00Z" in error["msg"]  # an example of what it takes
