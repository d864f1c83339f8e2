"""The ``redelivery`` command as a user runs it (the installed entry point, a real database)."""

import json
import os
import subprocess

import pytest

from helpers import CLI
from helpers import run_cli as run


def test_publish_stats_and_dlq_list(clean_db):
    for args in (
        ["create-topic", "orders"],
        ["create-group", "billing", "--max-reconsume-times", "0"],
        ["subscribe", "billing", "orders"],
    ):
        assert run(*args, database_url=clean_db).returncode == 0
    done = run("publish", "orders", "--json", stdin='{"n": 1}\n{"n": 2}\n\n', database_url=clean_db)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["published"] == 2
    stats = json.loads(run("stats", "--json", database_url=clean_db).stdout)
    assert stats == {
        "orders": {
            "billing": {"READY": 2, "INFLIGHT": 0, "WAITING_RETRY": 0, "COMMITTED": 0, "DLQ": 0, "BLOCKED": 0}
        }
    }
    from redelivery.client import Client

    with Client(clean_db) as client:
        client.nack("billing", client.receive("billing", "orders", 1, 30), error="bad payload")
    rows = json.loads(run("dlq", "list", "--group", "billing", "--json", database_url=clean_db).stdout)
    assert [(r["body"], r["reason"], r["last_error"]) for r in rows] == [
        ({"n": 1}, "MAX_DELIVERIES_EXCEEDED", "bad payload")
    ]
    text = run("stats", database_url=clean_db).stdout
    assert "billing" in text and "WAITING_RETRY" in text


def test_envelope_publish(clean_db):
    run("create-topic", "orders", database_url=clean_db)
    line = json.dumps({"body": {"n": 1}, "key": "k", "properties": {"p": "v"}})
    assert run("publish", "orders", "--envelope", stdin=line, database_url=clean_db).returncode == 0


@pytest.mark.parametrize(
    "args,stdin,needle",
    [
        (["publish", "orders"], '{"n": 1}\n{broken\n', "line 2: not JSON"),
        (["publish", "orders", "--envelope"], '{"n": 1}\n', "line 1: an envelope"),
        (["publish", "nope"], '{"n": 1}\n', "unknown topic 'nope'"),
        (["dlq", "list", "--group", "nope"], None, "unknown consumer group 'nope'"),
        (["tier", "run", "nope", "--no-spark"], None, "unknown tier 'nope'"),
        (["tier", "run", "seconds", "--no-spark", "--levels", "5"], None, "not in tier"),
    ],
)
def test_bad_input_exits_2_with_a_clear_error_and_publishes_nothing(clean_db, args, stdin, needle):
    run("create-topic", "orders", database_url=clean_db)
    done = run(*args, stdin=stdin, database_url=clean_db)
    assert done.returncode == 2 and needle in done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads(run("stats", "--json", database_url=clean_db).stdout) == {}
    from redelivery.store import db

    with db.connect(clean_db) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_tier_run_outside_airflow(clean_db):
    from helpers import at
    from redelivery.client import Client

    with Client(clean_db) as client:
        client.create_topic("orders")
        client.create_group("billing")
        client.subscribe("billing", "orders")
        client.publish("orders", [{"n": 1}], at=at(0))
        client.nack("billing", client.receive("billing", "orders", 1, 30, at=at(0)), at=at(0))
    done = run(
        "tier",
        "run",
        "seconds",
        "--window-end",
        at(10).strftime("%Y-%m-%dT%H:%M:%S%z"),
        "--no-spark",
        database_url=clean_db,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["promoted"] == 1


def test_a_broken_config_file_is_a_clear_error(clean_db, tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("tiers:\n  - {name: fast, levels: [1], window: 10s}\n")
    env_url = clean_db
    done = subprocess.run(
        [CLI, "tier", "list"],
        capture_output=True,
        text=True,
        env={**os.environ, "REDELIVERY_DATABASE_URL": env_url, "REDELIVERY_CONFIG": str(bad)},
    )
    assert done.returncode == 2 and "belong to no tier" in done.stderr and str(bad) in done.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["publish", "orders", "/nonexistent/messages.jsonl"], "cannot read /nonexistent/messages.jsonl"),
        (["tier", "run", "seconds", "--no-spark", "--levels", "1,x"], "levels.1"),
        (
            ["tier", "run", "seconds", "--no-spark", "--window-end", "2999-01-01T00:00:00+0000"],
            "database's clock",
        ),
        (["create-topic", "orders\n"], "invalid"),
        (["create-group", "billing", "--max-reconsume-times", "2147483648"], "2147483647"),
        (["dlq", "list", "--group", "billing", "--limit", "-1"], "Invalid value"),
        (
            [
                "redrive",
                "--group",
                "billing",
                "--dead-lettered-from",
                "2026-02-01T00:00:00",
                "--dead-lettered-to",
                "2026-01-01T00:00:00",
            ],
            "is after",
        ),
        (["redrive", "--group", "billing", "--message-ids", str(2**63)], "message_ids"),
        (["redrive", "--group", "billing", "--rate-limit", "0"], "rate_limit"),
        (["redrive", "--group", "bad name"], "invalid"),
        (
            ["policy", "show", "--topic", "orders", "--group", "billing", "--retries", "100000"],
            "Invalid value",
        ),
        (["update-group", "billing"], "--policy-default"),
    ],
)
def test_more_bad_input_exits_2_with_one_line_and_changes_nothing(clean_db, args, needle):
    from helpers import snapshot
    from redelivery.store import db

    run("create-topic", "orders", database_url=clean_db)
    run("create-group", "billing", database_url=clean_db)
    with db.connect(clean_db) as conn:
        before = snapshot(conn)
    done = run(*args, database_url=clean_db)
    assert done.returncode == 2 and needle in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    if done.stderr.startswith("error:"):
        assert done.stderr.count("\n") == 1  # one line
    with db.connect(clean_db) as conn:
        assert snapshot(conn) == before


def test_publish_of_a_file_that_is_not_utf8_is_refused(clean_db, tmp_path):
    run("create-topic", "orders", database_url=clean_db)
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"name": "Zoë"}\n'.encode("latin-1"))
    done = run("publish", "orders", str(latin), database_url=clean_db)
    assert done.returncode == 2 and "not UTF-8" in done.stderr and "Traceback" not in done.stderr


def _one_error_line(done) -> str:
    """The one line a refused command prints: ``error: ...`` on stderr, nothing on stdout."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Usage:" not in done.stderr and "╭" not in done.stderr  # never Typer's usage box
    return done.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["dlq", "list", "--group", "billing", "--limit", "0"], "--limit"),
        (["dlq", "list", "--group", "billing", "--limit", "many"], "--limit"),
        (["redrive", "--group", "billing", "--rate-limit", "0"], "rate_limit"),
        (["redrive", "--group", "billing", "--dead-lettered-from", "notatime"], "dead_lettered_from"),
        (["redrive", "--group", "billing", "--max-messages", "0"], "max_messages"),
        (["redrive", "--group", "billing", "--reasons", "OOPS"], "reasons"),
        (["redrive"], "--group"),  # a missing option
        (["dlq", "count", "--group", "billing", "--no-such-option"], "--no-such-option"),
        (["no-such-command"], "no-such-command"),
        (["tier", "run", "seconds", "--window-end", "yesterday"], "window_end"),
        (["create-group", "billing", "--max-reconsume-times", "lots"], "--max-reconsume-times"),
        (["policy", "show", "--topic", "orders"], "--group"),
    ],
)
def test_a_usage_error_is_one_line_with_status_2(clean_db, args, needle):
    """Every parameter Typer or Click refuses, whatever the command and option: ``error: ...`` in
    one line, exit 2, nothing changed (docs/using.md, CLI: every bad input)."""
    from helpers import snapshot
    from redelivery.store import db

    run("create-topic", "orders", database_url=clean_db)
    with db.connect(clean_db) as conn:
        before = snapshot(conn)
    line = _one_error_line(run(*args, database_url=clean_db))
    assert needle in line
    with db.connect(clean_db) as conn:
        assert snapshot(conn) == before


def test_help_is_still_help(clean_db):
    done = run("dlq", "list", "--help", database_url=clean_db)
    assert done.returncode == 0 and "--limit" in done.stdout and not done.stderr.startswith("error")
    done = run("dlq", database_url=clean_db)  # a group without a command shows its help
    assert done.returncode == 2 and "list" in done.stdout + done.stderr and "error:" not in done.stderr


@pytest.mark.parametrize(
    "line,needle",
    [
        ('{"body": {"n": 2}, "key": "a\\u0000b"}', r"message 1: key has a \u0000"),
        ('{"body": {"n": 2}, "key": "a\\ud800"}', "message 1: key has a lone surrogate"),
        ('{"body": {"n": 2}, "properties": {"\\ud800": "v"}}', "message 1: property name"),
        (
            '{"body": {"n": 2}, "properties": {"p": "\\udfff"}}',
            "message 1: property 'p' has a lone surrogate",
        ),
    ],
)
def test_a_key_or_property_postgresql_cannot_store_is_one_line_and_publishes_nothing(clean_db, line, needle):
    run("create-topic", "orders", database_url=clean_db)
    stdin = '{"body": {"n": 1}, "key": "fine"}\n' + line + "\n"
    error = _one_error_line(run("publish", "orders", "--envelope", stdin=stdin, database_url=clean_db))
    assert needle in error
    from redelivery.store import db

    with db.connect(clean_db) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_dlq_list_and_show_print_a_json_body_as_stored(client, topic_group, clean_db):
    """``dlq list --json`` and ``dlq show`` write a JSON body's stored text (the download's lines):
    integers past 64 bits in full, 1e400 as written (Python would write Infinity, no JSON)."""
    from decimal import Decimal

    from redelivery.client import Message

    body = '{"id": 123456789012345678901234567891, "x": 1e400,\n "n": -9223372036854775809}'
    client.publish("orders", [Message(body, content_type="application/json"), Message({"a": 1})])
    client.reject("billing", client.receive("billing", "orders", 2, 30), error="bad")
    exact = {"id": 123456789012345678901234567891, "x": Decimal("1e400"), "n": -9223372036854775809}

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    listed = run("dlq", "list", "--group", "billing", "--json", database_url=clean_db)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout, parse_float=Decimal, parse_constant=refuse)
    assert [r["body"] for r in rows] == [exact, {"a": 1}]
    assert f'"body": {body.replace(chr(10), " ")}' in listed.stdout  # the line break made a space
    shown = run("dlq", "show", str(rows[0]["message_id"]), "--group", "billing", database_url=clean_db)
    assert json.loads(shown.stdout, parse_float=Decimal, parse_constant=refuse) == rows[0]
    empty = run("dlq", "list", "--group", "billing", "--json", "--key", "none", database_url=clean_db)
    assert json.loads(empty.stdout) == []


def _wrong_password(url: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(url)
    return f"postgresql://{info['user']}:not-the-password@{info['host']}:{info['port']}/{info['dbname']}"


@pytest.mark.parametrize(
    "args", [["stats"], ["create-topic", "orders"], ["dlq", "count", "--group", "billing"], ["db", "upgrade"]]
)
@pytest.mark.parametrize("store", ["unreachable", "wrong password"])
def test_a_state_store_that_cannot_be_reached_is_one_line_not_a_traceback(database_url, args, store):
    """Issue 28.2: a wrong password or a server that does not answer: one line saying which (host,
    port, user; never the password), status 1, nothing else printed."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(database_url)
    if store == "unreachable":
        url, said = (
            "postgresql://u:not-the-password@127.0.0.1:9/r",
            "cannot reach the state store at 127.0.0.1:9: ",
        )
    else:
        url = _wrong_password(database_url)
        said = f"authentication failed for user '{info['user']}' at {info['host']}:{info['port']}: "
    done = run(*args, database_url=url)
    assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stderr)
    assert done.stderr.startswith("redelivery: " + said) and done.stderr.count("\n") == 1, done.stderr
    assert "REDELIVERY_DATABASE_URL" in done.stderr and "not-the-password" not in done.stderr
