"""Standing redrive policies (issue 41): dead letters that come back by themselves.

A policy (``rules.standing.StandingRedrive``) is declared in the config file (``standing_redrives:``,
written into the state store by every tick) or by an operator (``redelivery standing-redrive add``).
A *tick* (``tick``; the ``redelivery_standing_redrives`` DAG runs one every ``TICK_SECONDS``, and
``redelivery standing-redrive tick`` runs one by hand) looks at each active policy:

1. it holds the policy (a session advisory lock: two ticks never run it at once, and one that dies
   lets go with its connection; so a direct or session-pooled connection, never a transaction
   pooler's), ends the runs a tick that died left running, and claims it when it is due
   (``STANDING_CLAIM``: its trigger fired, no breaker of its group is open);
2. it stops the policy, and says so, when too many of the messages it brought back died again
   (of those that settled: acked, or dead again);
3. it counts the dead letters the policy may bring back now (below the generation limit, past their
   generation's wait); when there are some, it runs a redrive run of them (``redrive.redrive``,
   rate-limited, at most ``max_messages``, under the groups' backlog caps), audited in
   ``redrive_runs`` as ``standing:<name>`` with the policy's id; between batches the run goes on
   only while the policy is active and no breaker of its group is open;
4. it releases the claim, saying whether matching dead letters are left (which makes the next tick
   run it again, whatever its trigger).

A process that dies anywhere leaves every message in one place (each batch is atomic) and the policy
marked as having more left: the next tick runs it again. A message comes back at most
``max_generations`` times whatever happens: the limit is on the dead letter's redrive count, which
each move raises in the move's own transaction.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from redelivery.config import RedeliveryConfig, cached_config
from redelivery.dead_letters import DlqFilter, filter_params
from redelivery.errors import ConfigError, RedeliveryError, UnknownGroupError
from redelivery.redrive import RedriveRequest, could_move, redrive
from redelivery.rules.standing import StandingRedrive, died_again_too_often
from redelivery.store import catalog, db
from redelivery.store import statements as S

LOG = logging.getLogger("redelivery.standing")
#: A tick every this many seconds (the ``redelivery_standing_redrives`` DAG).
TICK_SECONDS = 30
#: How many of the latest messages a policy brought back its die-again ratio reads.
DIED_AGAIN_SAMPLE = 10_000
#: The advisory lock namespace of a tick's hold on a policy (``statements.STANDING_TRY_HOLD``).
STANDING_LOCK = 7_424_006
FIELDS = ("id", "name", "group", "source", "spec", "state", "stopped_reason", "changed_at", "changed_by",
          "last_run_at", "runs", "brought_back", "more_left", "running")  # fmt: skip


def sync(conn: psycopg.Connection, config: RedeliveryConfig) -> dict[str, str]:
    """Write the config file's policies into the state store (``config`` is the file's), and forget
    those it no longer lists. Returns ``{name: why}`` for each policy it could not write: its group
    does not exist yet, or an operator's policy has its name."""
    problems, names, group_ids, specs = {}, [], [], []
    for policy in config.standing_redrives:
        try:
            group_ids.append(catalog.group(conn, policy.group)[0])
        except UnknownGroupError:
            problems[policy.name] = f"no consumer group {policy.group!r} yet"
            continue
        names.append(policy.name)
        specs.append(Jsonb(policy.model_dump(mode="json")))
    with conn.transaction():
        params = {"names": names, "group_ids": group_ids, "specs": specs}
        taken = [row[0] for row in conn.execute(S.STANDING_SYNC_CONFIG, params)]
        conn.execute(S.STANDING_FORGET_CONFIG, {"names": [p.name for p in config.standing_redrives]})
    return problems | {name: "an operator's standing redrive has the name" for name in taken}


def policies(conn: psycopg.Connection, name: str | None = None) -> list[dict]:
    """Every standing redrive (or the one called ``name``), by name: ``{"id", "name", "group",
    "source" ('config' or 'operator'), "spec" (the policy as JSON), "state" ('active' or
    'stopped'), "stopped_reason", "changed_at", "changed_by", "last_run_at" (the last tick that
    found it due), "runs", "brought_back" (messages its runs moved), "more_left", "running"}``."""
    rows = conn.execute(S.STANDING_LIST, {"name": name, "namespace": STANDING_LOCK}).fetchall()
    return [dict(zip(FIELDS, row, strict=True)) for row in rows]


def add(conn: psycopg.Connection, policy: StandingRedrive, by: str) -> None:
    """An operator's policy. Raises ``UnknownGroupError``, or ``RedeliveryError`` when the name is
    taken; changes nothing then."""
    group_id = catalog.group(conn, policy.group)[0]
    if policy.topic is not None:
        catalog.topic_id(conn, policy.topic)  # UnknownTopicError
    params = {
        "name": policy.name,
        "group_id": group_id,
        "spec": Jsonb(policy.model_dump(mode="json")),
        "changed_by": by,
    }
    if conn.execute(S.STANDING_ADD, params).fetchone() is None:
        raise RedeliveryError(f"a standing redrive is already called {policy.name!r}")


def remove(conn: psycopg.Connection, name: str) -> None:
    """Remove an operator's policy (its runs stay in the audit). Raises ``RedeliveryError`` when
    there is none, or it is the config file's (remove it from the file)."""
    if conn.execute(S.STANDING_REMOVE, {"name": name}).fetchone() is None:
        raise RedeliveryError(_missing(conn, name, "removed from the config file"))


def set_state(conn: psycopg.Connection, name: str, by: str, reason: str | None) -> str:
    """Stop policy ``name`` (``reason`` given) or resume it (None: the die-again ratio counts from
    now on). Returns the state it had. Raises ``RedeliveryError`` when there is none."""
    if reason is not None and not reason.strip():
        raise RedeliveryError("a stop needs a reason (--reason)")
    row = conn.execute(S.STANDING_SET_STATE, {"name": name, "reason": reason, "changed_by": by}).fetchone()
    if row is None:
        raise RedeliveryError(_missing(conn, name, None))
    return row[0]


def _missing(conn: psycopg.Connection, name: str, config_hint: str | None) -> str:
    found = policies(conn, name)
    if found and config_hint:
        return f"standing redrive {name!r} comes from the config file: it is {config_hint}"
    known = [p["name"] for p in policies(conn)]
    return f"no standing redrive is called {name!r} (known: {', '.join(known) or 'none'})"


@dataclass
class TickReport:
    """What a tick did: the runs' audit records, policies stopped (``{name: why}``), problems
    (``{name: error}``: a policy whose run failed, or one the config file could not write)."""

    runs: list[dict] = field(default_factory=list)
    stopped: dict[str, str] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"runs": self.runs, "stopped": self.stopped, "problems": self.problems}


def tick(
    url: str | None = None,
    config: RedeliveryConfig | None = None,
    *,
    sync_config: bool = False,
    log: Callable[[str], object] = print,
    should_stop: Callable[[], bool] = lambda: False,
    wait: Callable[[float], object] = time.sleep,
) -> TickReport:
    """One tick over every active standing redrive, the one looked at longest ago first (the
    module's steps 1 to 4); returns a ``TickReport``. ``sync_config``: write the config file's
    policies into the state store first (``sync``; the ``redelivery_standing_redrives`` DAG's ticks,
    whose config is the deployment's: a tick of a process with another config must not rewrite
    them). ``should_stop()`` is asked between batches of a run (the run ends ``stopped``, left for
    the next tick). A policy whose run fails is reported and left for the next tick; the others
    run."""
    url, config = url or db.database_url(), config or cached_config()
    report = TickReport()
    with db.connect(url, autocommit=True) as conn:
        db.check_schema(conn)
        if sync_config:
            report.problems.update(sync(conn, config))
        found = sorted(policies(conn), key=lambda r: (r["last_run_at"] is not None, r["last_run_at"] or 0))
        for row in found:
            if row["state"] != "active" or should_stop():
                continue
            try:
                _tick_one(conn, url, config, row, report, log, should_stop, wait)
            except (RedeliveryError, ValidationError, psycopg.Error) as exc:
                report.problems[row["name"]] = f"{type(exc).__name__}: {exc}"
    return report


def _tick_one(conn, url, config, row, report: TickReport, log, should_stop, wait) -> None:
    policy = StandingRedrive.model_validate(row["spec"])
    hold = {"namespace": STANDING_LOCK, "id": row["id"]}
    if not conn.execute(S.STANDING_TRY_HOLD, hold).fetchone()[0]:
        return  # another tick is running it
    try:
        conn.execute(S.STANDING_END_ORPHANS, {"id": row["id"]})  # runs of a tick that died
        due = {"id": row["id"], "every": policy.seconds("every")}
        claimed = conn.execute(S.STANDING_CLAIM, due).fetchone()
        if claimed:  # else: not due, or a breaker of its group is not closed
            Claimed(conn, url, config, row["id"], policy, *claimed).go(report, log, should_stop, wait)
    finally:
        if not conn.execute(S.STANDING_LET_GO, hold).fetchone()[0]:  # a pooler gave another backend
            LOG.warning("standing redrive %s: its hold was not this session's to let go", row["name"])


@dataclass
class Claimed:
    """A policy claimed by a tick: steps 2 to 4. ``trigger_at``: the breaker close it brings back
    the dead letters of (``after: breaker_closed``: those dead-lettered before it and since
    ``trigger_from``, the close before it or the policy's creation)."""

    conn: psycopg.Connection
    url: str
    config: RedeliveryConfig
    policy_id: int
    policy: StandingRedrive
    trigger_at: datetime | None
    trigger_from: datetime | None

    def go(self, report: TickReport, log, should_stop, wait) -> None:
        more_left, ran = True, False  # a run that raises leaves it to the next tick
        try:
            if self.policy.after == "breaker_closed" and self.trigger_at is None:
                more_left = False  # no close seen yet (resumed, or its rule changed): nothing of an outage
                return
            died_again, settled = self.conn.execute(
                S.STANDING_DIED_AGAIN, {"id": self.policy_id, "limit": DIED_AGAIN_SAMPLE}
            ).fetchone()
            if died_again_too_often(self.policy, settled, died_again):
                _stop_itself(self.conn, self.policy, settled, died_again, report, log)
                more_left = False
                return
            if not self._count(self.generations):
                more_left = self._waiting()
            elif could_move(self.conn, self.config, self._request(), self.generations):
                ran = True
                record = self._redrive(log, should_stop, wait)
                report.runs.append(record)
                if record["status"] == "success" and (record["matched"] or 0) <= record["moved"]:
                    more_left = self._waiting()
            # else the groups' backlog caps are full: no run (no row), and the next tick looks again
        finally:
            release = {"id": self.policy_id, "more_left": more_left, "ran": ran}
            self.conn.execute(S.STANDING_RELEASE, release)

    @property
    def generations(self) -> tuple[int, float]:
        return (self.policy.max_generations, float(self.policy.seconds("generation_wait")))

    def _selection(self) -> dict:
        if self.policy.after != "breaker_closed":
            return self.policy.selection()
        return {
            **self.policy.selection(),
            "dead_lettered_from": self.trigger_from,
            "dead_lettered_to": self.trigger_at,
        }

    def _count(self, generations: tuple[int, float]) -> int:
        selection = DlqFilter(**self._selection())
        return self.conn.execute(S.DLQ_COUNT, filter_params(self.conn, selection, generations)).fetchone()[0]

    def _waiting(self) -> bool:
        """After a breaker closed: whether dead letters of the close wait for their generation's
        time (the next ticks look again); an ``every`` policy's next run comes by its clock."""
        return self.policy.after == "breaker_closed" and bool(self._count((self.policy.max_generations, 0.0)))

    def _request(self) -> RedriveRequest:
        return RedriveRequest(
            **self._selection(), max_messages=self.policy.max_messages, rate_limit=self.policy.rate_limit,
            reset_reconsume_times=True, dry_run=False,
        )  # fmt: skip

    def _redrive(self, log, should_stop, wait) -> dict:
        """The run: between its batches it goes on only while the policy is active and no breaker
        of its group is open (an operator's stop, an outage that came back)."""

        def stop() -> bool:
            wanted = self.conn.execute(S.STANDING_STILL_WANTED, {"id": self.policy_id}).fetchone()
            return should_stop() or not (wanted and wanted[0])

        request = self._request()
        name = self.policy.name
        return redrive(
            request, run_key=f"standing/{name}/{uuid.uuid4().hex}", triggered_by=f"standing:{name}",
            url=self.url, log=log, should_stop=stop, wait=wait, config=self.config,
            standing_id=self.policy_id, generations=self.generations,
        )  # fmt: skip


def _stop_itself(conn, policy, settled: int, died_again: int, report: TickReport, log) -> None:
    why = (
        f"{died_again} of the last {settled} messages it brought back that settled died again "
        f"(stop_ratio {policy.stop_ratio}): resume it with `redelivery standing-redrive resume "
        f"{policy.name}` once the cause is fixed"
    )
    set_state(conn, policy.name, "redelivery", why)
    report.stopped[policy.name] = why
    LOG.error("standing redrive %s of group %s stopped itself: %s", policy.name, policy.group, why)
    log(f"standing redrive {policy.name} stopped itself: {why}")


def run_ticks(
    until: datetime,
    *,
    url: str | None = None,
    config: RedeliveryConfig | None = None,
    clock: Callable[[], datetime],
    wait: Callable[[float], bool],
    stop: Callable[[], bool] = lambda: False,
    log: Callable[[str], object] = print,
    paused: Callable[[], bool] = lambda: False,
) -> int:
    """A DAG run's ticks (each writing the config file's policies first: ``tick``'s
    ``sync_config``), one every ``TICK_SECONDS`` until ``until`` (timezone-aware): returns how many
    ran. ``wait(seconds)`` sleeps and returns True to stop, as ``stop()`` does (the task is being
    killed: a run stops between batches); ``paused()`` True (the DAG was paused) ends it before
    the next tick. A policy's problem is logged once, and again only when it changes; a tick that
    raises (the state store is down) likewise, and the next one tries again."""
    ticks, failing, said = 0, None, {}
    while clock() < until and not paused() and not stop():
        started = clock()
        try:
            done = tick(url, config, sync_config=True, log=log, wait=wait,
                        should_stop=lambda: stop() or clock() >= until)  # fmt: skip
            ticks, failing = ticks + 1, None
            for name, problem in done.problems.items():
                if said.get(name) != problem:
                    log(f"standing redrive {name}: {problem}")
            said = dict(done.problems)
        except (RedeliveryError, ConfigError, psycopg.Error) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if error != failing:
                log(f"a standing redrive tick failed (the next one tries again): {error}")
            failing = error
        left = TICK_SECONDS - (clock() - started).total_seconds()
        if left > 0 and wait(min(left, max((until - clock()).total_seconds(), 0))):
            break
    return ticks
