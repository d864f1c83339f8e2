"""The package's shape, checked without any server: one-way imports (the map in
docs/ARCHITECTURE.md), one naming rule, one default configuration, one place for SQL."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "redelivery"
#: The layers bottom to top: folders of the package, and the modules at its top. A layer imports
#: only the layers before it (docs/ARCHITECTURE.md, "Map"; docs/layout.md).
LAYERS = [
    "errors", "settings", "fields", "rules", "config", "reference", "store", "messaging", "dead_letters",
    "client", "spark", "tiers", "redrive", "standing", "metrics", "jobs", "airflow", "cli", "__main__",
]  # fmt: skip
#: Modules bottom to top, layer by layer: each may import only modules before it.
ORDER = [
    "errors", "settings", "fields",
    "rules.words", "rules.leased_row", "rules.levels", "rules.names", "rules.breaker", "rules.standing",
    "rules.policies",
    "rules.ordering", "rules.failures",
    "config", "reference",
    "store.statements._shared", "store.statements.topology", "store.statements.messages",
    "store.statements.ordered",
    "store.statements.tiers", "store.statements.dead_letters", "store.statements.reads",
    "store.statements.housekeeping", "store.statements.breakers", "store.statements.standing",
    "store.statements", "store.embedded",
    "store.db", "store.log", "store.catalog", "store.maintenance",
    "messaging.codec", "messaging.copy_rows", "messaging.receipts", "messaging.producer", "messaging.waiting",
    "messaging.breaking", "messaging.context", "messaging.admin", "messaging.publishing", "messaging.ordered",
    "messaging.leasing", "messaging.consuming",
    "dead_letters", "client",
    "spark.deploy", "spark.tasks", "spark.cds_warmup", "spark.jvm", "spark.connect_server", "spark.session",
    "spark.publishing", "spark.consuming", "spark.dataframes",
    "tiers.window", "tiers.run", "tiers.batch",
    "redrive", "standing", "metrics",
    "jobs.tier_window", "jobs.dlq_redrive", "jobs.publish",
    "airflow.env", "airflow.hooks", "airflow.assets", "airflow.triggers", "airflow.queues",
    "airflow.provider", "airflow.retention", "airflow.params", "airflow.ui.trigger_check", "airflow.engine",
    "airflow.operators", "airflow.http_delivery", "airflow.dags.tiers", "airflow.dags.consumer",
    "airflow.dags.redrive", "airflow.dags.maintenance", "airflow.dags.standing", "airflow.dags.breaker",
    "airflow.ui.charts",
    "airflow.ui.pauses",
    "airflow.ui.style",
    "airflow.ui.page", "airflow.ui.outage",
    "airflow.ui.dead_letter_pages", "airflow.ui.app", "airflow.plugin",
    "cli.common", "cli.store", "cli.dead_letters", "cli.breakers", "cli.standing", "cli.app", "__main__",
]  # fmt: skip
#: Packages: their __init__ files import nothing of ours (the top one: ``client``, lazily).
PACKAGES = {"", "rules", "store", "messaging", "tiers", "spark", "jobs", "airflow", "airflow.dags",
            "airflow.ui", "cli"}  # fmt: skip
#: Old import paths kept for one release: each only re-exports its successor, with a warning
#: (none now: docs/changelog.md says which went when).
DEPRECATED: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every redelivery module ``path`` imports, at any depth of the file (function-level too)."""
    here = [part for part in module_name(path).split(".") if part]
    package = here[:-1] if path.name != "__init__.py" else here
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("redelivery"):
                target = node.module.removeprefix("redelivery").lstrip(".")
            else:
                continue
            for alias in node.names:  # "from . import db" imports the module db
                candidate = f"{target}.{alias.name}".lstrip(".")
                found.add(candidate if candidate in ORDER or candidate in PACKAGES else target)
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix("redelivery.") for a in node.names if a.name.startswith("redelivery.")
            )
    return found - {""}


def package_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "migrations" not in p.parts]


def test_every_module_is_on_the_map():
    names = {module_name(p) for p in package_modules()}
    assert names - PACKAGES - set(DEPRECATED) == set(ORDER), (
        "add new modules to ORDER and to the map in docs/ARCHITECTURE.md"
    )


def test_deprecated_paths_only_re_export_their_successor():
    for old, new in DEPRECATED.items():
        assert imports_of(PACKAGE / (old.replace(".", "/") + ".py")) == {new}
        module = importlib.import_module(f"redelivery.{new}")
        with pytest.warns(DeprecationWarning, match=f"redelivery.{old} moved"):
            importlib.reload(importlib.import_module(f"redelivery.{old}"))
        shim = importlib.import_module(f"redelivery.{old}")
        assert all(getattr(shim, name) is getattr(module, name) for name in shim.__all__)


def test_the_package_needs_nothing_of_the_checkout():
    """No import of the demo, the harness or the tests, and no path into the repository."""
    outside = re.compile(r"^\s*(from|import)\s+(demo|harness|helpers|tests)\b|REPO_ROOT|parents\[", re.M)
    assert [str(p) for p in package_modules() if outside.search(p.read_text())] == []


def layer(module: str) -> str:
    """The layer of a module: its top folder, or itself at the package's top."""
    return module.split(".")[0]


def test_the_modules_are_listed_layer_by_layer():
    assert {layer(m) for m in ORDER} == set(LAYERS)
    assert ORDER == sorted(ORDER, key=lambda m: LAYERS.index(layer(m)))


def test_folders_import_one_way_down_the_layers():
    """Folder level: no folder imports a layer above it, so no two folders import each other."""
    wrong = set()
    for path in package_modules():
        name = module_name(path)
        if name in PACKAGES or name in DEPRECATED:
            continue
        for target in imports_of(path) - PACKAGES:
            if LAYERS.index(layer(target)) > LAYERS.index(layer(name)):
                wrong.add(f"{layer(name)} -> {layer(target)} ({name} -> {target})")
    assert sorted(wrong) == [], "imports up the layers"


def test_imports_go_one_way_down_the_map():
    wrong = []
    for path in package_modules():
        name = module_name(path)
        if name in PACKAGES:  # the top one: ``from redelivery import Client`` loads it on first use
            allowed = {"client"} if name == "" else set()
            assert imports_of(path) <= allowed, f"{path} should import nothing of ours"
            continue
        if name in DEPRECATED:
            continue
        for target in imports_of(path) - PACKAGES:  # a package imports nothing: safe from anywhere
            assert target in ORDER, f"{name} imports {target}, which is not on the map"
            if ORDER.index(target) >= ORDER.index(name):
                wrong.append(f"{name} -> {target}")
    assert wrong == [], "imports up the map (or a cycle): " + ", ".join(wrong)


def test_the_map_in_the_architecture_document_matches():
    text = (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text()
    listed = re.findall(r"^\| `([a-z_.]+)` \|", text, re.M)
    assert [m for m in listed if m in ORDER or m.rstrip(".*") in PACKAGES] == [
        m for m in ORDER if m in listed
    ]
    # the parts of store.statements are its one row
    assert {m for m in ORDER if not m.startswith("store.statements.")} - {"__main__"} <= set(listed)


def test_sql_lives_in_the_statements_module():
    """No other module of the core writes SQL text: statements are named constants."""
    sql = re.compile(r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM)\b")
    core = [p for p in package_modules() if not module_name(p).startswith("store.statements")]
    offenders = [f"{p.relative_to(REPO_ROOT)}:{n}" for p in core
                 for n, line in enumerate(p.read_text().splitlines(), 1) if sql.search(line)]  # fmt: skip
    assert offenders == []


def test_the_migration_keeps_the_name_rule():
    """The schema's CHECK constraints (the latest migration that sets them) are a frozen copy of the
    naming rule in redelivery.rules.names."""
    from redelivery.rules.names import NAME_REGEX

    latest = None
    for path in sorted((PACKAGE / "store" / "migrations" / "versions").glob("*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        migration = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(migration)
        latest = getattr(migration, "NAME_CHECK", latest)
    assert latest == f"^{NAME_REGEX}$"


def test_one_default_configuration():
    """config/redelivery.yaml spells out exactly the defaults of the code."""
    from redelivery.config import RedeliveryConfig, load_config

    assert load_config(REPO_ROOT / "config" / "redelivery.yaml") == RedeliveryConfig()
    assert not (PACKAGE / "defaults.yaml").exists()


#: Statements that write delivery rows but change no state.
NOT_STATE_CHANGES = {"EXTEND_LEASE"}  # the lease only
#: Triggers on deliveries that change no row: waking the waiting consumers of an ordered group.
NOT_STATE_CHANGE_TRIGGERS = {"wake_ordered_waiters"}


def state_change_rows(text: str) -> list[str]:
    """The names the "State changes" table of ``text`` (docs/ARCHITECTURE.md) lists: the first
    cell of every row of the table, whatever follows the name in it."""
    section = text[text.index("## State changes") :].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # header, rule
    names = [re.match(r"^\| `(\w+)`[^|]*\|", row) for row in rows]
    assert all(names), [row for row, name in zip(rows, names, strict=True) if not name]
    return [name[1] for name in names]


def triggers_on_deliveries() -> set[str]:
    """The functions the migrations' triggers on ``deliveries`` execute."""
    trigger = re.compile(
        r"CREATE TRIGGER \w+\s+(?:AFTER|BEFORE|INSTEAD OF)\b[^;]*?\bON (?:redelivery\.)?deliveries\b"
        r"[^;]*?EXECUTE (?:FUNCTION|PROCEDURE) (?:redelivery\.)?(\w+)\(",
        re.S,
    )
    versions = sorted((PACKAGE / "store" / "migrations" / "versions").glob("*.py"))
    return {name for path in versions for name in trigger.findall(path.read_text())}


def test_the_state_changes_table_lists_every_state_change():
    """The table, ``STATE_CHANGES``, the statements that write delivery rows and the triggers on
    them name the same: a new statement or trigger that changes deliveries is listed in both."""
    from psycopg.sql import Composable

    from redelivery.store import statements as S

    assert state_change_rows((REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text()) == list(S.STATE_CHANGES)
    writes = re.compile(r"\b(INSERT INTO|UPDATE|DELETE FROM) deliveries\b")
    writers = {name for name, text in S.ALL.items() if writes.search(text)}
    assert writers - NOT_STATE_CHANGES == set(S.STATE_CHANGES) - set(S.STATE_CHANGE_TRIGGERS)
    on_deliveries = triggers_on_deliveries() - NOT_STATE_CHANGE_TRIGGERS
    assert set(S.STATE_CHANGE_TRIGGERS) == on_deliveries == set(S.STATE_CHANGES) - set(S.ALL)
    composed = [n for n, v in vars(S).items() if isinstance(v, Composable) and writes.search(str(v))]
    assert composed == [], "a composed statement that writes deliveries: name it in STATE_CHANGES"


def test_the_state_changes_table_is_read_row_by_row():
    table = """## State changes

| statement | from | to | guard |
|---|---|---|---|
| `ACK` | INFLIGHT | COMMITTED | same delivery count |
| `RECEIVE_ORDERED` (after `LOCK_ORDERED_SUBSCRIPTION`, ...) | READY rows | INFLIGHT | ... |
| `finish_ordered_heads` (trigger, after any DELETE) | a head | READY | ... |

## Next
| `NOT_A_ROW` | x | y | z |"""
    assert state_change_rows(table) == ["ACK", "RECEIVE_ORDERED", "finish_ordered_heads"]
    with pytest.raises(AssertionError):
        state_change_rows(table.replace("| `ACK` |", "| ACK |"))


def test_the_head_revision_read_from_the_files_is_alembics():
    from alembic.script import ScriptDirectory

    from redelivery.store.db import MIGRATIONS, head_revision

    assert head_revision() == ScriptDirectory(str(MIGRATIONS)).get_current_head()


def test_files_and_functions_stay_small():
    """No Python file of the checkout over 600 lines, no function over 80 (migrations aside: each is
    one change): the package, the DAG files, the tests, the crash suite, the benchmarks, the demo."""
    long_files, long_functions = [], []
    folders = ("src", "dags", "plugins", "spark_jobs", "tests", "chaos", "bench", "demo", "harness")
    paths = [
        p
        for folder in folders
        for p in sorted((REPO_ROOT / folder).rglob("*.py"))
        if "migrations" not in p.parts
    ]
    for path in paths:
        text = path.read_text()
        where = path.relative_to(REPO_ROOT)
        if len(text.splitlines()) > 600:
            long_files.append(str(where))
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.end_lineno - node.lineno >= 80
            ):
                long_functions.append(f"{where}:{node.lineno} {node.name}")
    assert len(paths) > 100 and (long_files, long_functions) == ([], [])


def test_the_client_is_imported_from_the_package():
    """``from redelivery import Client, Message`` (README's first example), loaded on first use."""
    import subprocess
    import sys

    code = (
        "import sys, redelivery; assert 'redelivery.client' not in sys.modules; "
        "from redelivery import Client, Message, Outcome; from redelivery import client; "
        "assert (Client, Message, Outcome) == (client.Client, client.Message, client.Outcome); "
        "print(sorted(redelivery.__all__))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with pytest.raises(ImportError):
        exec("from redelivery import NoSuchName")
