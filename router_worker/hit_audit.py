"""The silent-fallback alarm: prefix hits the router predicts that the engines do not confirm.

KV-aware routing is only as good as the router's prompt hashes. A router that renders or
tokenizes a prompt differently from the engine (a wrong tokenizer, a wrong chat template)
keeps routing, and keeps *predicting* cache hits, while the engines recompute every prompt:
routing silently falls back to load balancing with extra steps, and nothing fails. This is
how that is caught in production.

Per instance, the router adds up what it predicted for the requests it served there (the
chosen instance's cached tokens and the prompt tokens, in the router's own token units:
an approximate tokenization counts differently, so only ratios are compared) and reads
what the engine confirms from its own prefix-cache counters (``vllm:prefix_cache_hits`` /
``vllm:prefix_cache_queries``, the deltas between two scrapes). Once a window holds at
least ``MIN_WINDOW_TOKENS`` predicted prompt tokens and the engine has counted lookups, the
two hit ratios are compared and the window starts over: the alarm is up while the
predicted ratio is at least ``MIN_PREDICTED_RATIO`` and exceeds the confirmed one by at
least ``MIN_SHORTFALL`` (a quarter of the prompt tokens predicted cached that the engine
recomputed). A right tokenizer predicts what the engine finds, give or take a block.

Exported (router_worker/metrics.py): the cumulative predicted tokens as counters (so that
Prometheus can compare them with the engines' own counters over any window) and, per
instance, the last window's two ratios and the alarm (``switchyard_router_silent_fallback``
1/0); the dashboard shows the alarm from the routers' snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass

from router_worker.metrics import RouterMetrics
from router_worker.plan import Outcome, Plan
from router_worker.routing.lifecycle import LifecycleObserver

MIN_WINDOW_TOKENS = 2048  # predicted prompt tokens (router units) before a window is judged
MIN_PREDICTED_RATIO = 0.2  # below this the router predicts too little to be wrong about
MIN_SHORTFALL = 0.25  # predicted minus confirmed hit ratio that raises the alarm


@dataclass(slots=True)
class Window:
    """One instance's running window and its last verdict."""

    predicted_hits: float = 0.0
    predicted_prompt: float = 0.0
    engine_hits: float = 0.0
    engine_queries: float = 0.0
    predicted_ratio: float | None = None
    confirmed_ratio: float | None = None
    alarm: bool = False


class HitAudit(LifecycleObserver[Plan]):
    """Compares the router's predicted prefix hits with the engines' (see module doc)."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics
        self.windows: dict[str, Window] = {}

    def _window(self, instance: str) -> Window:
        window = self.windows.get(instance)
        if window is None:
            window = self.windows[instance] = Window()
        return window

    def closed(self, plan: Plan, outcome: Outcome) -> None:
        if not outcome.ok or plan.attempt_count != 1:
            return  # a retried request's prediction was for another instance
        instance = plan.instance
        cached, prompt = plan.decision.cached_tokens, plan.features.prompt_tokens
        window = self._window(instance)
        window.predicted_hits += cached
        window.predicted_prompt += prompt
        m = self.metrics
        m.child(m.predicted_hit_tokens, instance).inc(cached)
        m.child(m.predicted_prompt_tokens, instance).inc(prompt)

    def engine_counted(self, instance: str, hits: float, queries: float) -> None:
        """The engine's prefix-cache counters moved by ``hits`` / ``queries`` since the
        last scrape; judge the window once it holds enough."""
        window = self._window(instance)
        window.engine_hits += hits
        window.engine_queries += queries
        if window.predicted_prompt < MIN_WINDOW_TOKENS or window.engine_queries <= 0:
            return
        predicted = window.predicted_hits / window.predicted_prompt
        confirmed = window.engine_hits / window.engine_queries
        window.predicted_ratio, window.confirmed_ratio = predicted, confirmed
        window.alarm = predicted >= MIN_PREDICTED_RATIO and predicted - confirmed >= MIN_SHORTFALL
        window.predicted_hits = window.predicted_prompt = 0.0
        window.engine_hits = window.engine_queries = 0.0
        m = self.metrics
        m.child(m.predicted_hit_ratio, instance).set(predicted)
        m.child(m.confirmed_hit_ratio, instance).set(confirmed)
        m.child(m.silent_fallback, instance).set(1.0 if window.alarm else 0.0)

    def verdict(self, instance: str) -> bool | None:
        """The instance's last verdict, for the dashboard (None: not judged yet)."""
        window = self.windows.get(instance)
        return None if window is None or window.predicted_ratio is None else window.alarm
