"""``redelivery breaker list|history|open|close``: the circuit breakers of subscriptions (issue 41),
what they did, and an operator's hands on them (audited as ``cli:<user>``)."""

from __future__ import annotations

from typing import Annotated

import typer

from redelivery.cli.common import JsonOpt, _client, _emit, app, command_group

breaker_app = command_group(
    "Circuit breakers: a subscription's deliveries parked while its dependency is down."
)
app.add_typer(breaker_app, name="breaker")

TopicOpt = Annotated[str, typer.Option(help="the subscription's topic")]
GroupOpt = Annotated[str, typer.Option(help="the subscription's consumer group")]
NoteOpt = Annotated[str | None, typer.Option(help="why, for the audit")]


def breaker_lines(rows: list[dict]) -> str:
    """One line per breaker: topic, group, state, until when, answers of the last minute."""
    lines = []
    for r in rows:
        until = "" if r["open_until"] is None else f" until {r['open_until']}"
        if r["state"] == "held":
            until = " until an operator closes it"
        lines.append(
            f"{r['topic']:<20} {r['group']:<24} {r['state']:<9}{until}  last minute: {r['succeeded']} ok, "
            f"{r['failed']} failed; opened {r['opened_total']}x, "
            f"changed {r['changed_at']} by {r['changed_by']}"
        )
    return "\n".join(lines) or "(no subscriptions)"


@breaker_app.command("list")
def breaker_list(
    group: Annotated[str | None, typer.Option(help="one group (default: all)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Each subscription's breaker: closed, open, half_open or held, not closed ones first."""
    rows = _client(reading=True).breakers(group)
    _emit(rows, as_json, breaker_lines(rows))


@breaker_app.command("history")
def breaker_history(
    group: Annotated[str | None, typer.Option(help="one group (default: all)")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="at most this many")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """The latest transitions, newest first, with their figures and who made them."""
    rows = _client(reading=True).breaker_history(group, limit)
    text = "\n".join(
        f"{r['at']}  {r['topic']}/{r['group']}  {r['from']} -> {r['to']}  by {r['changed_by']}"
        + (f"  ({r['failed']} failed, {r['succeeded']} ok)" if r["failed"] is not None else "")
        + (f"  {r['note']}" if r["note"] else "")
        for r in rows
    )
    _emit(rows, as_json, text or "(no transitions)")


def _who() -> str:
    import getpass

    return f"cli:{getpass.getuser()}"


@breaker_app.command("open")
def breaker_open(
    topic: TopicOpt,
    group: GroupOpt,
    seconds: Annotated[
        float | None,
        typer.Option(min=1, max=604_800, help="open this long, then half-open (default: until closed)"),
    ] = None,
    note: NoteOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Open a subscription's breaker by hand: nothing handed out, failures parked, retries waiting."""
    done = _client().open_breaker(topic, group, seconds=seconds, by=_who(), note=note)
    _emit(done, as_json, f"breaker of {group} on {topic}: {done['from']} -> {done['to']}")


@breaker_app.command("close")
def breaker_close(topic: TopicOpt, group: GroupOpt, note: NoteOpt = None, as_json: JsonOpt = False) -> None:
    """Close a subscription's breaker by hand: deliveries go on, parked retries are promoted."""
    done = _client().close_breaker(topic, group, by=_who(), note=note)
    _emit(done, as_json, f"breaker of {group} on {topic}: {done['from']} -> {done['to']}")
