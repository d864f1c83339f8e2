"""Delay levels: RocketMQ's level tables and the conversions between levels, retries and delays.

A level table is a list of delays in seconds, level 1 being the first. Retry number ``n`` (the
``n``-th reconsume, 1-based) uses level ``min(n, len(table))``: with the RocketMQ 5 table that is
10s 30s 1m ... 2h for retries 1..16 and 2h for every retry after (RocketMQ 5, "Consumption
retry").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from redelivery.errors import InvalidDelayError, InvalidLevelError

#: RocketMQ 5 retry intervals for unordered messages, retries 1..16 (RocketMQ 5, "Consumption
#: retry").
ROCKETMQ_RETRY_LEVELS = "10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
#: RocketMQ broker ``messageDelayLevel``, 18 levels (TDMQ Pulsar, "Message retry and dead-letter
#: mechanism"; RocketMQ broker, "RocketMQ message retry").
ROCKETMQ_BROKER_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
#: Explicit ``reconsume_later`` delay range in seconds, Pulsar's reconsumeLater range (TDMQ Pulsar,
#: "Message retry and dead-letter mechanism").
MIN_DELAY_SECONDS = 1
MAX_DELAY_SECONDS = 864_000

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(\d+)([smhd])$")


def parse_duration(text: str, maximum: int = MAX_DELAY_SECONDS) -> int:
    """``"10s"``, ``"2m"``, ``"1h"``, ``"1d"`` -> seconds, at most ``maximum`` (default 864000, 10
    days: one retry wait at most, as Pulsar's reconsumeLater range: TDMQ Pulsar, "Message retry
    and dead-letter mechanism"). Raises ``ValueError`` on anything else."""
    match = _DURATION.fullmatch(str(text).strip())
    if not match or int(match.group(1)) <= 0:
        raise ValueError(
            f"not a duration: {text!r} (expected a positive number and one of s, m, h, d, e.g. '30s')"
        )
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds > maximum:
        raise ValueError(f"duration {text!r} is longer than {maximum} s ({format_duration(maximum)})")
    return seconds


def capped_exponential(initial: float, multiplier: float, retry: int, cap: float) -> float:
    """``min(initial * multiplier**(retry - 1), cap)`` without overflowing for any retry number."""
    if initial <= 0 or initial >= cap:
        return min(initial, cap)
    if multiplier > 1 and (retry - 1) * math.log(multiplier) >= math.log(cap / initial):
        return cap
    return min(initial * multiplier ** (retry - 1), cap)


def format_duration(seconds: int) -> str:
    """Seconds -> the shortest exact RocketMQ-style duration (``120`` -> ``"2m"``)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class LevelTable:
    """An ordered table of delays in seconds; level ``i`` (1-based) waits ``delays[i - 1]``."""

    delays: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> LevelTable:
        """Parse RocketMQ's format, e.g. ``"1s 5s 10s 30s 1m 2m"``. Raises ``ValueError``."""
        words = str(text).split()
        if not words:
            raise ValueError("a level table needs at least one delay")
        return cls(tuple(parse_duration(word) for word in words))

    def __len__(self) -> int:
        return len(self.delays)

    def __str__(self) -> str:
        return " ".join(format_duration(d) for d in self.delays)

    def check_level(self, level: int) -> int:
        """Return ``level`` if it is in 1..len(table); else raise ``InvalidLevelError``."""
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= len(self):
            raise InvalidLevelError(
                f"delay level {level!r} is out of range: this table has levels 1..{len(self)} ({self})"
            )
        return level

    def delay(self, level: int) -> int:
        """Seconds to wait at ``level``. Raises ``InvalidLevelError`` outside 1..len(table)."""
        return self.delays[self.check_level(level) - 1]

    def level_for_retry(self, retry: int) -> int:
        """Level of retry number ``retry`` (1-based): ``min(retry, len(table))``."""
        if retry < 1:
            raise ValueError(f"retry numbers start at 1, got {retry}")
        return min(retry, len(self))

    def level_for_delay(self, seconds: int) -> int:
        """The level whose tier promotes a message retried after an explicit delay: the first
        level at least as long as ``seconds``, or the last level for longer delays."""
        for index, delay in enumerate(self.delays, start=1):
            if delay >= seconds:
                return index
        return len(self)


def check_delay(seconds: int) -> int:
    """Return ``seconds`` if it is a whole number in 1..864000; else raise ``InvalidDelayError``."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int)
        or not MIN_DELAY_SECONDS <= seconds <= MAX_DELAY_SECONDS
    ):
        raise InvalidDelayError(
            f"retry delay {seconds!r} s is out of range: reconsume_later accepts whole seconds "
            f"from {MIN_DELAY_SECONDS} to {MAX_DELAY_SECONDS} (Pulsar's reconsumeLater range)"
        )
    return seconds
