"""The enginesim fleets the tests start (``devharness.Fleet``): simulated H20s serving
Qwen2-7B, 20x faster than real by default, so requests take milliseconds while the engine's
schedule (and so every count the tests check) is unchanged."""

from __future__ import annotations

from typing import Any

from devharness import Fleet

TIME_SCALE = 0.05


def fast_fleet(size: int = 1, **options: Any) -> Fleet:
    """A fleet at the tests' time scale (``options``: :class:`devharness.Fleet`'s), not yet
    started: ``with fast_fleet(2) as fleet`` starts it and always stops it."""
    return Fleet(size, **{"time_scale": TIME_SCALE, **options})
