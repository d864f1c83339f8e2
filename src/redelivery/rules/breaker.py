"""A circuit breaker per subscription (topic, group), issue 41: pure rules, no I/O.

When a dependency every consumer of a group calls is down, each retry spends an attempt that
cannot succeed, and after the last one the message is dead. The breaker stops that, as
MassTransit's kill switch does in process ("to prevent failing consumers from moving all the
messages from the input queue to the error queue"), but in the state store, so that it holds for
every consumer of the group and survives restarts:

- **closed**: every delivery goes as usual; answers are counted per second.
- **open**: when, in the last ``window``, at least ``min_attempts`` answers were given and the
  share of counted failures reached ``failure_ratio``. Receives hand nothing out; a counted failure
  of a delivery still in flight is *parked* (waiting again, no reconsume time spent, never
  dead-lettered); the tiers leave due retries waiting and park ended leases.
- **half-open**: once ``open_time`` passed, at most ``probe_size`` messages are in flight at once.
  ``probe_size`` successes close it; a counted failure opens it again for twice as long.
- **held**: a failed probe whose next open period would pass ``max_open_time`` leaves it open with
  no more probes, until an operator closes it (metric, page, a log line naming the group). An
  operator's open is held too.

Defaults are MassTransit's kill switch (trip threshold 15% of at least 10 attempts in a minute,
restart after a minute). ``include`` / ``exclude`` name error classes (``module.QualName``) or
signatures (12 hex digits, ``error_signature``) as Wolverine's breaker includes or excludes
exception types; ``exclude`` is for failures that never count (a consumer's own validation errors).
"""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from redelivery.rules.levels import parse_duration

#: What a breaker's row says (``breakers.state``). "half_open" is also what "open" becomes, for a
#: receive, once its open time passed, before a statement records it.
BreakerState = Literal["closed", "open", "half_open", "held"]
BREAKER_STATES: tuple[str, ...] = ("closed", "open", "half_open", "held")
#: The longest window, open time or maximum open time: 7 days.
MAX_BREAKER_SECONDS = 7 * 86400
_FAILURE_NAME = re.compile(r"[0-9a-f]{12}|[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _duration(text: str) -> str:
    parse_duration(text, MAX_BREAKER_SECONDS)
    return text


class BreakerConfig(BaseModel):
    """``breaker:`` of a policy in the config file: when a subscription's breaker opens, for how
    long, and which failures count. Durations are texts as ``"30s"``, ``"1m"``, ``"2h"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_attempts: int = Field(10, ge=1, le=1_000_000, description="answers in the window before it may open")
    failure_ratio: float = Field(
        0.15, gt=0.0, le=1.0, description="share of counted failures among the window's answers that opens it"
    )
    window: str = Field("1m", description="the span the answers are counted over, a duration")
    open_time: str = Field(
        "1m", description="the first open period, a duration; each failed probe doubles it"
    )
    max_open_time: str = Field(
        "4h",
        description="an open period that would be longer leaves it held open, until an operator closes it",
    )
    probe_size: int = Field(5, ge=1, le=10_000, description="messages in flight at once while half-open")
    include: list[str] = Field(
        default_factory=list,
        description="only failures of these error classes or signatures count (empty: every failure)",
    )
    exclude: list[str] = Field(
        default_factory=list, description="failures of these error classes or signatures never count"
    )

    @field_validator("window", "open_time", "max_open_time")
    @classmethod
    def _durations(cls, value: str) -> str:
        return _duration(value)

    @field_validator("include", "exclude")
    @classmethod
    def _failure_names(cls, values: list[str]) -> list[str]:
        for value in values:
            if not isinstance(value, str) or not _FAILURE_NAME.fullmatch(value):
                raise ValueError(
                    f"not an error class or a signature: {value!r} (a dotted class name such as "
                    "'requests.exceptions.ConnectionError', or 12 lowercase hex digits)"
                )
        return values

    @model_validator(mode="after")
    def _open_within_maximum(self) -> BreakerConfig:
        times = self.seconds()
        if times["open_time"] > times["max_open_time"]:
            raise ValueError(f"open_time {self.open_time} is longer than max_open_time {self.max_open_time}")
        return self

    def seconds(self) -> dict[str, float]:
        """The window, the open time and the maximum open time in seconds."""
        return {
            "window": float(parse_duration(self.window, MAX_BREAKER_SECONDS)),
            "open_time": float(parse_duration(self.open_time, MAX_BREAKER_SECONDS)),
            "max_open_time": float(parse_duration(self.max_open_time, MAX_BREAKER_SECONDS)),
        }

    def params(self) -> dict:
        """This breaker as the parameters of the breaker statements (``statements.breakers``):
        ``rule`` (which failures count, ``counting_rule``), window and open times in seconds,
        ``min_attempts``, ``failure_ratio``, ``probe_size``."""
        times = self.seconds()
        return {
            "rule": counting_rule(self),
            "window_seconds": times["window"],
            "open_seconds": times["open_time"],
            "max_open_seconds": times["max_open_time"],
            "min_attempts": self.min_attempts,
            "failure_ratio": self.failure_ratio,
            "probe_size": self.probe_size,
        }


def counting_rule(config: BreakerConfig | None) -> str:
    """Which failures count, as the JSON the statements read (``statements.breakers.COUNTED``):
    ``{"breaker": true, "include": [...], "exclude": [...]}``, a list left out when empty
    (``breaker``: the subscription has one, whose tally a tier window's ended leases add to).
    ``None`` (no breaker: an operator may still open one) counts every failure: ``{}``."""
    if config is None:
        return "{}"
    rule = {k: v for k, v in (("include", config.include), ("exclude", config.exclude)) if v}
    return json.dumps({"breaker": True, **rule}, sort_keys=True)


def counts(rule: dict, error_class: str | None, signature: str | None) -> bool:
    """Whether a failure of ``error_class`` and ``signature`` counts under ``rule`` (the JSON of
    ``counting_rule``, decoded): what the statements compute, for the docs and the tests."""
    names = {n for n in (error_class, signature) if n}
    if rule.get("include") and not names & set(rule["include"]):
        return False
    return not names & set(rule.get("exclude", ()))


def next_open_seconds(current: float, maximum: float) -> float | None:
    """The open period after a failed probe: twice ``current``; ``None`` when that is longer than
    ``maximum`` (the breaker is then held open until an operator closes it)."""
    doubled = current * 2
    return None if doubled > maximum else doubled
