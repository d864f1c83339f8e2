"""Retry and dead-letter policies per topic and consumer group, as RocketMQ, Pulsar and Artemis
users configure them.

A policy in the config file names a ``topic`` and a ``group`` pattern in Artemis wildcard syntax
(words separated by ``.``; ``#`` matches any number of words, ``*`` exactly one). Every policy whose
two patterns match applies; the most specific one wins and fields it leaves unset come from the
next one, down to the broker preset's defaults (Artemis address-settings merge the same way).
Specificity is Artemis's own order (HierarchicalObjectRepository.MatchComparator), topic pattern
first, then group pattern.

``resolve`` returns an ``EffectivePolicy``: the wait before retry n, the attempts before the DLQ,
the DLQ and retry names, and the ready-backlog cap.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from redelivery.rules.breaker import BreakerConfig
from redelivery.rules.levels import (
    MAX_DELAY_SECONDS,
    ROCKETMQ_BROKER_LEVELS,
    ROCKETMQ_RETRY_LEVELS,
    LevelTable,
    capped_exponential,
    parse_duration,
)
from redelivery.rules.names import is_valid_queue_name
from redelivery.rules.words import DEFAULT_ON_EXHAUSTED, ON_EXHAUSTED_HELP, OnExhausted

#: Characters allowed in a DLQ or retry name: it becomes a (quoted) table name, at most 63 bytes.
#: Bounds that keep every computed wait finite and storable: one wait at most 864000 s (Pulsar's
#: reconsumeLater range), counts in a PostgreSQL integer.
MAX_DELAY_MS = MAX_DELAY_SECONDS * 1000
MAX_MULTIPLIER = 1000.0
MAX_INT = 2**31 - 1
_WORD = re.compile(r"#|\*|[A-Za-z0-9_%-]+")


# ---- wildcards ----------------------------------------------------------------------------------


def check_pattern(pattern: str) -> str:
    """Return ``pattern`` if every ``.``-separated word is ``#``, ``*`` or a literal word; else
    raise ``ValueError``."""
    if not pattern or not all(_WORD.fullmatch(word) for word in pattern.split(".")):
        raise ValueError(
            f"not an Artemis wildcard pattern: {pattern!r} "
            "(words separated by '.', '#' or '*' as whole words)"
        )
    return pattern


def matches(pattern: str, name: str) -> bool:
    """Artemis wildcard match: ``orders.#`` matches ``orders``, ``orders.eu``, ``orders.eu.fr``;
    ``orders.*`` matches ``orders.eu`` only."""

    @functools.cache
    def match(p: int, n: int) -> bool:
        if p == len(want):
            return n == len(have)
        if want[p] == "#":
            return any(match(p + 1, k) for k in range(n, len(have) + 1))
        if n == len(have):
            return False
        return (want[p] == "*" or want[p] == have[n]) and match(p + 1, n + 1)

    want, have = tuple(pattern.split(".")), tuple(name.split("."))
    return match(0, 0)


def compare_specificity(left: str, right: str) -> int:
    """Negative when ``left`` is more specific than ``right`` (Artemis MatchComparator order)."""
    if ("#" in left) != ("#" in right):
        return 1 if "#" in left else -1
    if "#" in left:
        return len(right) - len(left)
    if ("*" in left) != ("*" in right):
        return 1 if "*" in left else -1
    if "*" in left:
        lw, rw = left.split("."), right.split(".")
        for i, word in enumerate(lw):
            if i >= len(rw):
                return -1
            if (word == "*") != (rw[i] == "*"):
                return 1 if word == "*" else -1
    return len(left) - len(right)


# ---- backoff kinds ------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _LevelTableBackoff(_Strict):
    """A backoff that reads a RocketMQ level string (validated when the file loads)."""

    levels: str

    @field_validator("levels")
    @classmethod
    def _parse(cls, value: str) -> str:
        LevelTable.parse(value)
        return value

    def table(self) -> LevelTable:
        return LevelTable.parse(self.levels)


class LevelsBackoff(_LevelTableBackoff):
    """Retry n waits level min(n, len(table)) of ``levels``, by default RocketMQ 5's table
    (RocketMQ 5, "Consumption retry")."""

    kind: Literal["levels"]
    levels: str = Field(ROCKETMQ_RETRY_LEVELS, description="the level string retries walk")

    def base_delay(self, retry: int) -> float:
        table = self.table()
        return float(table.delay(table.level_for_retry(retry)))


class BrokerLevelsBackoff(_LevelTableBackoff):
    """RocketMQ broker rule ``delayLevel = 3 + reconsumeTimes`` on its 18-level string (RocketMQ
    broker, "RocketMQ message retry"): retry n (reconsume times n-1 before it) waits level
    min(n + 2, 18)."""

    kind: Literal["rocketmq_broker"]
    levels: str = Field(ROCKETMQ_BROKER_LEVELS, description="the broker's level string")

    def base_delay(self, retry: int) -> float:
        table = self.table()
        return float(table.delay(min(3 + (retry - 1), len(table))))


class ArtemisBackoff(_Strict):
    """Artemis redelivery (Artemis, "Message redelivery and undelivered messages"): retry n waits
    ``redelivery_delay_ms * multiplier^(n-1)`` milliseconds, at most ``max_redelivery_delay_ms``
    (default: delay x 10), then moved up or down by ``delay * factor * U`` with U uniform in
    [0, 1) and a random sign (collision avoidance), the result cut to 864000 s
    (``EffectivePolicy.delay``)."""

    kind: Literal["exponential"]
    redelivery_delay_ms: int = Field(default=0, ge=0, le=MAX_DELAY_MS, description="the first wait, ms")
    redelivery_delay_multiplier: float = Field(
        default=1.0, ge=1.0, le=MAX_MULTIPLIER, description="each later wait is the previous x this"
    )
    max_redelivery_delay_ms: int | None = Field(
        default=None,
        ge=0,
        le=MAX_DELAY_MS,
        description="the longest wait, ms",
        json_schema_extra={"default_text": "the delay x 10"},
    )
    redelivery_collision_avoidance_factor: float = Field(
        default=0.0, ge=0.0, le=1.0, description="a wait moves up or down by delay x factor x U[0,1)"
    )

    def base_delay(self, retry: int) -> float:
        cap = (
            self.max_redelivery_delay_ms
            if self.max_redelivery_delay_ms is not None
            else min(self.redelivery_delay_ms * 10, MAX_DELAY_MS)
        )
        delay = capped_exponential(self.redelivery_delay_ms, self.redelivery_delay_multiplier, retry, cap)
        return delay / 1000.0


class RocketMQExponentialBackoff(_Strict):
    """RocketMQ 5 exponential retry policy: retry n waits ``min(initial * multiplier^(n-1), max)``.
    Defaults (not in the source documents: ours): initial 1s, multiplier 2, max 2h."""

    kind: Literal["rocketmq_exponential"]
    initial: str = Field("1s", description="the first wait, a duration")
    multiplier: float = Field(
        default=2.0, ge=1.0, le=MAX_MULTIPLIER, description="each later wait is the previous x this"
    )
    max: str = Field("2h", description="the longest wait, a duration")

    @field_validator("initial", "max")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    def base_delay(self, retry: int) -> float:
        return float(
            capped_exponential(parse_duration(self.initial), self.multiplier, retry, parse_duration(self.max))
        )


class FixedBackoff(_Strict):
    """A fixed interval before every retry, as RocketMQ's ordered messages (RocketMQ 5,
    "Consumption retry"). Default 3s (the document points to RocketMQ's parameter limits for the
    value; ours)."""

    kind: Literal["fixed"]
    interval: str = Field("3s", description="the wait before every retry, a duration")

    @field_validator("interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    def base_delay(self, retry: int) -> float:
        return float(parse_duration(self.interval))


Backoff = Annotated[
    LevelsBackoff | BrokerLevelsBackoff | ArtemisBackoff | RocketMQExponentialBackoff | FixedBackoff,
    Field(discriminator="kind"),
]


# ---- names --------------------------------------------------------------------------------------


class Naming(_Strict):
    """How a DLQ (or retry) is named: ``rocketmq`` ``%DLQ%<group>`` / ``%RETRY%<group>``; ``pulsar``
    ``<topic>-<group>-DLQ`` / ``-RETRY``; ``artemis`` prefix + topic + suffix (DLQ prefix default
    ``DLQ.``; Artemis redelivers in place, so its retry name is the topic); ``explicit`` ``name``."""

    style: Literal["rocketmq", "pulsar", "artemis", "explicit"] = Field(
        "rocketmq", description="how the name is made from the topic and the group"
    )
    prefix: str | None = Field(
        None,
        description="`artemis`: what goes before the topic",
        json_schema_extra={"default_text": "`DLQ.` for a DLQ, nothing for a retry"},
    )
    suffix: str = Field("", description="`artemis`: what goes after the topic")
    name: str | None = Field(
        None, description="`explicit`: the name (1-63 letters, digits, `_`, `.`, `%`, `-`)"
    )

    @model_validator(mode="after")
    def _explicit_needs_name(self) -> Naming:
        if self.style == "explicit":
            if not is_valid_queue_name(self.name):
                raise ValueError(
                    f"an explicit name must be 1-63 letters, digits, '_', '.', '%' or '-', got {self.name!r}"
                )
        elif self.name is not None:
            raise ValueError("'name' is only for style 'explicit'")
        return self

    def dlq(self, topic: str, group: str) -> str:
        return self._render(topic, group, "DLQ", "DLQ." if self.prefix is None else self.prefix)

    def retry(self, topic: str, group: str) -> str:
        if self.style == "artemis":
            return topic
        return self._render(topic, group, "RETRY", self.prefix or "")

    def _render(self, topic: str, group: str, kind: str, prefix: str) -> str:
        name = {
            "rocketmq": f"%{kind}%{group}",
            "pulsar": f"{topic}-{group}-{kind}",
            "artemis": f"{prefix}{topic}{self.suffix}",
            "explicit": self.name,
        }[self.style]
        if not is_valid_queue_name(name):
            raise ValueError(
                f"{kind} name {name!r} for topic {topic!r} and group {group!r} is longer than 63 bytes "
                f"or has characters a table name cannot; use an explicit name"
            )
        return name


# ---- policies -----------------------------------------------------------------------------------


class PolicyConfig(_Strict):
    """One entry of ``policies:`` in the config file. Unset fields come from less specific matches."""

    topic: str = Field("#", description="the topics it applies to, an Artemis wildcard pattern")
    group: str = Field("#", description="the consumer groups it applies to, an Artemis wildcard pattern")
    backoff: Backoff | None = Field(None, description="the wait before each retry, by its `kind`")
    max_reconsume_times: int | None = Field(
        default=None,
        ge=-1,
        le=MAX_INT,
        description="retries before the next failed delivery dead-letters (RocketMQ); `-1` unlimited",
    )
    max_delivery_attempts: int | None = Field(
        default=None,
        ge=-1,
        le=MAX_INT,
        description="deliveries in all (Artemis; max reconsume times + 1); `-1` unlimited; not with "
        "`max_reconsume_times`",
    )
    dead_letter: Naming | None = Field(None, description="the DLQ's name, its table's too")
    retry_naming: Naming | None = Field(
        None, description="the `RETRY_TOPIC` property of redelivered messages"
    )
    max_ready_backlog: int | None = Field(
        default=None,
        ge=1,
        le=MAX_INT,
        description="cap on a group's messages waiting on the topic (READY, and BLOCKED)",
    )
    explicit_levels: str | None = Field(
        None,
        description="the table `reconsume_later(level=n)` indexes (a level string); unset: the routing table",
    )
    clamp_explicit_levels: bool | None = Field(
        None, description="a level above that table means its last level (RocketMQ), else it is refused"
    )
    #: ``Administration.subscribe`` reads these when the subscription is made: it keeps its ordering
    #: for life.
    ordered: bool | None = Field(
        None, description="a subscription made for a matching (topic, group) is ordered per message key"
    )
    on_exhausted: OnExhausted | None = Field(
        None,
        description=f"what an ordered subscription's dead-lettered message does to its key: "
        f"{ON_EXHAUSTED_HELP}",
    )

    breaker: BreakerConfig | None = Field(
        None,
        description="the subscription's circuit breaker (`rules.breaker`): when it opens, for how long, "
        "which failures count; `null` turns off one a less specific policy set",
    )

    @field_validator("explicit_levels")
    @classmethod
    def _explicit_levels_parse(cls, value: str | None) -> str | None:
        if value is not None:
            LevelTable.parse(value)
        return value

    @field_validator("topic", "group")
    @classmethod
    def _pattern(cls, value: str) -> str:
        return check_pattern(value)

    @model_validator(mode="after")
    def _one_attempt_limit(self) -> PolicyConfig:
        if self.max_reconsume_times is not None and self.max_delivery_attempts is not None:
            raise ValueError(
                "set max_reconsume_times (RocketMQ) or max_delivery_attempts (Artemis), not both"
            )
        if self.max_delivery_attempts == 0:
            raise ValueError("max_delivery_attempts must be -1 (unlimited) or at least 1")
        return self


#: Defaults of each broker preset (``broker:`` in the config file).
PRESETS: dict[str, dict] = {
    # rocketmq (RocketMQ 5, "Consumption retry"): 16-step table, 16 reconsume times, %DLQ%group,
    # %RETRY%group. An explicit delayLevelWhenNextConsume indexes the broker's 18-level
    # messageDelayLevel, a level above it is its last level (RocketMQ broker, "RocketMQ message
    # retry").
    "rocketmq": {
        "backoff": LevelsBackoff(kind="levels"),
        "max_reconsume_times": 16,
        "dead_letter": Naming(style="rocketmq"),
        "retry_naming": Naming(style="rocketmq"),
        "explicit_levels": ROCKETMQ_BROKER_LEVELS,
        "clamp_explicit_levels": True,
    },
    # pulsar (TDMQ Pulsar, "Message retry and dead-letter mechanism"): levels 1s 5s 10s ... 2h by
    # increment, 16 retries, <topic>-<sub>-DLQ/-RETRY; reconsumeLater(msg, n) indexes
    # MESSAGE_DELAYLEVEL (level 1 = 1s, level 3 = 10s).
    "pulsar": {
        "backoff": LevelsBackoff(kind="levels", levels=ROCKETMQ_BROKER_LEVELS),
        "max_reconsume_times": 16,
        "dead_letter": Naming(style="pulsar"),
        "retry_naming": Naming(style="pulsar"),
        "explicit_levels": ROCKETMQ_BROKER_LEVELS,
        "clamp_explicit_levels": False,
    },
    # artemis (Artemis, "Message redelivery and undelivered messages"): redelivery-delay 0,
    # multiplier 1.0, max-delivery-attempts 10, DLQ.<address>.
    # Artemis has no delay levels: an explicit level indexes the routing table (ours).
    "artemis": {
        "backoff": ArtemisBackoff(kind="exponential"),
        "max_delivery_attempts": 10,
        "dead_letter": Naming(style="artemis"),
        "retry_naming": Naming(style="artemis"),
        "explicit_levels": None,
        "clamp_explicit_levels": False,
    },
}


@dataclass(frozen=True)
class EffectivePolicy:
    """The policy of one (topic, group) after matching and merging.

    ``max_reconsume_times``: retries before the next failed delivery dead-letters; -1 unlimited.
    ``explicit_levels``: the level string ``reconsume_later(level=n)`` indexes (None: the routing
    table); ``clamp_explicit_levels``: a level above it means its last level (RocketMQ)."""

    topic: str
    group: str
    backoff: object
    max_reconsume_times: int
    dlq_name: str
    retry_name: str
    max_ready_backlog: int | None
    matched: tuple[str, ...]
    explicit_levels: str | None = None
    clamp_explicit_levels: bool = False
    ordered: bool = False
    on_exhausted: OnExhausted = DEFAULT_ON_EXHAUSTED
    breaker: BreakerConfig | None = None

    @property
    def jitter(self) -> float:
        """Artemis collision avoidance factor (0 for every other kind)."""
        return getattr(self.backoff, "redelivery_collision_avoidance_factor", 0.0)

    def base_delay(self, retry: int) -> float:
        """Seconds before retry ``retry`` (1-based), before collision avoidance."""
        if retry < 1:
            raise ValueError(f"retry numbers start at 1, got {retry}")
        return self.backoff.base_delay(retry)

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds before retry ``retry`` with Artemis collision avoidance applied, at most
        ``MAX_DELAY_SECONDS`` (864000 s): a base wait near the bound moved up by the jitter is cut
        to it, so one wait never passes it (``statements.NEXT_DELAY`` cuts the same way)."""
        base = self.base_delay(retry)
        if not self.jitter:
            return base
        rng = rng or random
        sign = -1 if rng.random() < 0.5 else 1
        return min(base + base * self.jitter * sign * rng.random(), float(MAX_DELAY_SECONDS))

    def explicit_delay(self, level: int, routing: LevelTable) -> int:
        """Seconds before a retry at explicit delay ``level`` (>= 1) of ``explicit_levels`` (or of
        ``routing``). A level above the table is its last level when ``clamp_explicit_levels``
        (RocketMQ broker, "RocketMQ message retry"), else ``InvalidLevelError``; so is a level
        below 1 or not an int."""
        table = LevelTable.parse(self.explicit_levels) if self.explicit_levels else routing
        if (
            self.clamp_explicit_levels
            and isinstance(level, int)
            and not isinstance(level, bool)
            and level > 0
        ):
            level = min(level, len(table))
        return table.delay(level)

    def schedule(self, routing: LevelTable) -> tuple[list[float], list[int]]:
        """Base delays and routing levels for retries 1..K, where every retry after K waits as K
        does; the SQL of the state changes indexes these with min(n, K)."""
        delays: list[float] = []
        for retry in range(1, 200):
            delays.append(self.base_delay(retry))
            if retry > 1 and delays[-1] == delays[-2] and self._constant_from(retry):
                delays.pop()
                break
        return delays, [routing.level_for_delay(max(1, round(d))) for d in delays]

    def _constant_from(self, retry: int) -> bool:
        return all(self.base_delay(k) == self.base_delay(retry) for k in range(retry, retry + 20))

    def dead_letters_after(self) -> int | None:
        """The delivery whose failure dead-letters the message, or None if it never does."""
        return None if self.max_reconsume_times == -1 else self.max_reconsume_times + 1

    def describe(self, routing: LevelTable, retries: int = 20) -> dict:
        """JSON-ready: the policy, its waits (seconds) for the first ``retries`` retries, and when it
        dead-letters."""
        return {
            "topic": self.topic,
            "group": self.group,
            "matched_policies": list(self.matched),
            "backoff": self.backoff.model_dump(),
            "max_reconsume_times": self.max_reconsume_times,
            "dead_letter_queue": self.dlq_name,
            "retry_topic": self.retry_name,
            "max_ready_backlog": self.max_ready_backlog,
            "waits_seconds": [round(self.base_delay(n), 3) for n in range(1, retries + 1)],
            "collision_avoidance": (
                {
                    "factor": self.jitter,
                    "range": f"each wait is moved by up to factor x wait, up or down, "
                    f"to at most {MAX_DELAY_SECONDS} s",
                }
                if self.jitter
                else None
            ),
            "routing_levels": [
                routing.level_for_delay(max(1, round(self.base_delay(n)))) for n in range(1, retries + 1)
            ],
            "dead_letters_after_delivery": self.dead_letters_after(),
            "breaker": self.breaker.model_dump() if self.breaker else None,
        }


def resolve(
    policies: list[PolicyConfig],
    broker: str,
    topic: str,
    group: str,
    group_max_reconsume_times: int | None = None,
) -> EffectivePolicy:
    """The effective policy of ``topic`` and ``group``: matching policies merged, most specific
    last, over the ``broker`` preset. A group's own max reconsume times (set when it was created,
    RocketMQ's group metadata) wins over the policies'. Raises ``ValueError`` for a DLQ or retry
    name that cannot name a table."""
    found = [p for p in policies if matches(p.topic, topic) and matches(p.group, group)]
    found.sort(
        key=functools.cmp_to_key(
            lambda a, b: compare_specificity(b.topic, a.topic) or compare_specificity(b.group, a.group)
        )
    )
    merged = dict(PRESETS[broker])
    for policy in found:  # least specific first: later (more specific) fields win
        fields = policy.model_dump(exclude_unset=True, exclude={"topic", "group"})
        if "max_delivery_attempts" in fields or "max_reconsume_times" in fields:
            merged.pop("max_delivery_attempts", None)
            merged.pop("max_reconsume_times", None)
        for key in fields:
            merged[key] = getattr(policy, key)
    if "max_delivery_attempts" in merged:
        attempts = merged["max_delivery_attempts"]
        max_times = -1 if attempts == -1 else attempts - 1  # Artemis counts deliveries, RocketMQ retries
    else:
        max_times = merged["max_reconsume_times"]
    if group_max_reconsume_times is not None:
        max_times = group_max_reconsume_times
    return EffectivePolicy(
        topic=topic,
        group=group,
        backoff=merged["backoff"],
        max_reconsume_times=max_times,
        dlq_name=merged["dead_letter"].dlq(topic, group),
        retry_name=merged["retry_naming"].retry(topic, group),
        max_ready_backlog=merged.get("max_ready_backlog"),
        matched=tuple(f"topic={p.topic} group={p.group}" for p in reversed(found)),
        explicit_levels=merged.get("explicit_levels"),
        clamp_explicit_levels=bool(merged.get("clamp_explicit_levels")),
        ordered=bool(merged.get("ordered")),
        on_exhausted=merged.get("on_exhausted") or DEFAULT_ON_EXHAUSTED,
        breaker=merged.get("breaker"),
    )
