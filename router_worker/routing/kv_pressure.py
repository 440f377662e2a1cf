"""KV pressure: can an instance's KV cache hold a request for its whole life?

Shared by the cache-affine policies (docs/algorithms.md, "KV pressure"). A prefix cache
hit makes the instances holding a prefix the cheapest place to prefill every request that
shares it; with long outputs, the KV those requests grow into is what runs out first. Once
an instance's cache cannot hold what it has taken on, vLLM stops admitting its queued
requests and preempts running ones (their KV is freed and recomputed later), while
instances without the prefix idle. The rule here: a request counts against an instance's
KV from its dispatch to its finish, at its expected size, and an instance whose cache
cannot hold r on top of what it has taken on makes r wait.

Per instance i, in tokens (all from the view, plus the output lengths the policy observes
through ``observe_first_token`` / ``observe_finish``)::

    need_i  = used_i + pending_i + growth_i + new_i(r) + E
    short_i = max(need_i − capacity_i, 0)

* ``capacity_i``: ``capacity_blocks × block_size`` (scraped, else configured);
* ``used_i``: the scraped KV usage × capacity (0 until scraped): the blocks the running
  batch and the prefix cache's referenced blocks hold now, generated tokens included;
* ``pending_i``: prompt tokens dispatched to i and not yet prefilled (the view's pending
  prefill): they need blocks once admitted;
* ``growth_i``: the output still to come of the requests i has taken on: each queued
  request (dispatched, no first token) ``E``; each decoding request what its expected
  output leaves, ``max(E − g, 0)``, with g the tokens it has decoded (its time since its
  first token ÷ the measured time per output token, averaged over i's decoding requests).
  The router cannot tell one request's output from another's, so every request is
  expected to end at E tokens (its decoded tokens are already in ``used_i``): an instance
  whose requests are older is not charged more than one whose requests are younger;
* ``new_i(r)``: r's prompt tokens not cached on i; ``E``: r's expected output.

Expected output. The mean of finished outputs alone (``E_done``) is biased short exactly
when it matters: short requests finish first, and a burst of long ones has not finished
while it is being placed. Requests still decoding are censored observations: one that has
decoded g tokens is expected to decode about g more (the median remaining life under a
length distribution the router does not know, the Copernican estimate), i.e. 2g in all.
``E`` = max(``E_done``, 2 × the mean g of every decoding request in the fleet).

How the policies use ``short_i``: lmetric and smetric (follow-ups) choose only among
instances without a shortfall while one has room (:func:`kv_room`), and among those with
the smallest shortfall relative to their capacity when none has: a fleet short of KV
everywhere is balanced by KV, whatever the cache hits. predicted_ttft charges the wait it
implies (:func:`kv_wait`): what overflows is freed as i's batch turns over.
"""

from __future__ import annotations

import numpy as np

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView

OUTPUT_PRIOR = 256  # expected output tokens until a finish was observed
_OUTPUT_WINDOW = 200  # the finished mean is over about the last this many finishes
_TPOT_ALPHA = 0.05  # weight of a new sample in the fleet's time per output token
_MAX_OPEN = 100_000  # first-token times kept for requests not yet finished (oldest dropped)


class OutputLengths:
    """What a policy learns about output lengths from its feedback: the mean output of
    finished requests and the fleet's time per output token (to turn a decoding request's
    time since its first token into the tokens it has decoded)."""

    def __init__(self, prior_tokens: float = OUTPUT_PRIOR) -> None:
        self.done_mean = float(prior_tokens)  # E_done
        self.tpot_s: float | None = None  # fleet EWMA of measured time per output token
        self._finishes = 0
        self._first: dict[str, float] = {}

    def first_token(self, request_id: str, now: float) -> None:
        if len(self._first) >= _MAX_OPEN:
            self._first.pop(next(iter(self._first)))
        self._first[request_id] = now

    def finish(self, request_id: str, output_tokens: int, now: float) -> None:
        self._finishes += 1
        weight = 1.0 / min(self._finishes, _OUTPUT_WINDOW)
        self.done_mean += weight * (output_tokens - self.done_mean)
        first = self._first.pop(request_id, None)
        if first is None or output_tokens < 2 or now <= first:
            return
        sample = (now - first) / (output_tokens - 1)
        self.tpot_s = (
            sample if self.tpot_s is None else self.tpot_s + _TPOT_ALPHA * (sample - self.tpot_s)
        )

    def decoded(self, view: ClusterView, decode_age_s: np.ndarray | None = None) -> np.ndarray:
        """Per slot, the mean tokens decoded so far by i's decoding requests (0 before a
        time per output token was measured). ``decode_age_s``: the view's, if read already."""
        if self.tpot_s is None:
            return np.zeros(view.size)
        age = view.decode_age_s if decode_age_s is None else decode_age_s
        return age / np.maximum(view.decoding, 1.0) / self.tpot_s

    def expected(self, view: ClusterView, decode_age_s: np.ndarray | None = None) -> float:
        """E: a new request's expected output tokens (module docstring). ``decode_age_s``:
        the view's, if read already."""
        decoding = float(view.decoding.sum())
        if self.tpot_s is None or decoding <= 0:
            return self.done_mean
        age = view.decode_age_s if decode_age_s is None else decode_age_s
        in_flight = float(age.sum()) / decoding / self.tpot_s
        return max(self.done_mean, 2.0 * in_flight)


def kv_need(
    request: RequestFeatures, view: ClusterView, outputs: OutputLengths
) -> tuple[np.ndarray, np.ndarray]:
    """Per slot, (need_i, capacity_i) in tokens (module docstring)."""
    capacity = view.capacity_blocks * float(view.block_size)
    used = view.kv_usage_or_zero * capacity
    age = None if outputs.tpot_s is None else view.decode_age_s  # computed per read: once
    expected = outputs.expected(view, age)
    decoded = outputs.decoded(view, age)
    remaining = np.maximum(expected - decoded, 0.0)
    queued = np.maximum(view.in_flight - view.decoding, 0.0)
    growth = queued * expected + view.decoding * remaining
    need = used + view.pending_prefill + growth + view.new_tokens(request) + expected
    return need, capacity


def kv_shortfall(request: RequestFeatures, view: ClusterView, outputs: OutputLengths) -> np.ndarray:
    """Per slot, the KV tokens i lacks to hold r on top of what it has taken on."""
    need, capacity = kv_need(request, view, outputs)
    return np.maximum(need - capacity, 0.0)


def kv_room(
    request: RequestFeatures, view: ClusterView, allowed: np.ndarray, outputs: OutputLengths
) -> np.ndarray:
    """The allowed slots whose KV holds r (all of them when none is short); when every
    allowed slot is short, those with the smallest shortfall relative to their capacity."""
    if not allowed.any():
        return allowed
    need, capacity = kv_need(request, view, outputs)
    short = np.maximum(need - capacity, 0.0)
    roomy = allowed & (short <= 0.0)
    if roomy.any():
        return roomy
    relative = short / np.maximum(capacity, 1.0)
    return allowed & (relative <= float(relative[allowed].min()))


def kv_wait(
    request: RequestFeatures,
    view: ClusterView,
    outputs: OutputLengths,
    step_s: np.ndarray,
) -> np.ndarray:
    """Per slot, seconds r waits for KV: the shortfall is freed as the requests resident
    in i's cache finish; they hold at most its capacity and turn over about once every E
    decode steps (``step_s``: i's decode step), so i frees ``min(need − r's part,
    capacity) / (E · step)`` tokens a second."""
    need, capacity = kv_need(request, view, outputs)
    expected = outputs.expected(view)
    short = np.maximum(need - capacity, 0.0)
    resident = np.clip(need - view.new_tokens(request) - expected, 1.0, np.maximum(capacity, 1.0))
    return short / resident * expected * step_s
