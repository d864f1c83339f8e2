"""The documentation: README is a front door, the pages under docs/ are a site MkDocs builds with no
warning (a link to a page or an anchor that does not exist is one), and the configuration reference
is the code's: docs/configuration.md's tables are what ``redelivery.reference`` renders from the
settings and config models, so a setting missing from the page fails here (issue 39.6). No server."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from pydantic import BaseModel, Field

from helpers import REPO_ROOT, docs_page

README = (REPO_ROOT / "README.md").read_text()


def test_the_configuration_reference_is_current():
    from redelivery.reference import render

    page = docs_page("configuration.md")
    assert render(page) == page, "docs/configuration.md is not current: run `make docs-reference`"


def rows(table_start: str) -> dict[str, list[str]]:
    """The rows of the page's table whose header starts with ``table_start``, by their first cell."""
    page = docs_page("configuration.md")
    table = page[page.index(table_start) :].split("\n\n")[0]
    lines = [line for line in table.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
    return {row[0]: row for row in cells[2:]}


def test_every_setting_has_its_row_with_its_default():
    """A row per ``REDELIVERY_*`` variable, with its default (or the text that says it)."""
    from redelivery.settings import Settings

    table = rows("| variable |")
    assert len(table) == len(Settings.model_fields)
    for field, info in Settings.model_fields.items():
        row = table[f"`REDELIVERY_{field.upper()}`"]
        extra = info.json_schema_extra or {}
        default = info.get_default(call_default_factory=True)
        if "default_text" in extra:
            assert row[2] == extra["default_text"], row
        elif default is None:
            assert row[2] == "unset", row
        else:
            shown = str(default).lower() if isinstance(default, bool) else str(default)
            assert row[2] == f"`{shown}`", row
        assert row[3] and row[3] == " ".join(info.description.split()), row


def test_every_key_of_the_config_file_has_its_row():
    """Every key of ``config/redelivery.yaml`` (which spells out the defaults), nested ones as
    paths, is a row of the config table; so are the keys of each backoff kind."""
    table = rows("| key |")
    keys = {re.match(r"`([^`]+)`", key).group(1) for key in table}

    def paths(value, prefix=""):
        if isinstance(value, dict):
            for name, inner in value.items():
                if prefix.endswith("backoff.") and name == "kind":
                    yield f"{prefix}kind: {inner}"
                    continue
                yield f"{prefix}{name}"
                yield from paths(inner, f"{prefix}{name}.")
        elif isinstance(value, list):
            for item in value:
                yield from paths(item, prefix.rstrip(".") + "[].")

    shipped = yaml.safe_load((REPO_ROOT / "config" / "redelivery.yaml").read_text())
    assert set(paths(shipped)) <= keys
    for kind in ("levels", "rocketmq_broker", "exponential", "rocketmq_exponential", "fixed"):
        assert f"policies[].backoff.kind: {kind}" in keys


def test_a_field_without_a_description_cannot_be_rendered():
    from redelivery.reference import _config_rows

    class Undescribed(BaseModel):
        said: int = Field(1, description="what it does")
        silent: int = 2

    with pytest.raises(ValueError, match="Undescribed.silent has no description"):
        _config_rows(Undescribed, "")


def test_readme_is_a_front_door_to_every_page():
    """At most ~300 lines: what it is, the two commands, install, a first example, and a link to
    every page of the site."""
    assert README.count("\n") <= 300
    for heading in ("## Two commands", "## Install", "## Using it", "## Where to go next"):
        assert f"\n{heading}\n" in README
    site = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())

    def pages(nav):
        for entry in nav:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]

    listed = set(pages(site["nav"])) - {"index.md"}
    assert listed == {p.name for p in (REPO_ROOT / "docs").glob("*.md")}, "a page is not in mkdocs.yml's nav"
    where = README[README.index("## Where to go next") :]
    assert {page for page in listed if f"](docs/{page})" not in where} == set()


def test_the_site_builds_without_a_warning(tmp_path):
    """``mkdocs build --strict`` (what ``make docs`` runs): a broken link or anchor fails it."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "index.html").exists()  # README, the home page
    assert (tmp_path / "site" / "configuration" / "index.html").exists()
