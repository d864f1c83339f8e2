"""The ``redelivery`` command (Typer). Its state store: REDELIVERY_DATABASE_URL, else the host's
Airflow connection ``redelivery_db``, else the embedded PostgreSQL, started when it is not running
(``redelivery.cli.store``; ``--verbose`` says which). Bad input prints ``error: ...`` and exits
with status 2; a state store that cannot be had, reached, or refuses the login prints
``redelivery: ...`` (one line) and exits with status 1."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from redelivery.cli import (
    breakers,  # registers the breaker commands
    dead_letters,  # noqa: F401  (registers the dlq and redrive commands)
    standing,  # registers the standing-redrive commands
    store,  # registers --verbose; finds the state store (``store.use``)
)
from redelivery.cli.common import (
    JsonOpt,
    _client,
    _emit,
    _migrated,
    _reading,
    app,
    command_group,
    db_app,
    policy_app,
    renamed_option,
    tier_app,
    with_fields,
)
from redelivery.errors import DatabaseUnavailableError, RedeliveryError
from redelivery.rules.words import COUNTED_STATES, DEFAULT_ON_EXHAUSTED, ON_EXHAUSTED, ON_EXHAUSTED_HELP
from redelivery.tiers.run import TierRunRequest


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply the schema migrations to the state store (the embedded PostgreSQL, started if needed,
    where no store is configured)."""
    from redelivery.store.db import database_url, migrate

    migrate()
    typer.echo(f"schema up to date at {store.masked(database_url())}")


@db_app.command("url")
def db_url(
    password: Annotated[bool, typer.Option("--password", help="with its password (for psql)")] = False,
) -> None:
    """Print the state store's URL, its password masked (redelivery --verbose db url: which store
    and why). Starts nothing."""
    from redelivery.store import embedded

    found = store.find(start=False)
    store.tell(found)
    typer.echo((found.url or embedded.url()) if password else found.shown)


@db_app.command("sql")
def db_sql(
    name: Annotated[str | None, typer.Argument(help="a statement's name, e.g. RECEIVE; none: all")] = None,
) -> None:
    """Print a statement whole, as the code sends it to PostgreSQL, or all of them (what
    docs/statements.sql holds). Starts nothing."""
    from redelivery.store import statements

    typer.echo(statements.sql(name) if name else statements.reference(), nl=bool(name))


@db_app.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL."""
    from redelivery.store import embedded

    embedded.stop()


@app.command("airflow-env")
def airflow_env(
    dags_folder: Annotated[Path, typer.Option(help="the DAGs folder Airflow reads")] = Path("dags"),
) -> None:
    """Print the Airflow environment of this project as shell export lines."""
    from redelivery.airflow.env import shell_exports

    typer.echo(shell_exports(dags_folder))


@app.command("spark-cds")
def spark_cds(force: Annotated[bool, typer.Option(help="rebuild even if it exists")] = False) -> None:
    """Build the Spark driver's class-data sharing archive (faster Spark start; set-up runs it)."""
    from redelivery.spark.jvm import build_cds_archive

    typer.echo(f"class-data sharing archive: {build_cds_archive(force)}")


spark_app = command_group("The project's warm Spark Connect server.")
app.add_typer(spark_app, name="spark-connect")


@spark_app.command("start")
def spark_connect_start(
    foreground: Annotated[bool, typer.Option(help="run in this process's place (a container)")] = False,
) -> None:
    """Start the Spark Connect server (no-op when it runs) and print its URL."""
    from redelivery.spark import connect_server

    if foreground:
        raise SystemExit(connect_server.run_foreground())
    connect_server.ensure_running()
    typer.echo(f"Spark Connect server running on port {connect_server.status()['port']}")


@spark_app.command("stop")
def spark_connect_stop() -> None:
    """Stop the Spark Connect server."""
    from redelivery.spark import connect_server

    typer.echo("stopped" if connect_server.stop() else "not running")


@spark_app.command("status")
def spark_connect_status(as_json: JsonOpt = False) -> None:
    """Whether the Spark Connect server runs, its pid, port and log."""
    from redelivery.spark import connect_server

    data = connect_server.status()
    _emit(
        data,
        as_json,
        f"{'running' if data['running'] else 'not running'} (port {data['port']}, log {data['log']})",
    )


@spark_app.command("url")
def spark_connect_url() -> None:
    """Print the client URL (with the token) of the Spark Connect server."""
    from redelivery.spark import connect_server

    typer.echo(connect_server.url())


@app.command("create-topic")
def create_topic(name: str) -> None:
    """Create a topic (no-op if it exists)."""
    _client().create_topic(name)


@app.command("create-group")
def create_group(
    name: str,
    max_reconsume_times: Annotated[
        int | None, typer.Option(help="-1: unlimited; default from config (16)")
    ] = None,
) -> None:
    """Create a consumer group; on an existing one, only a given --max-reconsume-times changes it."""
    _client().create_group(name, max_reconsume_times)


@app.command("update-group")
def update_group(
    name: str,
    max_reconsume_times: Annotated[
        int | None, typer.Option(help="the group's own limit; -1: unlimited")
    ] = None,
    policy_default: Annotated[
        bool, typer.Option("--policy-default", help="clear the group's own limit: the policies decide")
    ] = False,
) -> None:
    """Set or clear a group's own max reconsume times (RocketMQ group metadata)."""
    if (max_reconsume_times is None) == (not policy_default):
        raise RedeliveryError("give --max-reconsume-times N or --policy-default")
    _client().update_group(name, max_reconsume_times=max_reconsume_times)


@app.command("subscribe")
def subscribe(
    group: str,
    topic: str,
    start: Annotated[
        str,
        typer.Option(help="latest: messages published from now on; earliest: every message the log holds"),
    ] = "latest",
    ordered: Annotated[
        bool | None,
        typer.Option(
            "--ordered/--unordered",
            help="deliver each message key's messages one at a time, in publish order, a failed one "
            "holding back the later ones of its key (for life). Default: the config's policy",
        ),
    ] = None,
    on_exhausted: Annotated[
        str | None,
        typer.Option(
            help=f"ordered only: {ON_EXHAUSTED_HELP}. Default: the config's policy, else "
            f"{DEFAULT_ON_EXHAUSTED}",
            metavar="[" + "|".join(ON_EXHAUSTED) + "]",
        ),
    ] = None,
) -> None:
    """Subscribe a consumer group to a topic (an existing subscription keeps its consume offset)."""
    _client().subscribe(group, topic, start=start, ordered=ordered, on_exhausted=on_exhausted)


@app.command("publish")
def publish(
    topic: str,
    file: Annotated[Path, typer.Argument(help="JSON lines file, '-' for standard input")] = Path("-"),
    envelope: Annotated[
        bool, typer.Option(help='lines are {"body": ..., "key": ..., "properties": {...}}')
    ] = False,
    batch_id: Annotated[
        str | None, typer.Option(help="publish this batch once, however often the command runs")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Publish one message per line (each line a JSON body). Nothing is published if any line is bad."""
    from redelivery.client import Message

    try:
        lines = sys.stdin.readlines() if str(file) == "-" else file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise RedeliveryError(f"cannot read {file}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise RedeliveryError(
            f"{file} is not UTF-8 text (byte {exc.start}): publish takes JSON lines"
        ) from None
    messages = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RedeliveryError(f"line {number}: not JSON: {exc}") from None
        if envelope:
            if (
                not isinstance(value, dict)
                or "body" not in value
                or set(value) - {"body", "key", "properties"}
            ):
                raise RedeliveryError(
                    f'line {number}: an envelope is an object with "body" and optional "key", "properties"'
                )
            messages.append(
                Message(body=value["body"], key=value.get("key"), properties=value.get("properties") or {})
            )
        else:
            messages.append(Message(body=value))
    ids = _client().publish(topic, messages, batch_id=batch_id)
    _emit(
        {
            "topic": topic,
            "published": len(ids),
            "first_id": ids[0] if ids else None,
            "last_id": ids[-1] if ids else None,
        },
        as_json,
        f"published {len(ids)} messages to {topic}",
    )


@app.command("stats")
def stats(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Counts per topic, group and state."""
    client = _client(reading=True)
    data = client.stats()
    lines = [f"{'topic':<20} {'group':<24} " + " ".join(f"{s:>13}" for s in COUNTED_STATES)]
    for topic, groups in data.items():
        for group, counts in groups.items():
            lines.append(f"{topic:<20} {group:<24} " + " ".join(f"{counts[s]:>13}" for s in COUNTED_STATES))
    shown = [b for b in client.breakers() if b["state"] != "closed"] if not as_json else []
    if shown:  # a breaker that is not closed is why a group's messages wait
        lines += ["", "breakers not closed:", breakers.breaker_lines(shown)]
    if not as_json:  # what brings dead letters back by itself, and what stopped doing so
        from redelivery.standing import policies

        found = policies(client.conn)
        if found:
            lines += ["", "standing redrives:", standing.standing_lines(found)]
    _emit(data, as_json, "\n".join(lines))


@app.command("metrics")
def metrics_command(
    textfile: Annotated[
        Path | None,
        typer.Option(
            help="write them to this file (node-exporter's textfile collector: a name ending in .prom) "
            "through a file renamed over it, instead of printing them",
        ),
    ] = None,
) -> None:
    """The Prometheus metrics of the state store (text exposition format), read now."""
    from redelivery.config import cached_config
    from redelivery.metrics import render, unavailable, write_textfile, write_unavailable_textfile

    retention = cached_config().retention.seconds("messages")
    if textfile is not None and textfile.suffix != ".prom":
        raise RedeliveryError(
            f"--textfile {str(textfile)!r} must end in .prom (node-exporter reads only those)"
        )
    try:
        with _reading() as conn:
            if textfile is None:
                sys.stdout.write(render(conn, retention_seconds=retention).decode())
                return
            _write(lambda path: write_textfile(conn, path, retention), textfile)
    except Exception as exc:
        if textfile is not None and unavailable(getattr(exc, "orig", None) or exc) is not None:
            _write(write_unavailable_textfile, textfile)  # node-exporter sees it down
        raise


def _write(write, textfile: Path) -> None:
    """``write(path)``; raises RedeliveryError when the file cannot be written."""
    try:
        write(str(textfile))
    except OSError as exc:
        raise RedeliveryError(f"cannot write {str(textfile)!r}: {exc.strerror or exc}") from None


@app.command("cleanup")
def cleanup_command(as_json: JsonOpt = False) -> None:
    """Delete records older than their retention (config ``retention``): publish batch ids,
    unfinished staged rows, tier runs, settle markers, redrive runs."""
    from redelivery.config import cached_config
    from redelivery.store.db import connect
    from redelivery.store.maintenance import cleanup

    _migrated()
    with connect(autocommit=True) as conn:
        deleted = cleanup(conn, cached_config())
    _emit(deleted, as_json, "deleted: " + ", ".join(f"{k} {n}" for k, n in deleted.items()))


@policy_app.command("show")
def policy_show(
    topic: Annotated[str, typer.Option(help="topic name")],
    group: Annotated[str, typer.Option(help="consumer group name")],
    retries: Annotated[int, typer.Option(min=1, max=1000, help="how many retries to list")] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The effective policy of a topic and group: backoff, the wait before each retry (seconds),
    and the delivery after which a message dead-letters. Works for names not created yet; a group
    that exists brings its own max reconsume times."""
    from redelivery.config import cached_config
    from redelivery.rules.names import check_name
    from redelivery.store import statements as S

    check_name("topic", topic)
    check_name("group", group)
    config = cached_config()
    with _reading() as conn:
        row = conn.execute(S.GROUP_BY_NAME, {"name": group}).fetchone()
        own_max = row[1] if row else None
    policy = config.policy_for(topic, group, own_max)
    data = policy.describe(config.level_table, retries)
    after = data["dead_letters_after_delivery"]
    text = "\n".join(
        [
            f"topic {topic}, group {group}: {data['backoff']['kind']} backoff, "
            f"max reconsume times {data['max_reconsume_times']}, DLQ {data['dead_letter_queue']}, "
            f"retry {data['retry_topic']}",
            "waits (s): " + " ".join(f"{w:g}" for w in data["waits_seconds"]),
            f"dead-letters when delivery {after} fails"
            if after
            else "never dead-letters (unlimited reconsume times)",
        ]
    )
    _emit(data, as_json, text)


@tier_app.command("list")
def tier_list() -> None:
    """The configured tiers with their levels and windows."""
    from redelivery.config import cached_config
    from redelivery.rules.levels import format_duration

    config = cached_config()
    for tier in config.tiers:
        delays = " ".join(format_duration(config.level_table.delay(lvl)) for lvl in tier.levels)
        typer.echo(f"{tier.name:<12} every {tier.window:<5} levels {tier.levels} ({delays})")


@tier_app.command("run")
@with_fields(TierRunRequest, include=("window_end", "levels", "dry_run"), defaults={"window_end": None})
def tier_run(
    tier: str,
    fields: dict,
    spark: Annotated[
        bool,
        typer.Option(
            "--spark/--no-spark",
            help="run the ranges on Spark (REDELIVERY_SPARK: the warm Connect server by default) "
            "when the window has spark_threshold candidates or more",
        ),
    ] = True,
) -> None:
    """Run one tier window outside Airflow (window end: now if not given; a time without a zone
    is UTC) and print its summary as JSON."""
    from pydantic import TypeAdapter, ValidationError

    from redelivery.config import cached_config
    from redelivery.fields import Time
    from redelivery.store.db import migrate
    from redelivery.tiers.run import run_tier, tier_levels

    try:  # the field's own type: ISO 8601, never a number (``fields.Time``)
        end = TypeAdapter(Time).validate_python(fields.pop("window_end", None) or datetime.now(UTC))
    except ValidationError as exc:
        raise RedeliveryError(f"window_end: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    end = end if end.tzinfo else end.replace(tzinfo=UTC)
    run_key = f"cli/{tier}/{datetime.now(UTC).isoformat()}"
    request = TierRunRequest(tier=tier, window_end=end, run_key=run_key, **fields)
    tier_levels(cached_config(), request.tier, request.levels)  # an unknown tier or level: nothing ran
    migrate()
    sessions = []

    def make_session():
        from redelivery.spark.session import get_spark

        sessions.append(get_spark(f"redelivery-tier-{tier}"))
        return sessions[-1]

    try:
        summary = run_tier(request, spark=make_session if spark else None)
    finally:
        for session in sessions:
            session.stop()
    typer.echo(json.dumps(summary, indent=2))


def one_line(exc: Exception) -> str:
    """An error as one line; pydantic's ValidationError as 'field: problem; ...'; Click's errors
    by their message (naming the option or argument), without the usage text."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
    if isinstance(exc, typer.TyperException):
        return " ".join(exc.format_message().split())
    return " ".join(str(exc).split())


def main() -> None:
    """The ``redelivery`` command. Bad input, whether a command refuses it (``RedeliveryError``,
    ``ValueError``) or Typer/Click do while parsing (any ``UsageError``: a bad value, a missing
    or unknown option or command), prints one line ``error: ...`` and exits with status 2 before
    anything changes. A state store that cannot be reached or refuses the password prints one line
    ``redelivery: cannot reach the state store at host:port: ...`` / ``redelivery: authentication
    failed for user ...`` (``unreachable``) and exits with status 1. Click runs without its
    standalone mode so that its errors reach this one place instead of printing Typer's usage box;
    ``--help`` and a command group given no command still print their help."""
    store.use()
    try:
        status = app(standalone_mode=False)  # Click's own exit (--help, Ctrl-C) comes back as a status
    except typer.TyperException as exc:  # Typer's (vendored) Click errors: UsageError (exit code 2),
        # its BadParameter, MissingParameter, NoSuchOption..., and ClickException
        if type(exc).__name__ == "NoArgsIsHelpError":  # `redelivery dlq`: its help (Typer checks it
            exc.show()  # by name too: not exported)
            raise SystemExit(exc.exit_code) from None
        typer.echo(f"error: {renamed_option(exc) or one_line(exc)}", err=True)
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        raise SystemExit(1) from None
    except DatabaseUnavailableError as exc:  # no state store to be had: its own line
        typer.echo(f"redelivery: {' '.join(str(exc).split())}", err=True)
        raise SystemExit(1) from None
    except (RedeliveryError, ValueError) as exc:  # bad input: every one of them is raised before any change
        typer.echo(f"error: {one_line(exc)}", err=True)
        raise SystemExit(2) from None
    except Exception as exc:
        problem = unreachable(exc)
        if problem is None:  # not the state store's absence: a bug, with its traceback
            raise
        typer.echo(f"redelivery: {problem}", err=True)
        raise SystemExit(1) from None
    raise SystemExit(status if isinstance(status, int) else 0)


def unreachable(exc: BaseException) -> str | None:
    """The one line of a state store that cannot be reached or refuses the login (psycopg's
    ``OperationalError``, or SQLAlchemy's around it while migrating: ``redelivery.metrics.
    unavailable``) and where to fix it; None for any other error."""
    from redelivery.metrics import STATEMENT_TIMED_OUT, unavailable
    from redelivery.settings import get_settings
    from redelivery.store import embedded

    problem = unavailable(getattr(exc, "orig", None) or exc)
    if problem is None:
        return None
    if problem.startswith(STATEMENT_TIMED_OUT):  # a read: the time-out is the fix's place
        return f"{problem} (REDELIVERY_READ_TIMEOUT={get_settings().read_timeout:g} s)"
    found = store.found()
    if found is not None:
        return f"{problem} ({found.fix()})"
    if get_settings().database_url:
        return f"{problem} (check REDELIVERY_DATABASE_URL)"
    return f"{problem} (the embedded PostgreSQL: its password is in {embedded.password_file()})"


if __name__ == "__main__":
    main()
