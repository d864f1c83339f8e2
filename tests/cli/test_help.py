"""The CLI read at 80 columns (issue 37.7): every option's name whole in every command's ``--help``,
and an option renamed since answered with its new name. No server needed: a refused option is
refused before the state store is looked for (the URL below reaches nothing)."""

from __future__ import annotations

import os
import re
import subprocess

import click
import pytest
import typer
from typer.testing import CliRunner

from helpers import CLI
from redelivery.cli.app import app

#: Nothing listens there: a command that got as far as the state store would exit 1.
NOWHERE = "postgresql://u:p@127.0.0.1:9/r"


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    """(path, command) of every command under ``group``, sub-groups included."""
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


def _declared(command: click.Command) -> set[str]:
    """Every long option name a command declares (``--x/--no-x`` both)."""
    return {
        name
        for param in command.params
        if isinstance(param, click.Option)
        for name in (*param.opts, *param.secondary_opts)
        if name.startswith("--")
    }


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_option_name_is_whole_at_80_columns(path, command):
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERM": "dumb"})
    assert shown.exit_code == 0, shown.output
    text = shown.output
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text
    written = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))
    assert _declared(command) <= written, (sorted(_declared(command) - written), text)


def test_redrive_help_as_a_user_sees_it_at_80_columns():
    """The report's case, through the installed command in a terminal 80 columns wide."""
    done = subprocess.run(
        [CLI, "redrive", "--help"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"}
    )
    assert done.returncode == 0, done.stderr
    for name in ("--dead-lettered-from", "--dead-lettered-to", "--destination-topic",
                 "--reset-reconsume-times", "--no-reset-reconsume-times", "--no-dry-run"):  # fmt: skip
        assert re.search(rf"(?<![\w-]){name}(?![\w-])", done.stdout), (name, done.stdout)
    assert "…" not in done.stdout


#: Options renamed when the request models became the options' one declaration (issue 30).
RENAMED = [
    (["redrive", "--group", "billing", "--execute"], "--execute", "--no-dry-run"),
    (["redrive", "--group", "billing", "--keep-reconsume-times"], "--keep-reconsume-times",
     "--no-reset-reconsume-times"),
    (["redrive", "--group", "billing", "--from", "2026-01-01T00:00:00Z"], "--from", "--dead-lettered-from"),
    (["dlq", "list", "--group", "billing", "--to", "2026-01-01T00:00:00Z"], "--to", "--dead-lettered-to"),
    (["dlq", "count", "--group", "billing", "--reason", "REJECTED"], "--reason", "--reasons"),
    (["dlq", "list", "--group", "billing", "--message-id", "7"], "--message-id", "--message-ids"),
]  # fmt: skip


@pytest.mark.parametrize("args,old,new", RENAMED, ids=[old for _, old, _ in RENAMED])
def test_a_renamed_option_answers_with_its_new_name(args, old, new):
    done = subprocess.run(
        [CLI, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "REDELIVERY_DATABASE_URL": NOWHERE},
    )
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stderr)
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert old in done.stderr and new in done.stderr and "renamed" in done.stderr, done.stderr


def test_an_unknown_option_that_was_never_renamed_is_still_refused_plainly():
    done = subprocess.run(
        [CLI, "dlq", "count", "--group", "billing", "--no-such-option"],
        capture_output=True,
        text=True,
        env={**os.environ, "REDELIVERY_DATABASE_URL": NOWHERE},
    )
    assert done.returncode == 2 and "--no-such-option" in done.stderr and "renamed" not in done.stderr
