"""Where a benchmark phase's time goes on this machine: the CPU seconds this process used (the
client: every thread of it), those the PostgreSQL server used (the postmaster and every backend of
every database, those that exited during the phase included: run the benchmark alone) and how busy
the machine's cores were, between two readings (``psutil``).

A backend that exits is reaped by the postmaster, whose ``children_user``/``children_system`` then
hold its CPU: the server's reading is the postmaster's own and reaped children's time plus every
live child's, so a connection closed during the phase is counted whole."""

from __future__ import annotations

from dataclasses import dataclass

import psutil


def _times(process: psutil.Process) -> float:
    t = process.cpu_times()
    return t.user + t.system


def postmaster(conn) -> psutil.Process | None:
    """The postmaster of ``conn``'s server (its backend's parent), or None when the server is not a
    process of this machine."""
    try:
        backend = psutil.Process(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        parent = backend.parent()
        return parent if parent is not None and "postgres" in parent.name() else None
    except (psutil.Error, OSError):
        return None


def server_seconds(master: psutil.Process | None) -> float | None:
    """CPU seconds the whole server has used so far (every database of it; module docstring), or
    None without a postmaster. A child reaped while its siblings are read would be in neither sum:
    the reading is taken again until the postmaster reaped nobody meanwhile."""
    if master is None:
        return None
    try:
        for _ in range(20):
            before = master.cpu_times()
            live = 0.0
            for child in master.children(recursive=True):
                try:
                    live += _times(child)
                except psutil.NoSuchProcess:  # reaped since the listing: the check below sees it
                    pass
            after = master.cpu_times()
            reaped = after.children_user + after.children_system
            if reaped == before.children_user + before.children_system:
                return after.user + after.system + reaped + live
        return None
    except psutil.Error:
        return None


@dataclass
class Reading:
    client: float
    server: float | None
    busy: float
    total: float


@dataclass
class Spent:
    """CPU seconds of a phase: ``client`` (this process), ``server`` (PostgreSQL, None when remote),
    and the machine's cores ``busy`` (0..1 of every core)."""

    client: float
    server: float | None
    busy: float

    def per_message(self, messages: int) -> str:
        """``client 1.204 + PostgreSQL 0.951 ms of CPU a message, 2 cores 97% busy``."""
        n = max(messages, 1)
        server = "?" if self.server is None else f"{self.server * 1000 / n:.3f}"
        return (
            f"client {self.client * 1000 / n:.3f} + PostgreSQL {server} ms of CPU a message, "
            f"{psutil.cpu_count()} cores {self.busy:.0%} busy"
        )


class CpuMeter:
    """``start()`` then ``stop()`` -> ``Spent`` between them; ``master``: ``postmaster(conn)``."""

    def __init__(self, master: psutil.Process | None) -> None:
        self.master = master
        self.me = psutil.Process()

    def _read(self) -> Reading:
        machine = psutil.cpu_times()
        idle = machine.idle + getattr(machine, "iowait", 0.0)
        # guest time is in user's and nice's already (psutil's own cpu_percent leaves it out)
        total = sum(machine) - getattr(machine, "guest", 0.0) - getattr(machine, "guest_nice", 0.0)
        return Reading(_times(self.me), server_seconds(self.master), total - idle, total)

    def start(self) -> None:
        self.begin = self._read()

    def stop(self) -> Spent:
        end, begin = self._read(), self.begin
        server = None if end.server is None or begin.server is None else end.server - begin.server
        span = end.total - begin.total
        return Spent(end.client - begin.client, server, (end.busy - begin.busy) / span if span else 0.0)
