"""Migration steps that keep a live state store writable while they run (used by ``versions/``).

A plain ``CREATE INDEX`` or ``DROP INDEX`` on ``deliveries`` takes a lock that conflicts with every
write and, while it waits for a long publish to finish, queues every later receive, ack and publish
behind it; the build then holds them for as long as it reads the table. ``build_index`` uses
``CREATE INDEX CONCURRENTLY`` instead, which waits for open transactions without blocking anyone.
The other steps of a migration run under ``lock_timeout`` (``redelivery.store.db.migrate``), so a step
that needs an exclusive lock gives up quickly, lets the writers through and is tried again.
"""

from __future__ import annotations

import hashlib
import re
from contextlib import contextmanager

from alembic import op
from sqlalchemy import text

SCHEMA = "redelivery"
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,50}")


def _index_state(name: str) -> bool | None:
    """True: index ``name`` exists and is valid; False: it exists INVALID (a concurrent build was
    cut off); None: no such index."""
    row = (
        op.get_bind()
        .execute(
            text(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relnamespace = CAST(:schema AS regnamespace) AND c.relname = :name"
            ),
            {"schema": SCHEMA, "name": name},
        )
        .fetchone()
    )
    return None if row is None else bool(row[0])


@contextmanager
def _without_timeouts():
    """Alembic's autocommit block (what the migration did before is committed first) with no
    lock_timeout or statement_timeout: a concurrent build waits for every open transaction as long
    as it lasts, and a user's statement_timeout (PGOPTIONS) would cancel it halfway."""
    with op.get_context().autocommit_block():
        bind = op.get_bind()
        settings = "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
        saved = bind.execute(text(settings)).one()
        op.execute("SET lock_timeout = 0")
        op.execute("SET statement_timeout = 0")
        try:
            yield
        finally:
            restore = (
                "SELECT set_config('lock_timeout', :l, false), set_config('statement_timeout', :s, false)"
            )
            bind.execute(text(restore), {"l": saved[0], "s": saved[1]})


def build_index(name: str, definition: str, *, replace: bool = False, unique: bool = False) -> None:
    """Build index ``redelivery.<name>`` as ``CREATE [UNIQUE] INDEX <name> ON redelivery.<definition>``
    without blocking writes: built CONCURRENTLY as ``<name>_build``, then (``replace``) the old
    index dropped CONCURRENTLY, then renamed (a SHARE UPDATE EXCLUSIVE lock: writes go on).

    Runs outside the migration's transaction (Alembic's autocommit block: what the migration did
    before is committed first, so call it before the migration's other steps) and waits for open
    transactions as long as they last (no lock_timeout or statement_timeout for the build).
    Idempotent, so a migration cut off anywhere (a killed process, a lock timeout) finishes on
    the next run: a cut-off build leaves ``<name>_build`` INVALID, which is dropped and built
    again; a valid one whose old index is already gone is renamed; a valid ``<name>`` is kept
    unless ``replace``. Raises ``ValueError`` for a name that is not a plain lower-case
    identifier."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"index name {name!r} is not a plain identifier")
    building = f"{name}_build"
    with _without_timeouts():
        current, built = _index_state(name), _index_state(building)
        if built is True and current is None:  # cut off between the drop and the rename
            pass
        else:
            if built is not None:
                op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.{building}")
            if current is True and not replace:
                return
            kind = "UNIQUE INDEX" if unique else "INDEX"
            op.execute(f"CREATE {kind} CONCURRENTLY {building} ON {SCHEMA}.{definition}")
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.{name}")
    with op.get_context().autocommit_block():  # under the migration's lock_timeout again
        op.execute(f"ALTER INDEX {SCHEMA}.{building} RENAME TO {name}")


def build_partitioned_index(name: str, table: str, columns: str, where: str | None = None) -> None:
    """Build index ``redelivery.<name>`` on partitioned table ``redelivery.<table>`` (``columns``:
    its column list; ``where``: a partial index's predicate, written in code) without blocking
    writes, as PostgreSQL allows it: the parent's index is made
    ``ON ONLY`` the parent (INVALID, and made by every partition created from then on), each
    existing partition's index is built CONCURRENTLY as ``<partition>_<name suffix>`` in the
    partition's schema and attached; the parent's index is valid once every partition's is.

    Idempotent like ``build_index``: a cut-off concurrent build (INVALID) is dropped and built
    again, an attached index is left alone. Raises ``ValueError`` for a name that is not a plain
    lower-case identifier."""
    if not _NAME.fullmatch(name) or not _NAME.fullmatch(table):
        raise ValueError(f"index name {name!r} or table {table!r} is not a plain identifier")
    suffix = name.removeprefix(f"{table}_")
    bind = op.get_bind()
    predicate = f" WHERE {where}" if where else ""
    op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON ONLY {SCHEMA}.{table} ({columns}){predicate}")
    partitions = bind.execute(
        text(
            "SELECT n.nspname, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE i.inhparent = CAST(:parent AS regclass) ORDER BY 1, 2"
        ),
        {"parent": f"{SCHEMA}.{table}"},
    ).fetchall()
    for schema, partition in partitions:
        child = _child_index_name(partition, suffix)
        state = bind.execute(
            text(
                "SELECT i.indisvalid, EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)"
                " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relnamespace = CAST(:schema AS regnamespace) AND c.relname = :name"
            ),
            {"schema": schema, "name": child},
        ).fetchone()
        if state is not None and state[1]:
            continue  # built and attached (a partition made after the parent's index, or a re-run)
        qualified = f'"{schema}"."{child}"'
        with _without_timeouts():
            if state is not None and not state[0]:
                op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {qualified}")
                state = None
            if state is None:
                op.execute(
                    f'CREATE INDEX CONCURRENTLY "{child}" ON "{schema}"."{partition}" ({columns}){predicate}'
                )
        op.execute(f"ALTER INDEX {SCHEMA}.{name} ATTACH PARTITION {qualified}")


def _child_index_name(partition: str, suffix: str) -> str:
    """The name of ``partition``'s index ``suffix``: ``<partition>_<suffix>``, or, when that is
    longer than PostgreSQL's 63 bytes, the partition's name cut short with 8 hex digits of its
    hash, so that two DLQ tables whose names agree in their first 56 characters never share one
    (a DLQ table's name has up to 63 characters; names are ASCII, rules.names)."""
    name = f"{partition}_{suffix}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(partition.encode()).hexdigest()[:8]
    return f"{partition[: 63 - len(suffix) - 10]}_{digest}_{suffix}"
