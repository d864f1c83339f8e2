"""The database's closed vocabularies, read from the migrated schema, are the words of
``redelivery.rules.words``: a word added to one side only (a new ``on_exhausted`` mode in the code
without its migration, a reason in a migration the code does not know) fails here."""

from __future__ import annotations

import re

import psycopg

from redelivery.rules import words


def _enum(conn, name: str) -> tuple[str, ...]:
    rows = conn.execute(
        """SELECT e.enumlabel FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid
           JOIN pg_namespace n ON n.oid = t.typnamespace
           WHERE n.nspname = 'redelivery' AND t.typname = %s ORDER BY e.enumsortorder""",
        (name,),
    )
    return tuple(r[0] for r in rows)


def _check(conn, table: str, name: str | None = None, column: str | None = None) -> str:
    """The one validated CHECK constraint of ``table`` named ``name``, or on ``column`` alone."""
    rows = conn.execute(
        """SELECT c.conname, pg_get_constraintdef(c.oid), c.convalidated,
                  array(SELECT a.attname::text FROM pg_attribute a
                        WHERE a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey))
           FROM pg_constraint c WHERE c.contype = 'c' AND c.conrelid = %s::regclass""",
        (f"redelivery.{table}",),
    ).fetchall()
    found = [
        (definition, valid)
        for conname, definition, valid, columns in rows
        if conname == name or (name is None and columns == [column])
    ]
    assert len(found) == 1, rows
    [(definition, valid)] = found
    assert valid, f"{definition} is NOT VALID"
    return definition


def _words(definition: str) -> tuple[str, ...]:
    """The quoted words of a constraint's definition, in order (``'halt'::text`` -> ``halt``)."""
    return tuple(re.findall(r"'([^']*)'::", definition))


def test_the_enums_are_the_declared_words(database_url):
    with psycopg.connect(database_url) as conn:
        assert _enum(conn, "delivery_state") == words.STATES
        assert _enum(conn, "dlq_reason") == words.REASONS


def test_the_checks_are_the_declared_words(database_url):
    with psycopg.connect(database_url) as conn:
        on_exhausted = _check(conn, "subscriptions", column="on_exhausted")
        rows = _check(conn, "deliveries", name="deliveries_state_key_check")
        [default] = conn.execute(
            "SELECT column_default FROM information_schema.columns WHERE table_schema = 'redelivery'"
            " AND table_name = 'subscriptions' AND column_name = 'on_exhausted'"
        ).fetchone()
    assert default == f"'{words.DEFAULT_ON_EXHAUSTED}'::text"
    assert _words(on_exhausted) == words.ON_EXHAUSTED
    assert sorted(_words(rows)) == sorted(words.ROW_STATES)
    unkeyed, keyed = rows.split(" OR ")
    assert "key IS NOT NULL" in keyed and "key" not in unkeyed
    assert _words(keyed) == words.KEYED_STATES


def test_the_words_read_from_a_check():
    assert _words("CHECK ((on_exhausted = ANY (ARRAY['continue'::text, 'halt'::text])))") == (
        "continue",
        "halt",
    )
    assert words.one_of(("continue", "halt")) == "'continue' or 'halt'"
    assert words.one_of(("a", "b", "c")) == "'a', 'b' or 'c'"
