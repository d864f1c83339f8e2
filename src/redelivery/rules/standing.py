"""Standing redrive policies (issue 41): which dead letters come back by themselves, when, how fast
and how often. Pure rules, no I/O.

After an outage, operators redrive by hand, in batches, watching for the messages to die again;
teams that automate it write a sweeper with a generation counter whose wait grows with each
generation (rocketmq-dashboard #4315 asks for "a rate-limited, scheduled replay policy"). A
standing redrive is that sweeper, declared once:

- **which**: a filter of a group's dead letters (topic, reasons, error text, signature), as a
  manual redrive's; by default the reasons an outage makes (``OUTAGE_REASONS``);
- **when**: ``after: breaker_closed`` (a breaker of the group closed since the last close it saw:
  the dead letters dead-lettered before that close) or ``every: 5m``; it never runs while a breaker
  of its group is not closed (a run stops between batches when one opens), and it goes on at the
  next tick while its last run left matching dead letters behind;
- **how fast**: ``rate_limit`` (messages per second) and ``max_messages`` per run, under the
  groups' ready-backlog caps as every redrive;
- **how often**: a message comes back while its redrive count (manual redrives included) is below
  ``max_generations``, and not before ``generation_wait * 2**redrive_count`` after it was
  dead-lettered: each generation waits twice as long;
- **when to stop**: once ``stop_min`` messages it brought back settled (acked, or dead again), it
  stops itself, and says so, when at least ``stop_ratio`` of them died again.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from redelivery.rules.levels import parse_duration
from redelivery.rules.names import NAME_REGEX
from redelivery.rules.words import Reason

#: The longest ``every`` or ``generation_wait``: 7 days.
MAX_STANDING_SECONDS = 7 * 86400
#: How many generations a policy may allow at most.
MAX_GENERATIONS = 100
StandingTrigger = Literal["breaker_closed", "every"]
#: The dead letters an outage makes: retries used up, a lease that ended. A reject is a verdict on
#: the message and an undecodable body never decodes: bringing them back by themselves helps nobody.
OUTAGE_REASONS: tuple[Reason, ...] = ("MAX_DELIVERIES_EXCEEDED", "LEASE_EXPIRED")
_NAME = f"^{NAME_REGEX}$"


class StandingRedrive(BaseModel):
    """One standing redrive policy, as ``standing_redrives:`` of the config file lists it, and as
    ``redelivery standing-redrive add`` takes it. Durations are texts as ``"30s"``, ``"5m"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME, description="the policy's name, unique in the state store")
    group: str = Field(pattern=_NAME, description="the consumer group whose dead letters it brings back")
    topic: str | None = Field(None, pattern=_NAME, description="only dead letters of this topic (empty: any)")
    reasons: list[Reason] = Field(
        default_factory=lambda: list(OUTAGE_REASONS),
        description="only dead letters of these reasons; by default those an outage makes (retries "
        "used up, a lease that ended), never a reject's or an undecodable body's; `[]`: any",
        json_schema_extra={"default_text": "MAX_DELIVERIES_EXCEEDED, LEASE_EXPIRED"},
    )
    error_contains: str | None = Field(
        None,
        min_length=1,
        max_length=1000,
        description="only dead letters whose last error contains this text",
    )
    signature: str | None = Field(
        None, pattern=r"^[0-9a-f]{12}$", description="only dead letters whose last failure has this signature"
    )
    after: StandingTrigger = Field(
        "breaker_closed",
        description="`breaker_closed`: after a breaker of the group closed, the dead letters dead-lettered "
        "before the close; `every`: every `every`",
    )
    every: str = Field("5m", description="with `after: every`, the time between two runs, a duration")
    rate_limit: float = Field(100.0, gt=0, le=1_000_000, description="messages per second at most")
    max_messages: int = Field(
        1000, ge=1, le=1_000_000, description="messages a run moves at most; the rest go at the next tick"
    )
    max_generations: int = Field(
        3,
        ge=1,
        le=MAX_GENERATIONS,
        description="a message comes back only while its redrive count is below this",
    )
    generation_wait: str = Field(
        "5m",
        description="how long a dead letter waits before its first return, a duration; each generation "
        "waits twice as long as the one before",
    )
    stop_ratio: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="the share of the messages it brought back and that settled (acked, or dead again) "
        "that died again, which stops it",
    )
    stop_min: int = Field(
        20, ge=1, le=1_000_000, description="messages brought back and settled before `stop_ratio` applies"
    )

    @field_validator("every", "generation_wait")
    @classmethod
    def _durations(cls, value: str) -> str:
        parse_duration(value, MAX_STANDING_SECONDS)
        return value

    @model_validator(mode="after")
    def _reasons_once(self) -> StandingRedrive:
        if len(set(self.reasons)) != len(self.reasons):
            raise ValueError("reasons lists a reason twice")
        return self

    def seconds(self, name: Literal["every", "generation_wait"]) -> int:
        """``every`` or ``generation_wait`` in seconds."""
        return parse_duration(getattr(self, name), MAX_STANDING_SECONDS)

    def selection(self) -> dict:
        """The filter's fields (a ``DlqFilter``'s keyword arguments)."""
        return self.model_dump(include={"group", "topic", "reasons", "error_contains", "signature"})


def generation_wait_seconds(policy: StandingRedrive, redrive_count: int) -> int:
    """How long after its dead-lettering a dead letter redriven ``redrive_count`` times waits before
    this policy brings it back (seconds): ``generation_wait * 2**redrive_count``, the generation
    counter with a growing delay of a hand-written outage sweeper (issue 41)."""
    return policy.seconds("generation_wait") * 2**redrive_count


def died_again_too_often(policy: StandingRedrive, settled: int, died_again: int) -> bool:
    """Whether the policy stops itself: at least ``stop_min`` of the messages it brought back
    settled (acked, or dead again; one still retrying may yet die), and at least ``stop_ratio`` of
    them died again."""
    return settled >= policy.stop_min and died_again >= policy.stop_ratio * settled
