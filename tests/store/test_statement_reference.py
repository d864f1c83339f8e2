"""docs/statements.sql is every statement whole, as the code sends it, and stays equal to the code
(issue 39.5): a reviewer reads a statement's diff there. ``redelivery db sql NAME`` prints one."""

from __future__ import annotations

import subprocess

from helpers import REPO_ROOT
from redelivery.store import statements as S


def test_docs_statements_sql_is_the_code():
    written = (REPO_ROOT / "docs" / "statements.sql").read_text()
    assert written == S.reference(), "docs/statements.sql is stale: run make docs-reference"


def test_every_statement_is_in_it_whole_and_ends_once():
    text = S.reference()
    for name in S.ALL:
        whole = S.sql(name)
        assert f"\n{whole};\n" in text
        assert whole.startswith(f"/* redelivery:{name} */") and not whole.endswith(";")
        assert "{" not in whole.replace("'{", "").replace("{}", ""), f"{name} has a hole left"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(REPO_ROOT / ".venv" / "bin" / "redelivery"), "db", "sql", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_db_sql_prints_one_statement_and_names_the_closest_for_a_typo():
    one = run("PROMOTE_CAPPED")
    assert one.returncode == 0 and one.stdout == S.sql("PROMOTE_CAPPED") + "\n"
    typo = run("RECEIV")
    assert typo.returncode == 2 and typo.stdout == ""
    assert typo.stderr.strip() == "error: no statement is named 'RECEIV' (did you mean RECEIVE?)"
