"""Free loopback ports. Other suites on the machine pick ports too, so a port is only
likely free: callers that start a server on it retry or fail with the server's log."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _listen_range() -> tuple[int, int]:
    """Ports to hand out: below the kernel's ephemeral range, which every outgoing
    connection (Redis, Postgres, httpx) draws from, so a port found free is not taken
    by a client socket before the server binds it."""
    try:
        ephemeral_low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32_768  # Linux's default
    return 10_000, max(ephemeral_low - 1, 20_000)


LOW, HIGH = _listen_range()


def free_port() -> int:
    """A port nobody listens on, outside the ephemeral range."""
    return free_ports(1)


def ports_free(ports: list[int]) -> bool:
    for port in ports:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_ports(count: int, gap: int = 0) -> int:
    """First of ``count`` consecutive free ports (and ``count`` more ``gap`` above them, for
    servers that derive a second port per instance)."""
    for _ in range(500):
        base = random.randint(LOW, HIGH - gap - count)
        ports = list(range(base, base + count))
        if gap:
            ports += list(range(base + gap, base + gap + count))
        if ports_free(ports):
            return base
    raise RuntimeError(f"no {count} consecutive free ports between {LOW} and {HIGH}")
