"""The closed vocabularies of the state machine, each declared once: the delivery states, the
dead-letter reasons, and what an ordered subscription's dead-lettered message does to its key.

Each is a ``Literal`` type (what pydantic models, the JSON schemas of the Airflow forms and type
checkers read) and the tuple of its words in the database's order (what the code iterates, and
what error messages list). The database holds a frozen copy of each, as an enum type or a CHECK
constraint of a migration; a test (tests/store/test_words.py) reads them from the live schema and
requires them equal to these, so a word added here only, or in a migration only, fails there.
"""

from __future__ import annotations

from typing import Literal, get_args

#: The states of a delivery (the database enum ``delivery_state``, in its order), RocketMQ 5's
#: PushConsumer (RocketMQ 5, "Consumption retry") and the ordered subscriptions' two (issue 31):
#: BLOCKED, a message behind its key's unfinished one, and HALTED, the dead-lettered head of a key
#: of a ``halt`` subscription.
State = Literal["READY", "INFLIGHT", "WAITING_RETRY", "COMMITTED", "DLQ", "BLOCKED", "HALTED"]
STATES: tuple[State, ...] = get_args(State)
#: The states a row of ``deliveries`` holds (its CHECK ``deliveries_state_key_check``): COMMITTED
#: and DLQ are rows deleted; BLOCKED and HALTED only on a row with a key.
ROW_STATES: tuple[State, ...] = ("READY", "INFLIGHT", "WAITING_RETRY", "BLOCKED", "HALTED")
KEYED_STATES: tuple[State, ...] = ("BLOCKED", "HALTED")
#: The states a subscription's messages are counted in (``Client.stats``, ``redelivery stats``): a
#: HALTED row's message is counted as its dead letter (DLQ).
COUNTED_STATES: tuple[State, ...] = tuple(s for s in STATES if s != "HALTED")

#: Why a message was dead-lettered (the database enum ``dlq_reason``): retries used up, a lease
#: expired with retries used up, rejected, a negative delay level (RocketMQ), a body Python cannot
#: decode (``Client.receive``).
Reason = Literal["MAX_DELIVERIES_EXCEEDED", "LEASE_EXPIRED", "REJECTED", "NEGATIVE_LEVEL", "UNDECODABLE"]
REASONS: tuple[Reason, ...] = get_args(Reason)

#: What an ordered subscription's dead-lettered message does to its key (``subscriptions.on_exhausted``,
#: its CHECK): the first word is the default.
OnExhausted = Literal["continue", "halt"]
ON_EXHAUSTED: tuple[OnExhausted, ...] = get_args(OnExhausted)
#: What each word means, as the CLI's help and the config's description say it.
ON_EXHAUSTED_MEANING: dict[OnExhausted, str] = {
    "continue": "a dead-lettered message releases its key",
    "halt": "its key waits until the dead letter is redriven",
}
DEFAULT_ON_EXHAUSTED: OnExhausted = ON_EXHAUSTED[0]
#: ``continue (...) or halt (...)``: the words with their meanings, for a help text.
ON_EXHAUSTED_HELP = " or ".join(f"{word} ({ON_EXHAUSTED_MEANING[word]})" for word in ON_EXHAUSTED)


def one_of(words: tuple[str, ...]) -> str:
    """``'a', 'b' or 'c'``: the words as an error message lists them."""
    quoted = [repr(w) for w in words]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
