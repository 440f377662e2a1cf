"""Free loopback ports. Other suites on the machine pick ports too, so a port is only
likely free: callers that start a server on it retry or fail with the server's log."""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20_000, 55_000


def free_port() -> int:
    """A port the kernel just handed out and nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
        base = random.randint(LOW, HIGH)
        ports = list(range(base, base + count))
        if gap:
            ports += list(range(base + gap, base + gap + count))
        if ports_free(ports):
            return base
    raise RuntimeError(f"no {count} consecutive free ports between {LOW} and {HIGH}")
