"""Three bugs of a consumer's own code, each raising with ids that vary from message to message
(issue 40's done test: the API, the CLI, the metric and the page must each show three failures),
and the 3,000 dead letters they make."""

from __future__ import annotations

import uuid

from helpers import at
from redelivery.messaging.receipts import Outcome


class PaymentDeclined(Exception):
    pass


def charge(order: int) -> None:
    raise PaymentDeclined(f"card declined for order {order} (ref 0x{order * 7919:08x}, txn {uuid.uuid4()})")


def find_customer(order: int) -> None:
    customers: dict[str, int] = {}
    customers[f"cust-{order}"]  # KeyError with the customer's quoted id


def parse_amount(order: int) -> None:
    int(f"{order}.5 EUR")  # ValueError: invalid literal for int() with base 10: '12.5 EUR'


BUGS = (charge, find_customer, parse_amount)


def raised(bug, order: int) -> BaseException:
    try:
        bug(order)
    except Exception as exc:
        return exc
    raise AssertionError(f"{bug.__name__} did not raise")


def three_bugs_dead(client, url: str) -> list:
    """3,000 failures of three bugs (1,000 each), retried once (nack, a tier run) and then
    dead-lettered (reject, half of them by a settle); returns the first deliveries."""
    client.publish("orders", [{"n": i} for i in range(3000)], at=at(0))
    sent = client.receive("billing", "orders", 3000, 30, at=at(0))
    assert len(sent) == 3000
    bug_of = {m.message_id: BUGS[i % 3] for i, m in enumerate(sent)}
    client.nack(
        "billing", sent, error=[raised(bug_of[m.message_id], i) for i, m in enumerate(sent)], at=at(1)
    )
    client.create_group("billing", max_reconsume_times=1)  # promoted now, then dead on their next failure
    from redelivery.tiers.run import TierRunRequest, run_tier

    run_tier(TierRunRequest(tier="seconds", window_end=at(600), run_key="t1"), url=url, config=client.config)
    again = client.receive("billing", "orders", 3000, 30, at=at(600))
    assert len(again) == 3000
    half = len(again) // 2
    client.reject(
        "billing",
        again[:half],
        error=[raised(bug_of[m.message_id], 10_000 + i) for i, m in enumerate(again[:half])],
    )
    client.settle(
        "billing",
        [Outcome(m, "reject", raised(bug_of[m.message_id], 20_000 + i)) for i, m in enumerate(again[half:])],
    )
    return sent
