"""The kill point of a consumer that waits for its messages (issue 42, ``receive(...,
wait_seconds=...)``): a consumer looping on waiting receives, woken by the publishes made meanwhile,
killed at a random moment (inside a receive, an answer, or a wait). A part of the controller
(chaos/run.py), through ``KillPoints``, with its plumbing (``spawn``, ``top_up``, ``kills``)."""

from __future__ import annotations

import time

WAITING = "consumer: looping on waiting receives, at a random moment"


class WaitingKillPoints:
    """The kill point of a waiting consumer."""

    def consumer_waiting(self) -> None:
        from scenarios import CONSUMERS  # (scenarios imports this module)

        waits = ("--max", "5", "--lease", "2", "--wait", "2", "--loop")
        worker = self.spawn("consume", "--group", self.rng.choice(CONSUMERS), *waits)
        deadline = time.monotonic() + self.rng.uniform(0.3, 3.0)
        while time.monotonic() < deadline and worker.proc.poll() is None:
            self.top_up()  # publishes now and then: the waits are woken
            time.sleep(0.1)
        if worker.proc.poll() is None:
            self.kills[WAITING] += 1
        worker.kill()
