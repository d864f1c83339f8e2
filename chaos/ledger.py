"""What the crash suite's clients saw, the way Jepsen checks a database against its clients'
history: every worker (and the controller) appends one JSON line before each call (``call``: what
it asked) and one after (``ok``: what the API answered, or ``error``: what it raised), written
and flushed at once so that a SIGKILL loses nothing already said. A call with no line after it was
cut short by a kill: its outcome is unknown, and the checks treat it so, never as done or undone.

    ledger = Ledger(directory, "consume-1a2b3c4d")
    client = LedgeredClient(Client(), ledger)        # publish, receive, ack, nack, reject: recorded

Lines: ``{"t": unix seconds, "w": worker, "id": call id, "op": ..., "phase": "call"|"ok"|"error",
...}``; ``read`` gives the calls back, each with its asked fields, its answer and its times.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Ledger:
    """One worker's ledger file, ``<directory>/<worker>.jsonl``, appended line by line."""

    def __init__(self, directory: str | Path, worker: str):
        self.worker = worker
        Path(directory).mkdir(parents=True, exist_ok=True)
        # O_APPEND: whole lines even if a Spark task's processes share a file
        self._fd = os.open(Path(directory) / f"{worker}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **event: Any) -> None:
        line = json.dumps({"t": time.time(), "w": self.worker, **event}, default=str) + "\n"
        os.write(self._fd, line.encode())  # one write per line: the kernel has it once this returns

    def record(self, op: str, asked: dict, call: Callable[[], Any], answer: Callable[[Any], dict]) -> Any:
        """Run ``call`` between its ``call`` line (``asked``) and its ``ok`` line (``answer(result)``)
        or ``error`` line (the exception's type and text, then re-raised)."""
        call_id = uuid.uuid4().hex
        self.write(id=call_id, op=op, phase="call", **asked)
        try:
            result = call()
        except BaseException as exc:
            self.write(id=call_id, op=op, phase="error", error=f"{type(exc).__name__}: {exc}"[:500])
            raise
        self.write(id=call_id, op=op, phase="ok", **answer(result))
        return result

    def close(self) -> None:
        os.close(self._fd)


def receipts(messages) -> list[list[int]]:
    """[message id, delivery count] of each received message."""
    return [[m.message_id, m.delivery_count] for m in messages]


class LedgeredClient:
    """A ``redelivery.client.Client`` whose publishes, receives and answers go into a ledger."""

    def __init__(self, client, ledger: Ledger):
        self.client, self.ledger = client, ledger

    def publish(self, topic: str, messages: list, *, batch_id: str, at=None) -> list[int]:
        keys = [getattr(m, "key", None) for m in messages]
        asked = {"topic": topic, "batch": batch_id, "count": len(messages), "keys": keys, "at": at}
        return self.ledger.record(
            "publish", asked, lambda: self.client.publish(topic, messages, batch_id=batch_id, at=at),
            lambda ids: {"ids": ids},
        )  # fmt: skip

    def receive(
        self,
        group: str,
        topic: str,
        max_messages: int,
        invisible_duration: float,
        at=None,
        wait_seconds: float = 0,
    ) -> list:
        asked = {"group": group, "topic": topic, "max": max_messages}

        def call():
            return self.client.receive(
                group, topic, max_messages, invisible_duration, at=at, wait_seconds=wait_seconds
            )

        return self.ledger.record(
            "receive", asked, call, lambda got: {"group": group, "handed": receipts(got)}
        )

    def answer(self, verb: str, group: str, messages: list, error: str | None = None, at=None) -> int:
        """``ack``, ``nack`` or ``reject`` of ``messages``; the ledger keeps how many the API said
        were applied (the others were stale). ``at``: the time of a nack or reject (tests)."""
        call = {
            "ack": lambda: self.client.ack(group, messages),
            "nack": lambda: self.client.nack(group, messages, error=error, at=at),
            "reject": lambda: self.client.reject(group, messages, error=error, at=at),
        }[verb]
        asked = {"verb": verb, "group": group, "receipts": receipts(messages)}
        return self.ledger.record("answer", asked, call, lambda n: {"applied": n})

    def extend(self, group: str, messages: list, invisible_duration: float) -> int:
        """``extend_lease`` of ``messages``; the ledger keeps how many leases the API extended."""
        asked = {"group": group, "receipts": receipts(messages), "seconds": invisible_duration}
        return self.ledger.record(
            "extend", asked, lambda: self.client.extend_lease(group, messages, invisible_duration),
            lambda n: {"extended": n},
        )  # fmt: skip

    def delete_topic(self, topic: str) -> None:
        """``delete_topic``: its messages go legitimately (the checks leave the topic's publishes
        made before it out)."""
        self.ledger.record(
            "delete_topic", {"topic": topic}, lambda: self.client.delete_topic(topic), lambda _: {}
        )

    def close(self) -> None:
        self.client.close()
        self.ledger.close()


@dataclass
class Call:
    """One call of the ledger: what was asked, what came back (``phase`` "ok" or "error"; None: cut
    short, unknown), and when it began and ended (unix seconds)."""

    id: str
    worker: str
    op: str
    asked: dict
    began: float
    phase: str | None = None
    answer: dict = field(default_factory=dict)
    ended: float | None = None


def read(directory: str | Path) -> list[Call]:
    """Every call of every ledger in ``directory``, in the order they began. A torn last line (a
    kill inside a write) is left out: its call had not been made yet."""
    calls: dict[str, Call] = {}
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            meta = {k: event.pop(k) for k in ("t", "w", "id", "op", "phase")}
            if meta["phase"] == "call":
                calls[meta["id"]] = Call(meta["id"], meta["w"], meta["op"], event, meta["t"])
            elif meta["id"] in calls:
                call = calls[meta["id"]]
                call.phase, call.answer, call.ended = meta["phase"], event, meta["t"]
    return sorted(calls.values(), key=lambda c: c.began)


def events(calls: Iterable[Call], op: str, phase: str | None = "ok") -> list[Call]:
    return [c for c in calls if c.op == op and (phase is None or c.phase == phase)]
