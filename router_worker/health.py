"""Instance health: configured state, admin drain and a circuit breaker per instance.

Effective health (what the policies see through ``ClusterState.set_health``):
``down`` if the configuration says so or the circuit is open; ``draining`` if the
configuration or an admin drain says so (finishes what it has, gets nothing new);
``healthy`` otherwise.

Circuit breaker, fed passively by request outcomes and actively by ``GET /health``
probes: ``breaker_failures`` consecutive failures (a refused connection counts as
all of them: the process is gone) open the circuit. An open circuit is probed after
its cool-down; a good probe half-opens it (the instance takes traffic again) and the
next success closes it, while any failure re-opens it with a doubled cool-down
(capped at ``MAX_OPEN_S``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from router_worker.routing import Health

MAX_OPEN_S = 30.0
BreakerState = Literal["closed", "open", "half_open"]
HealthName = Literal["healthy", "draining", "down"]
HEALTH_OF = {"healthy": Health.HEALTHY, "draining": Health.DRAINING, "down": Health.DOWN}
ChangeHook = Callable[[str, str, str, str], None]  # (instance, before, after, cause)


@dataclass
class InstanceHealth:
    name: str
    config_state: str = "enabled"
    admin_drain: bool = False
    breaker: BreakerState = "closed"
    failures: int = 0
    open_until: float = 0.0
    open_for: float = 0.0
    last_error: str | None = None

    def effective(self) -> HealthName:
        if self.config_state == "down" or self.breaker == "open":
            return "down"
        if self.config_state == "draining" or self.admin_drain:
            return "draining"
        return "healthy"


class HealthBook:
    """Health of every known instance; calls ``on_change`` when effective health changes."""

    def __init__(
        self, on_change: ChangeHook, failures_to_open: int = 3, open_s: float = 2.0
    ) -> None:
        self.on_change = on_change
        self.failures_to_open = failures_to_open
        self.open_s = open_s
        self.instances: dict[str, InstanceHealth] = {}

    def configure(self, states: dict[str, str], failures_to_open: int, open_s: float) -> None:
        """Apply a configuration: instance set and configured states."""
        self.failures_to_open, self.open_s = failures_to_open, open_s
        for name, state in states.items():
            entry = self.instances.setdefault(name, InstanceHealth(name))
            self._mutate(entry, "config", _set_config_state(state))
        for name in list(self.instances):
            if name not in states:
                entry = self.instances[name]
                self._mutate(entry, "config", _set_config_state("down"))

    def effective(self, name: str) -> HealthName:
        return self.instances[name].effective()

    def set_drain(self, name: str, drain: bool) -> None:
        self._mutate(self.instances[name], "admin", lambda e: setattr(e, "admin_drain", drain))

    def record_success(self, name: str) -> None:
        entry = self.instances.get(name)
        if entry is None or (entry.breaker == "closed" and entry.failures == 0):
            return
        self._mutate(entry, "recovered", _close)

    def record_failure(self, name: str, now: float, cause: str, *, fatal: bool = False) -> None:
        entry = self.instances.get(name)
        if entry is None:
            return
        entry.last_error = cause
        if entry.breaker == "open":
            return
        entry.failures += self.failures_to_open if fatal else 1
        if entry.breaker == "half_open" or entry.failures >= self.failures_to_open:
            self._mutate(entry, cause, lambda e: self._open(e, now))

    def due_for_probe(self, name: str, now: float) -> bool:
        entry = self.instances[name]
        return entry.breaker != "open" or now >= entry.open_until

    def record_probe(self, name: str, ok: bool, now: float, cause: str = "probe") -> None:
        entry = self.instances.get(name)
        if entry is None:
            return
        if not ok:
            self.record_failure(name, now, cause)
            if entry.breaker == "open" and now >= entry.open_until:
                self._open(entry, now)  # still failing: back off further
            return
        if entry.breaker == "open":
            self._mutate(entry, "probe ok", _half_open)
        elif entry.breaker == "half_open" or entry.failures:
            self._mutate(entry, "probe ok", _close)

    def _open(self, entry: InstanceHealth, now: float) -> None:
        was_open = entry.breaker == "open" or entry.breaker == "half_open"
        entry.open_for = min(entry.open_for * 2, MAX_OPEN_S) if was_open else self.open_s
        entry.breaker = "open"
        entry.open_until = now + entry.open_for

    def _mutate(
        self, entry: InstanceHealth, cause: str, change: Callable[[InstanceHealth], None]
    ) -> None:
        before = entry.effective()
        change(entry)
        after = entry.effective()
        if before != after:
            self.on_change(entry.name, before, after, cause)


def _close(entry: InstanceHealth) -> None:
    entry.breaker, entry.failures, entry.open_for = "closed", 0, 0.0


def _half_open(entry: InstanceHealth) -> None:
    entry.breaker = "half_open"


def _set_config_state(state: str) -> Callable[[InstanceHealth], None]:
    def change(entry: InstanceHealth) -> None:
        entry.config_state = state

    return change
