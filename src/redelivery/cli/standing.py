"""``redelivery standing-redrive list|add|stop|resume|remove|tick``: standing redrive policies
(issue 41), dead letters that come back by themselves; an operator's hands on them (audited as
``cli:<user>``). The options of ``add`` are the fields of ``rules.standing.StandingRedrive``."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from redelivery.cli.common import JsonOpt, _emit, _migrated, _reading, app, command_group, with_fields
from redelivery.rules.standing import StandingRedrive

standing_app = command_group("Standing redrives: dead letters that come back by themselves.")
app.add_typer(standing_app, name="standing-redrive")

NameArg = Annotated[str, typer.Argument(help="the standing redrive's name")]


def _who() -> str:
    import getpass

    return f"cli:{getpass.getuser()}"


def standing_lines(rows: list[dict]) -> str:
    """One line per standing redrive: name, group, state (and why stopped), what it brought back."""
    lines = []
    for r in rows:
        spec = r["spec"]
        when = "after a breaker closed" if spec["after"] == "breaker_closed" else f"every {spec['every']}"
        state = (
            r["state"] if r["state"] == "active" else f"stopped by {r['changed_by']}: {r['stopped_reason']}"
        )
        lines.append(
            f"{r['name']:<24} {r['group']:<24} {when}, at most {spec['max_generations']} generations; "
            f"brought back {r['brought_back']:,} in {r['runs']} runs ({r['source']}); {state}"
        )
    return "\n".join(lines) or "(no standing redrives)"


def _write(action):
    """Run ``action(conn)`` on a connection of the state store, migrated first."""
    from redelivery.store import db

    _migrated()
    with db.connect(db.database_url(), autocommit=True) as conn:
        return action(conn)


@standing_app.command("list")
def standing_list(as_json: JsonOpt = False) -> None:
    """Every standing redrive: its rule, its state, what it brought back."""
    from redelivery.standing import policies

    with _reading() as conn:
        rows = policies(conn)
    _emit(rows, as_json, standing_lines(rows))


@standing_app.command("add")
@with_fields(StandingRedrive)
def standing_add(fields: dict, as_json: JsonOpt = False) -> None:
    """Add a standing redrive (an operator's; the config file's are in `standing_redrives:`)."""
    from redelivery.standing import add

    policy = StandingRedrive(**fields)
    _write(lambda conn: add(conn, policy, _who()))
    _emit(
        policy.model_dump(mode="json"),
        as_json,
        f"standing redrive {policy.name} added: {json.dumps(policy.model_dump(mode='json'))}",
    )


@standing_app.command("stop")
def standing_stop(
    name: NameArg, reason: Annotated[str, typer.Option(help="why, for the audit")], as_json: JsonOpt = False
) -> None:
    """Stop a standing redrive: it brings nothing back until resumed."""
    from redelivery.standing import set_state

    was = _write(lambda conn: set_state(conn, name, _who(), reason))
    _emit({"name": name, "from": was, "to": "stopped"}, as_json, f"standing redrive {name}: {was} -> stopped")


@standing_app.command("resume")
def standing_resume(name: NameArg, as_json: JsonOpt = False) -> None:
    """Resume a stopped standing redrive; its die-again ratio counts from now on."""
    from redelivery.standing import set_state

    was = _write(lambda conn: set_state(conn, name, _who(), None))
    _emit({"name": name, "from": was, "to": "active"}, as_json, f"standing redrive {name}: {was} -> active")


@standing_app.command("remove")
def standing_remove(name: NameArg) -> None:
    """Remove an operator's standing redrive (its runs stay in the audit)."""
    from redelivery.standing import remove

    _write(lambda conn: remove(conn, name))
    typer.echo(f"standing redrive {name} removed")


@standing_app.command("tick")
def standing_tick(
    sync_config: Annotated[
        bool,
        typer.Option(
            help="write this config file's standing_redrives into the state store first, as the "
            "redelivery_standing_redrives DAG does (only with the deployment's config file)"
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run one tick now: each standing redrive that is due brings its dead letters back."""
    from redelivery.redrive import summary_line
    from redelivery.standing import tick

    _migrated()
    report = tick(sync_config=sync_config, log=lambda line: typer.echo(line, err=True))
    text = "\n".join(
        [f"{r['triggered_by']}: {summary_line(r)}" for r in report.runs]
        + [f"{n} stopped itself: {why}" for n, why in report.stopped.items()]
        + [f"{n}: {why}" for n, why in report.problems.items()]
    )
    _emit(report.as_dict(), as_json, text or "(nothing due)")
