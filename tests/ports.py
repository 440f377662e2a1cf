"""Free loopback ports for test processes (engines, routers, control planes)."""

from __future__ import annotations

import random
import socket


def ports_free(ports: list[int]) -> bool:
    for port in ports:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_ports(count: int, gap: int = 0) -> int:
    """First of ``count`` consecutive free ports (and ``count`` more ``gap`` above them)."""
    for _ in range(500):
        base = random.randint(20_000, 55_000)
        ports = list(range(base, base + count))
        if gap:
            ports += list(range(base + gap, base + gap + count))
        if ports_free(ports):
            return base
    raise RuntimeError("no free ports")
