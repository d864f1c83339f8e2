"""The package's shape, checked without any server: one-way imports (the map in
docs/ARCHITECTURE.md), one naming rule, one default configuration, one place for SQL."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from redelivery.settings import REPO_ROOT

PACKAGE = REPO_ROOT / "plugins" / "redelivery"
#: Modules bottom to top: each may import only modules before it (docs/ARCHITECTURE.md, "Map").
ORDER = [
    "errors", "settings", "levels", "names", "statements", "spark.tasks",
    "policies", "codec", "producer",
    "config", "embedded", "db",
    "catalog", "transitions", "dead_letters",
    "client", "http_delivery", "redrive", "maintenance", "metrics",
    "spark.jvm", "spark.connect_server", "spark.session",
    "spark.tier_job", "spark.publish_job", "spark.consumer_job", "spark.dataframes",
    "airflow.env", "airflow.local", "airflow.hooks", "airflow.assets", "airflow.triggers", "airflow.params",
    "airflow.trigger_check",
    "airflow.operators", "airflow.dags", "airflow.consumer_dag", "airflow.redrive_dag",
    "airflow.maintenance_dag", "airflow.charts", "airflow.dlq_page", "airflow.ui",
    "cli", "__main__",
    "demo.receiver", "demo.handlers", "demo.report", "demo.run", "demo.__main__",
]  # fmt: skip
PACKAGES = {"", "spark", "airflow", "demo"}  # their __init__ files import nothing of ours


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
    assert names - PACKAGES == set(ORDER), "add new modules to ORDER and to the map in docs/ARCHITECTURE.md"


def test_imports_go_one_way_down_the_map():
    wrong = []
    for path in package_modules():
        name = module_name(path)
        if name in PACKAGES:
            assert imports_of(path) == set(), f"{path} should import nothing of ours"
            continue
        for target in imports_of(path):
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
    assert set(ORDER) - {"__main__", "demo.__main__"} <= set(listed)


def test_sql_lives_in_the_statements_module():
    """No other module of the core writes SQL text: statements are named constants."""
    sql = re.compile(r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM)\b")
    core = [p for p in package_modules() if module_name(p) not in ("statements", "demo.run", "demo.report")]
    offenders = [f"{p.relative_to(REPO_ROOT)}:{n}" for p in core
                 for n, line in enumerate(p.read_text().splitlines(), 1) if sql.search(line)]  # fmt: skip
    assert offenders == []


def test_the_migration_keeps_the_name_rule():
    """The schema's CHECK constraints (the latest migration that sets them) are a frozen copy of the
    naming rule in redelivery.names."""
    from redelivery.names import NAME_REGEX

    latest = None
    for path in sorted((PACKAGE / "migrations" / "versions").glob("*.py")):
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


def test_the_state_changes_table_lists_every_state_change():
    from redelivery import statements as S

    text = (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = text[text.index("## State changes") :].split("\n## ")[0]
    assert re.findall(r"^\| `([A-Z_]+)` \|", table, re.M) == list(S.STATE_CHANGES)
    assert set(S.STATE_CHANGES) <= set(S.ALL)


def test_the_head_revision_read_from_the_files_is_alembics():
    from alembic.script import ScriptDirectory

    from redelivery.db import MIGRATIONS, head_revision

    assert head_revision() == ScriptDirectory(str(MIGRATIONS)).get_current_head()
