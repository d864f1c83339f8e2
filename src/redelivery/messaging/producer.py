"""The producer's retry of transient failures, RocketMQ's send retry, which is gRPC's connection
backoff (RocketMQ cloud, "Send retry and flow control"): the first retry waits INITIAL_BACKOFF;
each later one waits min(previous * MULTIPLIER, MAX_BACKOFF) moved by up to +-JITTER of itself.
Defaults 1 s, 1.6, 0.2, 120 s; reconnects use MIN_CONNECT_TIMEOUT (20 s). Built on tenacity."""

from __future__ import annotations

import random
import time

import psycopg
from tenacity import Retrying, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_base

from redelivery.errors import TooManyRequestsError

MIN_CONNECT_TIMEOUT = 20  # seconds (RocketMQ cloud, "Send retry and flow control")


def is_transient(exc: BaseException) -> bool:
    """Worth another try: flow control (530), a lost connection, a serialization failure, a
    deadlock, a lock or statement timeout (psycopg's OperationalError family)."""
    return isinstance(exc, (TooManyRequestsError, psycopg.OperationalError))


class SendBackoff(wait_base):
    """Seconds to wait before retry ``k`` (1-based) of a send, as RocketMQ computes it (RocketMQ
    cloud, "Send retry and flow control")."""

    def __init__(
        self,
        initial: float,
        multiplier: float,
        jitter: float,
        maximum: float,
        rng: random.Random | None = None,
    ):
        self.initial, self.multiplier, self.jitter, self.maximum = initial, multiplier, jitter, maximum
        self.rng = rng or random.Random()

    def base(self, k: int) -> float:
        return min(self.initial * self.multiplier ** (k - 1), self.maximum)

    def wait(self, k: int) -> float:
        backoff = self.base(k)
        if k == 1:  # the first wait is INITIAL_BACKOFF itself
            return backoff
        return max(0.0, backoff + self.rng.uniform(-self.jitter * backoff, self.jitter * backoff))

    def __call__(self, retry_state) -> float:
        return self.wait(retry_state.attempt_number)


def retrying(producer_config, before_retry=None, sleep=time.sleep) -> Retrying:
    """A tenacity ``Retrying`` for ``producer_config`` (``ProducerConfig``): at most ``attempts``
    tries, transient errors only, the last error re-raised. ``before_retry(retry_state)`` runs
    before each wait (the client reconnects there)."""
    cfg = producer_config
    return Retrying(
        stop=stop_after_attempt(cfg.attempts),
        wait=SendBackoff(cfg.initial_backoff, cfg.multiplier, cfg.jitter, cfg.max_backoff),
        retry=retry_if_exception(is_transient),
        reraise=True,
        before_sleep=before_retry,
        sleep=sleep,
    )
