"""Every SQL statement of redelivery, by name. The one place to audit the state machine.

Each state change is one statement guarded by the state it expects (``state = 'INFLIGHT' AND
delivery_count = <the receipt's>`` ...): a change already made by an earlier or overlapping run
matches no row, and PostgreSQL's re-check of the ``WHERE`` clause after a row-lock wait (READ
COMMITTED) makes every message move at most once. Variants are parameters, never text: shared
pieces (the policy table, the receipt list, the dead-letter copy) are put together once, when this
module loads. Every statement starts with a ``/* redelivery:NAME */`` comment, so it can be found
in ``pg_stat_activity`` and in the server log; ``ALL`` maps each name to its text, and a test runs
``EXPLAIN`` on every one of them.

Parameters are psycopg named placeholders. Times: ``at`` is a timezone-aware ``datetime`` that
replaces the database clock (``None``: ``now()``); durations are float8 seconds.

``STATE_CHANGES`` names the statements that move a delivery from one state to another; the table in
docs/ARCHITECTURE.md ("State changes") lists the same, with the guard of each.
"""

from __future__ import annotations

# Each part by subject; this module is their one namespace (``statements.RECEIVE``).
from redelivery.store.statements._shared import *  # noqa: F403
from redelivery.store.statements.dead_letters import *  # noqa: F403
from redelivery.store.statements.housekeeping import *  # noqa: F403
from redelivery.store.statements.messages import *  # noqa: F403
from redelivery.store.statements.ordered import *  # noqa: F403
from redelivery.store.statements.reads import *  # noqa: F403
from redelivery.store.statements.tiers import *  # noqa: F403
from redelivery.store.statements.topology import *  # noqa: F403

# fmt: off
#: The statements that move deliveries between states (docs/ARCHITECTURE.md, "State changes").
STATE_CHANGES = ("RECEIVE", "ACK", "FAIL_RETRY", "FAIL_DEAD_LETTER", "EXPIRE_LEASES_RETRY",
                 "EXPIRE_LEASES_DEAD_LETTER", "PROMOTE", "PROMOTE_CAPPED", "DEAD_LETTER_OVER_MAX",
                 "REDRIVE_MOVE_BATCH")
#: Every statement by name (psycopg.sql compositions excepted): the EXPLAIN test runs them all.
ALL: dict[str, str] = {name: value for name, value in dict(globals()).items()
                       if isinstance(value, str) and value.startswith("/* redelivery:")}
# fmt: on
