"""Consuming of the client: every answer to a receipt (``ack``, ``nack`` / ``reconsume_later``,
``reject``, ``settle``) and ``extend_lease``. The leases themselves (``receive``, ``lease_rows``)
are ``messaging.leasing``'s."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TypeVar

import orjson
import psycopg
from psycopg.pq import TransactionStatus

from redelivery.errors import ForeignReceiptError, InvalidLevelError
from redelivery.messaging import breaking
from redelivery.messaging.codec import Receipt, ReceivedMessage
from redelivery.messaging.context import Role
from redelivery.messaging.leasing import check_lease
from redelivery.messaging.receipts import (
    Outcome,
    check_at,
    check_receipt,
    error_lookup,
    failures_of,
    int_array,
    plan_outcome,
    receipt_lookup,
    receipts_of,
    refusing_foreign_receipts,
    retry_mode,
)
from redelivery.rules.breaker import counts
from redelivery.rules.failures import LEASE_EXPIRED_CLASS, describe
from redelivery.store import catalog, db
from redelivery.store import statements as S

T = TypeVar("T")
IDLE = TransactionStatus.IDLE
#: A failure as a call gives it: a text or an exception, one for all messages or one per message.
ErrorArg = str | BaseException | Sequence[str | BaseException | None] | None


class Consumer(Role):
    """The answering role of a client (``Client.consumer``; ``Client`` offers its public calls as
    its own)."""

    #: mode -> (outcome in the attempt history, dead-letter reason, dead-letter without a retry)
    _MODES = {
        "next": ("nack", "MAX_DELIVERIES_EXCEEDED", False),
        "level": ("reconsume_later", "MAX_DELIVERIES_EXCEEDED", False),
        "delay": ("reconsume_later", "MAX_DELIVERIES_EXCEEDED", False),
        "reject": ("rejected", "REJECTED", True),
        "negative": ("negative_level", "NEGATIVE_LEVEL", True),
    }

    def ack(self, group: str, messages: ReceivedMessage | Iterable[ReceivedMessage]) -> int:
        """Commit received messages; return how many were acknowledged.

        An ack counts only for the delivery it answers (same delivery count) while that delivery is
        still INFLIGHT; a late or repeated ack changes nothing and is counted as a stale receipt,
        so no message is ever committed twice; so is the late receipt of a message retention has
        dropped from the log since. Raises ``ForeignReceiptError`` for a message another group
        received or a receipt naming another topic than its message's, ``TypeError`` for anything
        but a ``ReceivedMessage`` and ``TypeError`` / ``ValueError`` for a message id or delivery
        count that is not an int in range (``check_receipt``), before anything changes."""
        group_id, _ = self.context.group(group)
        items = receipts_of(group, messages)
        if not items:
            return 0
        return self._answer(group_id, acks=items, plans=[], failed=0, group=group)["acked"]

    def extend_lease(
        self,
        group: str,
        messages: ReceivedMessage | Receipt | Iterable[ReceivedMessage | Receipt],
        invisible_duration: float,
        at: datetime | None = None,
    ) -> int:
        """Keep received messages invisible for ``invisible_duration`` seconds from now (or
        ``at``), for work longer than the lease (SQS ``ChangeMessageVisibility``, Kafka KIP-1222's
        ``RENEW``): each delivery still INFLIGHT under its receipt whose lease has not ended at the
        call's time (``invisible_until`` after ``at``, or now) gets its new end; its delivery count
        does not change. A late or repeated receipt (the lease ended, whether or not a tier run
        moved the message on since: SQS's MessageNotInflight; or it was answered) changes nothing
        and is counted as a stale receipt. ``messages``: ``ReceivedMessage`` objects or ``Receipt``
        tuples (message id, delivery count, topic, group). Returns how many leases were extended.
        Raises, before anything changes, ``ValueError`` (``invisible_duration`` outside 1..43200
        seconds, the lease's bounds; a receipt's number out of range), ``TypeError`` (not a
        receipt, a receipt's number not an int: ``check_receipt``), what ``check_at`` raises,
        ``ForeignReceiptError`` (a receipt of another group, or naming another topic than its
        message's)."""
        check_lease(1, invisible_duration)
        check_at(at)
        group_id, _ = self.context.group(group)
        items = receipts_of(group, messages, also=Receipt)
        if not items:
            return 0
        params = {
            "group_id": group_id,
            **self._receipt_params(items),
            "invisible_duration": float(invisible_duration),
            "at": at,
            "count_stale": True,
        }

        def extend() -> int:  # one statement: a receipt of another topic undoes it (RD001)
            return self.conn.execute(S.EXTEND_LEASE, params, prepare=False).fetchone()[0]

        with refusing_foreign_receipts():
            return db.retry_lock_conflicts(lambda: self._alone_or_in(extend))

    def nack(
        self,
        group: str,
        messages: ReceivedMessage | Iterable[ReceivedMessage],
        error: ErrorArg = None,
        at: datetime | None = None,
    ) -> int:
        """Report failed deliveries; each retry waits as the group's policy says for its retry
        number (default: the RocketMQ 5 table, RocketMQ 5, "Consumption retry"), and a message
        whose reconsume times are used up is dead-lettered. Returns how many were retried or
        dead-lettered (stale receipts change nothing and are counted as stale). ``error``: one
        text or exception, or one per message; an exception keeps its class, the top frame of
        the consumer's code and its last frames, and every failure gets a signature (dead letters
        are grouped by it: ``rules.failures``, issue 40). Raises, before anything changes, what
        ``ack`` raises for the receipts, what ``check_at`` raises for ``at``, ``ValueError`` (an
        error text PostgreSQL cannot store, or not one per message)."""
        return self._fail(group, messages, error, at, mode="next")

    def reconsume_later(
        self,
        group: str,
        messages: ReceivedMessage | Iterable[ReceivedMessage],
        *,
        delay: int | None = None,
        level: int | None = None,
        error: ErrorArg = None,
        at: datetime | None = None,
    ) -> int:
        """Retry later, Pulsar's ``reconsumeLater`` (TDMQ Pulsar, "Message retry and dead-letter
        mechanism"): after ``delay`` whole seconds (1..864000), or at delay ``level``, or with
        neither at the next level (the policy's wait for the next retry).

        ``level`` follows the brokers (TDMQ Pulsar, "Message retry and dead-letter mechanism";
        RocketMQ broker, "RocketMQ message retry"): ``n >= 1`` indexes the policy's
        explicit level table (RocketMQ and Pulsar presets: the broker's 18 levels ``1s 5s 10s 30s
        1m ... 2h``, so level 3 is 10 s; Artemis: the routing table); above the table RocketMQ takes
        its last level, the other presets refuse it; ``0`` is the next level (RocketMQ
        ``delayLevel == 0``: ``3 + reconsumeTimes``); a negative level dead-letters at once
        (reason NEGATIVE_LEVEL). Raises ``InvalidDelayError``, ``InvalidLevelError``,
        ``ValueError`` (both given), and what ``nack`` raises, before changing anything."""
        mode, seconds, level = retry_mode(delay, level)
        return self._fail(group, messages, error, at, mode=mode, delay=seconds, level=level)

    def reject(
        self,
        group: str,
        messages: ReceivedMessage | Iterable[ReceivedMessage],
        error: ErrorArg = None,
        at: datetime | None = None,
    ) -> int:
        """Dead-letter received messages at once (reason REJECTED), whatever their attempts.
        Returns how many were dead-lettered; raises what ``nack`` raises."""
        return self._fail(group, messages, error, at, mode="reject")

    def _fail(self, group: str, messages, error, at, *, mode: str, delay: int = 0, level: int = 0) -> int:
        check_at(at)
        group_id, _ = self.context.group(group)
        items = receipts_of(group, messages)
        plans = self._plan_failures(
            group_id, group, items, failures_of(error, len(items)), at, mode, delay, level
        )
        counts = self._answer(group_id, acks=[], plans=plans, failed=len(items), check=items, group=group)
        return counts["retried"] + counts["dead_lettered"]

    def _answer(
        self,
        group_id: int,
        *,
        acks: list,
        plans: list,
        failed: int,
        marker=None,
        check: Sequence = (),
        group: str = "",
    ) -> dict:
        """Apply answers of group ``group_id``, every one checked and planned before: the one path
        of ``ack``, ``nack`` / ``reconsume_later``, ``reject`` and ``settle``. ``acks``: receipts to
        commit; ``plans``: ``_plan_failures`` of ``failed`` receipts; ``marker``: ``settle``'s
        (job run, part). All in one transaction, the group's totals last (lock order); acks alone
        are one statement that counts their stale receipts itself, and only when some receipt
        matched nothing are the receipts' topics checked (the acks', or ``check``'s: a
        ``ForeignReceiptError`` then rolls everything back: a refused call changes nothing).
        Returns ``{"acked", "retried", "dead_lettered", "stale"}`` (a parked failure is retried).
        The failures' statements are planned for their arrays each time (``prepare=False``): a
        generic plan would not know the batch's size. The ack is prepared (psycopg, after five runs
        on a connection), and PostgreSQL keeps a generic plan when it costs no more: its lookups by
        primary key, whatever the batch (``tests/store/test_plans.py`` checks it under every
        statistics state); planning it each time cost more than running it (a one-message ack:
        0.28 ms of PostgreSQL CPU of 0.55). Breakers (issue 41): the failures'
        subscriptions' breaker locks held shared first, a subscription with a ``breaker:`` has its
        answers counted last and its next state taken after the commit (``messaging.breaking``)."""
        if not acks and not plans and marker is None:  # nothing to answer: no statement
            return {"acked": 0, "retried": 0, "dead_lettered": 0, "stale": 0}
        watched = self._watched(group_id, group, acks, plans)
        counted: dict[int, tuple[int, str | None]] = {}
        ack_params = {
            "group_id": group_id,
            **self._receipt_params(acks),
            "count_stale": not plans and marker is None,
        }
        if ack_params["count_stale"]:
            return self._ack_only(group_id, acks, ack_params, watched)

        def apply() -> dict:
            with self.conn.transaction():
                topic_ids = [params["topic_id"] for params in plans]  # a failure may spend an attempt
                catalog.lock_breakers(self.conn, topic_ids, [group_id] * len(topic_ids))
                if marker is not None:
                    keys = {"settle_run": marker[0], "part": marker[1]}
                    if self.conn.execute(S.SETTLE_PART_CLAIM, keys).fetchone() is None:
                        done = self.conn.execute(S.SETTLE_PART, keys).fetchone()
                        return dict(zip(("acked", "retried", "dead_lettered", "stale"), done, strict=True))
                acked, acked_topics, _ = (  # a receipt of another topic raises RD001: all rolled back
                    self.conn.execute(S.ACK, ack_params).fetchone() if acks else (0, [], 0)
                )
                retried, dead = self._apply_failures(plans)
                stale = len(acks) - acked + failed - retried - dead
                if stale and check:  # a receipt matched no delivery: is it of the topic it names?
                    # if not, raises: all rolled back (no savepoint: nothing of the answer stays)
                    self.conn.execute(S.REFUSE_FOREIGN_RECEIPTS, self._topics_named(group_id, check))
                catalog.add_group_totals(self.conn, dead_lettered={group_id: dead}, stale={group_id: stale})
                counts = {"acked": acked, "retried": retried, "dead_lettered": dead, "stale": stale}
                if marker is not None:
                    self.conn.execute(S.SETTLE_PART_RECORD, {**keys, **counts})
                counted.clear()
                counted.update(self._count(group_id, watched, Counter(acked_topics)))
                return counts

        try:
            with refusing_foreign_receipts():
                counts = db.retry_lock_conflicts(apply)
        except psycopg.errors.CheckViolation as error:
            if '"dlq_messages"' not in (error.diag.message_primary or ""):
                raise
            # the first dead letter of a DLQ: its table is made (a short transaction of its own),
            # and the answer, rolled back whole, runs again; no round trip asks for the table
            # before. A refused call changes nothing: the receipts' topics are checked before the
            # table is made
            self._check_receipt_topics(group_id, check)
            catalog.ensure_dlq_tables(self.conn, {params["p_dlq"][0] for params in plans})
            with refusing_foreign_receipts():
                counts = db.retry_lock_conflicts(apply)
        self._evaluate(group_id, watched, counted)
        return counts

    def _ack_only(self, group_id: int, acks: list, ack_params: dict, watched: dict) -> dict:
        """``_answer`` of acks alone: one statement, committed on its own (one round trip) when the
        connection is outside any transaction and no breaker watches; else in a transaction (a
        savepoint of the caller's), with the breakers' counts. A receipt of another topic undoes
        the statement (RD001: ``ACK``)."""
        counted: dict[int, tuple[int, str | None]] = {}

        def ack_only() -> int:
            acked, acked_topics, _ = self.conn.execute(S.ACK, ack_params).fetchone()
            counted.clear()
            counted.update(self._count(group_id, watched, Counter(acked_topics)))
            return acked

        with refusing_foreign_receipts():
            acked = db.retry_lock_conflicts(lambda: self._alone_or_in(ack_only, together=bool(watched)))
        self._evaluate(group_id, watched, counted)
        return {"acked": acked, "retried": 0, "dead_lettered": 0, "stale": len(acks) - acked}

    def _alone_or_in(self, call: Callable[[], T], together: bool = False) -> T:
        """``call`` (statements of an answer) on its own, when it is one statement (not
        ``together``) and the connection is in autocommit outside any transaction: the statement
        commits alone, one round trip; else in a transaction (or a savepoint of the caller's)."""
        if not together and self.conn.autocommit and self.conn.info.transaction_status == IDLE:
            return call()
        with self.conn.transaction():
            return call()

    def _watched(self, group_id: int, group: str, acks: list, plans: list) -> dict[int, tuple]:
        """The topics of an answer whose subscription has a breaker: topic id -> (its
        ``BreakerConfig``, the plans of its failures that are not rejects: a reject is a verdict
        on a message, not an attempt against a dependency)."""
        watched: dict[int, tuple] = {}
        for topic in {receipt.topic for receipt in acks}:
            topic_id = self.context.topic_id(topic)
            if (breaker := self.context.breaker(topic_id, group_id, topic, group)) is not None:
                watched[topic_id] = (breaker, [])
        for params in plans:
            topic_id = params["topic_id"]
            policy = self.context.policies[(topic_id, group_id)][0]  # _plan_failures resolved it
            if policy.breaker is not None:
                config, failing = watched.get(topic_id, (policy.breaker, []))
                watched[topic_id] = (config, failing + ([] if params["force_dead_letter"] else [params]))
        return watched

    def _count(self, group_id: int, watched: dict, acked: Counter) -> dict[int, tuple[int, str | None]]:
        """The answers of each watched topic counted for its breaker, last in the answer's
        transaction (after the group's row: lock order): its acks that applied (``acked`` by topic
        id: a late ack after its lease ended changed nothing) and its failures, of the receipts that
        applied when the breaker's rule counts an ended lease (that lease's end counted the late
        failure's delivery once), else all of them (the late failure is the one the breaker hears
        of); topic id -> (failures counted, the breaker's state)."""
        found = {}
        for topic_id, (config, failing) in sorted(watched.items()):
            rule = {"include": config.include, "exclude": config.exclude}
            key = "applied_errors" if counts(rule, LEASE_EXPIRED_CLASS, None) else "errors"
            errors = [plan[key] for plan in failing]
            found[topic_id] = breaking.count_answers(
                self.conn, config, topic_id, group_id, acked[topic_id], errors
            )
        return found

    def _evaluate(self, group_id: int, watched: dict, counted: dict) -> None:
        """After the answer committed: each watched breaker takes its next state when, closed, the
        answer counted a failure, or it is half-open (its probe's answers decide); an open or held
        one waits for its time or an operator. The answer committed: a failure here is logged, not
        raised (the next answer or tier window evaluates again)."""
        for topic_id, (failed, state) in counted.items():
            if (state == "closed" and failed) or state == "half_open":
                try:
                    breaking.evaluate(self.conn, watched[topic_id][0], topic_id, group_id)
                except psycopg.Error as error:
                    breaking.log.warning("breaker of group id %s not evaluated: %s", group_id, error)

    def _receipt_params(self, items: list) -> dict:
        """``ids`` (one per receipt: the stale ones are counted from it), ``receipt_topics`` (the
        topic id each names), ``topic_ids`` (each once) and ``receipts`` (``receipt_lookup``) of an
        ack or a lease extension."""
        topic_ids = [self.context.topic_id(r.topic) for r in items]
        return {
            "ids": int_array(r.message_id for r in items),
            "receipt_topics": int_array(topic_ids),
            "topic_ids": int_array(set(topic_ids)),
            "receipts": receipt_lookup(
                (r.message_id, r.delivery_count, t) for r, t in zip(items, topic_ids, strict=True)
            ),
        }

    def _plan_failures(
        self, group_id: int, group: str, items, errors, at, mode: str, delay=0, level=0
    ) -> list:
        """The parameters of FAIL_RETRY / FAIL_DEAD_LETTER for ``items`` (receipts), one set per
        topic; everything is checked here, before anything changes (a DLQ table is made when a
        dead letter first needs it: ``_answer``)."""
        outcome, reason, forced = self._MODES[mode]
        by_topic: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            by_topic.setdefault(item.topic, []).append(index)
        plans = []
        for topic, indexes in by_topic.items():
            topic_id = self.context.topic_id(topic)
            policy, table = self.context.policy(topic_id, group_id, topic, group)
            params = {**table, "group_id": group_id, "topic_id": topic_id, "at": at, "dead_lettered_at": at}
            params["outcome"] = outcome
            params.update(reason=reason, force_dead_letter=forced, level=None, delay=None)
            params.update(
                ids=int_array(items[i].message_id for i in indexes),
                receipt_count=len({items[i].message_id for i in indexes}),  # rows it can answer
                receipts=receipt_lookup(
                    (items[i].message_id, items[i].delivery_count, topic_id) for i in indexes
                ),
                errors=error_lookup((items[i].message_id for i in indexes), (errors[i] for i in indexes)),
            )
            if mode == "level":
                seconds = policy.explicit_delay(level, self.levels)
                params.update(delay=float(seconds), level=self.levels.level_for_delay(seconds))
            elif mode == "delay":
                params.update(delay=float(delay), level=self.levels.level_for_delay(delay))
            plans.append(params)
        return plans

    def _apply_failures(self, plans: list) -> tuple[int, int]:
        """(retried, dead-lettered) by ``plans``, in the caller's transaction; a parked failure
        (its breaker open) counts as retried. Each plan gets ``applied_errors``: its ``errors``
        of the receipts that moved a delivery (all of them unless some were stale)."""
        retried = dead = 0
        for params in plans:
            done, moved = 0, []  # a statement that can move nothing is not sent: a round trip each
            if not params["force_dead_letter"]:
                done, moved = self.conn.execute(S.FAIL_RETRY, params, prepare=False).fetchone()
                if (
                    done < params["receipt_count"]
                ):  # some not retried: parked (breaker open), out of retries, stale
                    parked, ids = self.conn.execute(S.FAIL_PARK, params, prepare=False).fetchone()
                    done, moved = done + parked, moved + ids
                retried += done
            params["applied_errors"] = params["errors"]
            if done < params["receipt_count"]:  # some receipt not retried: out of retries, or stale
                for _, _, n, ids in self.conn.execute(S.FAIL_DEAD_LETTER, params, prepare=False):
                    dead, moved = dead + n, moved + ids
                if len(moved) < params["receipt_count"]:  # stale receipts: their failures moved nothing
                    errors = orjson.loads(params["errors"])
                    applied = {i: errors[str(i)] for i in moved}
                    params["applied_errors"] = orjson.dumps(applied, option=orjson.OPT_NON_STR_KEYS).decode()
        return retried, dead

    def settle(
        self,
        group: str,
        outcomes: Iterable[Outcome],
        *,
        at: datetime | None = None,
        marker: tuple[str, int] | None = None,
    ) -> dict:
        """Answer many receipts at once, each with its own outcome, in one transaction: all of
        them or none. Each ``Outcome`` is a receipt (``ReceivedMessage``, or anything with
        ``message_id``, ``delivery_count``, ``topic`` and ``group``), ``"ack"``, ``"retry"``
        (with an optional ``delay`` in seconds or ``level``, as ``reconsume_later``) or
        ``"reject"``, and an optional error text. ``marker`` (a job run id and a part number)
        makes a repeated call with the same marker change nothing and return the first call's
        counts: a Spark task that runs twice settles its partition once.

        Returns ``{"acked", "retried", "dead_lettered", "stale"}``. Raises, before changing
        anything, what ``check_outcomes`` and ``check_at`` raise."""
        check_at(at)
        group_id, _ = self.context.group(group)
        items = list(outcomes)
        acks, failures = self._sort_outcomes(group, items)
        plans = []
        for (mode, delay, level), group_items in failures.items():
            receipts = sorted(
                (i.receipt for i in group_items), key=lambda r: (r.message_id, r.delivery_count)
            )
            by_id = {(i.receipt.message_id, i.receipt.delivery_count): describe(i.error) for i in group_items}
            errors = [by_id[(r.message_id, r.delivery_count)] for r in receipts]
            plans += self._plan_failures(group_id, group, receipts, errors, at, mode, delay, level)
        acks.sort(key=lambda r: (r.message_id, r.delivery_count))  # rows locked in one order
        failed = sum(len(v) for v in failures.values())
        return self._answer(group_id, acks=acks, plans=plans, failed=failed, marker=marker, group=group)

    def check_outcomes(self, group: str, outcomes: Iterable[Outcome]) -> None:
        """Check ``outcomes`` as ``settle`` does before it changes anything, changing nothing (a
        Spark settle checks every partition this way before any of them settles). Raises
        ``TypeError`` / ``ValueError`` (a receipt's message id or delivery count not an int in
        range: ``check_receipt``), ``ForeignReceiptError`` (a receipt of another group, or naming
        another topic than its message's), ``UnknownTopicError`` / ``NotSubscribedError`` (a receipt's topic),
        ``ValueError``, ``InvalidDelayError``, ``InvalidLevelError`` (``plan_outcome``; a level the
        group's policy refuses on that topic), each naming the message."""
        self._sort_outcomes(group, list(outcomes))

    def _sort_outcomes(self, group: str, items: list[Outcome]) -> tuple[list, dict]:
        """(the receipts to ack, {(mode, delay, level): outcomes} of the failures), every item
        checked (``check_outcomes``)."""
        group_id, _ = self.context.group(group)
        acks, failures, levels_ok = [], {}, set()
        for item in items:
            receipt = item.receipt
            check_receipt(receipt)
            if receipt.group != group:
                raise ForeignReceiptError(
                    f"message {receipt.message_id} was received by group {receipt.group!r}: "
                    f"group {group!r} cannot answer for it"
                )
            mode, delay, level = plan_outcome(item)
            if mode == "ack":
                acks.append(receipt)
                continue
            if mode == "level" and (receipt.topic, level) not in levels_ok:
                policy = self.context.effective_policy(
                    self.context.topic_id(receipt.topic), group_id, receipt.topic, group
                )
                try:
                    policy.explicit_delay(level, self.levels)
                except InvalidLevelError as exc:
                    raise InvalidLevelError(f"message {receipt.message_id}: {exc}") from None
                levels_ok.add((receipt.topic, level))
            failures.setdefault((mode, delay, level), []).append(item)
        self._check_receipt_topics(group_id, [item.receipt for item in items])
        return acks, failures

    def _check_receipt_topics(self, group_id: int, receipts: Sequence) -> None:
        """``ForeignReceiptError`` unless each receipt names the topic of its message (a delivery
        row, a message in the topic's log or a dead letter of it): an answer on the wrong topic
        would otherwise be applied in part and counted stale in part. A message that is nowhere
        (retention dropped it, its group done with it) at or below the group's offset on the named
        topic was handed to the group: its receipt is the topic's, and stale; one in another
        topic's log, or past the offset, is refused (``REFUSE_FOREIGN_RECEIPTS``: in a savepoint
        inside the caller's transaction, which the refusal leaves usable)."""
        if not receipts:
            return
        params = self._topics_named(group_id, receipts)
        with refusing_foreign_receipts():
            self._alone_or_in(lambda: self.conn.execute(S.REFUSE_FOREIGN_RECEIPTS, params))

    def _topics_named(self, group_id: int, receipts: Sequence) -> dict:
        """The parameters of ``REFUSE_FOREIGN_RECEIPTS``: each receipt's message id and the id of
        the topic it names (aligned)."""
        return {
            "group_id": group_id,
            "ids": [r.message_id for r in receipts],
            "receipt_topics": [self.context.topic_id(r.topic) for r in receipts],
        }

    def stale_receipts(self, group: str) -> int:
        """How many receipts of ``group`` changed nothing (late or repeated answers)."""
        return self.conn.execute(
            S.GROUP_STALE_RECEIPTS, {"group_id": self.context.group(group)[0]}
        ).fetchone()[0]
