"""Each request model is the one declaration of its fields: the Airflow Params, the CLI's options,
the operator page's form and address and the dead-letter filter's SQL parameters are derived from
it (``redelivery.fields``). No server needed."""

from __future__ import annotations

import re

import typer
from pydantic import Field
from typer.testing import CliRunner

from redelivery.airflow.dags.redrive import redrive_params
from redelivery.airflow.params import schema_problem
from redelivery.airflow.ui.dead_letter_pages import filter_form, parse_query, query_string
from redelivery.cli.app import app
from redelivery.cli.common import with_fields
from redelivery.dead_letters import FILTER_FIELDS, DlqFilter
from redelivery.redrive import RedriveRequest
from redelivery.store.statements._shared import DLQ_FILTER
from redelivery.tiers.run import TierRunRequest


class WithPriority(RedriveRequest):
    """A copy of the redrive request with one field more."""

    priority: int | None = Field(default=None, ge=0, le=9, title="Priority", description="0 to 9.")


def _options(*command: str) -> list[str]:
    """The long options a ``redelivery`` command's help lists."""
    shown = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"}).output
    return sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", shown)))


def _flags(model, *names: str) -> set[str]:
    return {"--" + name.replace("_", "-") for name in names or model.model_fields}


def test_a_field_added_to_a_copy_appears_in_the_params():
    params = redrive_params(WithPriority)
    assert list(params) == list(WithPriority.model_fields)
    assert params["priority"].value is None
    assert params["priority"].description == "0 to 9."
    assert params["priority"].schema == {
        "title": "Priority",
        "type": ["null", "integer"],
        "minimum": 0,
        "maximum": 9,
    }
    schema = params["priority"].schema  # checked as Airflow checks a run's conf
    assert schema_problem("priority", schema, 3) is None and schema_problem("priority", schema, None) is None
    assert "10 is greater than the maximum of 9" in schema_problem("priority", schema, 10)


def test_a_field_added_to_a_copy_appears_on_the_command_line():
    runner, seen = CliRunner(), {}
    copy_app = typer.Typer()

    @copy_app.command()
    @with_fields(WithPriority)
    def redrive(fields: dict) -> None:
        seen.update(WithPriority(**fields).model_dump())

    assert "--priority" in runner.invoke(copy_app, ["--help"], env={"COLUMNS": "200"}).output
    done = runner.invoke(
        copy_app, ["--group", "billing", "--priority", "3", "--reasons", "REJECTED,LEASE_EXPIRED"]
    )
    assert done.exit_code == 0, done.output
    assert seen["priority"] == 3 and seen["reasons"] == ["REJECTED", "LEASE_EXPIRED"]
    assert seen["rate_limit"] == 500 and seen["dry_run"] is True  # the operator's defaults


def test_a_field_added_to_a_copy_appears_on_the_page():
    request = WithPriority(group="billing", priority=3, message_ids=[5, 6])
    form = filter_form(request, "/redelivery/dlq/list")
    assert re.search(r'<input type="text" name="priority" value="3"', form), form
    address = query_string(request)
    assert "priority=3" in address
    pairs = [tuple(part.split("=", 1)) for part in address.split("&")]
    parsed = parse_query([(k, v.replace("%2C", ",")) for k, v in pairs], model=WithPriority).filter
    assert parsed.priority == 3 and parsed.message_ids == [5, 6]


def test_the_commands_take_the_models_fields_under_their_own_names():
    assert _flags(DlqFilter) <= set(_options("dlq", "list"))
    assert _flags(DlqFilter) <= set(_options("dlq", "count"))
    redrive = set(_options("redrive"))
    assert (
        _flags(RedriveRequest) | {"--no-dry-run", "--no-reset-reconsume-times", "--json", "--help"} == redrive
    )
    tier = set(_options("tier", "run"))
    assert _flags(TierRunRequest, "window_end", "levels", "dry_run") <= tier


def test_the_params_are_the_request_models_fields():
    from redelivery.airflow.dags.tiers import tier_params
    from redelivery.config import RedeliveryConfig

    assert list(redrive_params()) == list(RedriveRequest.model_fields)
    tier = RedeliveryConfig().tiers[0]
    assert list(tier_params(tier)) == ["window_end", "levels", "dry_run"]
    assert tier_params(tier)["levels"].schema["items"]["enum"] == list(tier.levels)


def test_the_page_and_the_sql_use_the_filters_field_names():
    form = filter_form(DlqFilter(group="billing"), "/x")
    assert re.findall(r'name="(\w+)"', form) == [
        name for name in FILTER_FIELDS for _ in range(5 if name == "reasons" else 1)
    ]
    in_sql = set(re.findall(r"%\((\w+)\)s", DLQ_FILTER))
    # and a standing redrive's generation rule (filter_params' ``generations``)
    standing = {"max_generations", "generation_wait"}
    assert in_sql == (set(FILTER_FIELDS) - {"group", "topic"}) | {"group_id", "topic_id"} | standing
