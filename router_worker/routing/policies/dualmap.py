"""``dualmap``: two hash candidates over an adaptive prefix key (docs/algorithms.md, "dualmap").

Hash key — prefix hotness tree
    A node is a prompt prefix of ``d`` blocks, ``d`` in
    ``min_key_blocks · 2^j`` (doubling keeps the tree shallow for long
    prompts), identified by the router hash of its last block. Every request
    counts on each node along its path, in a sliding window of ``window_s``
    seconds. With ``n`` healthy instances, a node is *hot* when its traffic
    share ρ exceeds 2/n: it expands, and requests through it take the next,
    twice-as-long key. An expanded node whose ρ falls below 1/n is *cold* and
    collapses (the hysteresis between 1/n and 2/n stops flapping). Shares are
    only judged once the window holds at least n requests: below that no node
    can overload an instance, and a lone request would otherwise always look
    hot (ρ = 1). The key is the deepest node reached. A prompt shorter than one block has no prefix
    worth keeping together and is keyed by its request id.

Candidates — two consistent-hash rings
    Two rings with different seeds, each with ``virtual_nodes`` points per
    healthy instance (placed by the instance *id*, so slot order is
    irrelevant and adding an instance remaps only ≈1/n of keys). Candidate 1
    from ring 1, candidate 2 from ring 2; when both name the same instance,
    candidate 2 is the next *different* instance clockwise on ring 2 — the
    ring analogue of DualMap's ``(id1 + 1) mod n`` that keeps the remapping
    property. With one healthy instance both are that instance.

Choice — SLO-aware with hotspot rebalance
    Affinity = the candidate with the longer local hit (candidate 1 on a tie).
    If its estimated TTFT ≤ ``slo_ttft_s`` → affinity (``affinity``). Otherwise
    if the other candidate's estimated TTFT is lower (the migration benefit
    ``TTFT_aff − TTFT_other`` is positive) → the other (``hotspot_rebalance``);
    else affinity anyway (``affinity_slo_miss``). Scores: estimated TTFT of
    the two candidates (others filtered).

Migration — hotspot-aware rebalancing of queued requests (DualMap's)
    After each dispatch the driver hands ``migrations`` the requests queued (no first
    token) on the instances the decision named. For a source instance ``i`` a queued
    request's TTFT is its wait so far plus the prefill work queued on ``i`` up to and
    including it (FIFO) over ``i``'s prefill throughput; on its alternative candidate
    ``j``, its wait plus ``j``'s pending work (and what this call already moved there)
    plus its own uncached prompt. While some request on ``i`` that can still make the SLO
    (waited < SLO) is estimated past it, the movable request with the largest benefit
    ``B = TTFT_i − TTFT_j`` moves, if ``B > 0`` and ``TTFT_j < slo_ttft_s``. The driver
    executes: the simulator aborts it in the engine's waiting queue and sends it to ``j``;
    the live router closes the upstream stream of a streamed request that has sent the
    client nothing yet (vLLM aborts it) and re-sends it to ``j`` as a new attempt.

The SLO default, 1 s, is measured: ``bench/dualmap_slo/run.py`` replays three matrix
cells at ``slo_ttft_s`` from 0.5 to 16 s and two more at 1, 2 and 8 s;
``bench/dualmap_slo/README.md`` has the tables and the reading (large SLOs keep a hot key on its
instance while its queue grows; migration moves few requests, since one must still be
able to make the SLO on its alternative, counting the time it has already waited).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from router_worker.routing.features import RequestFeatures
from router_worker.routing.indicators import ClusterView
from router_worker.routing.policies.base import (
    Decision,
    Migration,
    PolicyParams,
    QueuedRequest,
    RoutingPolicy,
)
from router_worker.routing.provenance import design, matrix, paper

_MASK64 = (1 << 64) - 1


class DualMapParams(PolicyParams):
    slo_ttft_s: float = Field(
        1.0,
        gt=0,
        description="TTFT SLO for keeping cache affinity and for migrating "
        "queued requests, s (default from bench/dualmap_slo/README.md)",
        json_schema_extra=matrix(),
    )
    window_s: float = Field(
        60.0, gt=0, description="hotness window, seconds", json_schema_extra=design()
    )
    min_key_blocks: int = Field(
        4, ge=1, description="shortest hash key, in blocks", json_schema_extra=design()
    )
    virtual_nodes: int = Field(
        64, ge=1, le=4096, description="ring points per instance", json_schema_extra=design()
    )
    migrate_queued: bool = Field(
        True,
        description="move queued requests off an instance that would miss the SLO",
        json_schema_extra=paper("DualMap"),
    )


def _mix64(x: int) -> int:
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent-hash ring of instance ids with virtual nodes."""

    def __init__(self, instance_ids: tuple[str, ...], seed: int, virtual_nodes: int) -> None:
        points = sorted(
            (_stable_hash(f"{seed}/{iid}/{v}"), iid)
            for iid in instance_ids
            for v in range(virtual_nodes)
        )
        self.seed = seed
        self._points = [p for p, _ in points]
        self._owners = [iid for _, iid in points]

    def _position(self, key: int) -> int:
        return bisect_right(self._points, _mix64(key ^ _mix64(self.seed))) % len(self._points)

    def lookup(self, key: int) -> str:
        return self._owners[self._position(key)]

    def lookup_other(self, key: int, exclude: str) -> str:
        """First owner clockwise from the key's position that is not ``exclude``."""
        start = self._position(key)
        for step in range(len(self._owners)):
            owner = self._owners[(start + step) % len(self._owners)]
            if owner != exclude:
                return owner
        return exclude


@dataclass(slots=True)
class _Node:
    count: int = 0
    expanded: bool = False


class PrefixHotnessTree:
    """Windowed traffic share per prefix node; yields each request's hash key."""

    def __init__(self, min_key_blocks: int, window_s: float) -> None:
        self.min_key_blocks = min_key_blocks
        self.window_s = window_s
        self.nodes: dict[int, _Node] = {}
        self._window: deque[tuple[float, tuple[int, ...]]] = deque()

    def key_for(self, request: RequestFeatures, instances: int, now: float) -> tuple[int, int]:
        """(hash key, key length in blocks) for the request; records its traffic."""
        self._expire(now)
        blocks = request.block_hashes
        if not blocks:
            return _stable_hash(request.request_id), 0
        total = len(self._window) + 1
        path: list[int] = []
        depth = min(self.min_key_blocks, len(blocks))
        while True:
            node_key = blocks[depth - 1]
            node = self.nodes.setdefault(node_key, _Node())
            node.count += 1
            path.append(node_key)
            if total >= instances:
                self._expand_or_fold(node, node.count / total, instances)
            if not node.expanded or depth >= len(blocks):
                break
            depth = min(2 * depth, len(blocks))
        self._window.append((now, tuple(path)))
        return path[-1], depth

    @staticmethod
    def _expand_or_fold(node: _Node, share: float, instances: int) -> None:
        if share > 2 / instances:
            node.expanded = True
        elif share < 1 / instances:
            node.expanded = False

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        while self._window and self._window[0][0] <= horizon:
            _, path = self._window.popleft()
            for node_key in path:
                node = self.nodes[node_key]
                node.count -= 1
                if node.count == 0:
                    del self.nodes[node_key]


class DualMapPolicy(RoutingPolicy):
    kind = "dualmap"
    description = "DualMap: two consistent-hash candidates on an adaptive prefix key, SLO-aware."
    Params = DualMapParams
    params: DualMapParams

    def __init__(self, params: PolicyParams | None = None, seed: int = 0) -> None:
        super().__init__(params, seed)
        self.tree = PrefixHotnessTree(self.params.min_key_blocks, self.params.window_s)
        self._rings: tuple[tuple[str, ...], HashRing, HashRing] | None = None
        self.migrates = self.params.migrate_queued

    def candidates(self, key: int, healthy_ids: tuple[str, ...]) -> tuple[str, str]:
        ring1, ring2 = self._rings_for(healthy_ids)
        first = ring1.lookup(key)
        second = ring2.lookup(key)
        if second == first:
            second = ring2.lookup_other(key, first)
        return first, second

    def decide(self, request: RequestFeatures, view: ClusterView, now: float) -> Decision:
        allowed = self.eligible_mask(view)
        slots = allowed.nonzero()[0].tolist()
        ids = view.ids
        healthy_ids = tuple([ids[s] for s in slots])
        key, key_blocks = self.tree.key_for(request, len(healthy_ids), now)
        first, second = self.candidates(key, healthy_ids)
        c1, c2 = slots[healthy_ids.index(first)], slots[healthy_ids.index(second)]
        hit = view.cached_tokens(request)
        ttft = view.estimated_ttft(request)
        affinity, other = (c2, c1) if hit[c2] > hit[c1] else (c1, c2)
        if ttft[affinity] <= self.params.slo_ttft_s:
            slot, reason = affinity, "affinity"
        elif ttft[other] < ttft[affinity]:
            slot, reason = other, "hotspot_rebalance"
        else:
            slot, reason = affinity, "affinity_slo_miss"
        shown = np.zeros(view.size, dtype=bool)
        shown[[c1, c2]] = True
        return self.decision(
            view,
            request,
            slot,
            reason,
            ttft,
            shown,
            key_blocks=key_blocks,
            candidates=[first, second],
        )

    def migrations(
        self, view: ClusterView, queued: Sequence[QueuedRequest], now: float
    ) -> list[Migration]:
        """Hotspot-aware rebalancing of queued requests, per source instance."""
        lines: dict[str, list[QueuedRequest]] = {}
        for request in queued:
            lines.setdefault(request.instance_id, []).append(request)
        slot_of = {iid: slot for slot, iid in enumerate(view.ids)}
        added = np.zeros(view.size)  # prefill work already moved onto each target
        moves: list[Migration] = []
        for source, line in lines.items():
            if source in slot_of:
                line.sort(key=lambda request: request.dispatch_time)
                moves += self._relieve(view, slot_of, source, line, now, added)
        return moves

    def _relieve(
        self,
        view: ClusterView,
        slot_of: dict[str, int],
        source: str,
        line: list[QueuedRequest],
        now: float,
        added: np.ndarray,
    ) -> list[Migration]:
        """Move the largest-benefit request until the source's queue meets the SLO.

        A queued request's TTFT on the source is its wait so far plus the work queued up
        to and including it (FIFO) over the source's prefill throughput; on its
        alternative, its wait plus that instance's pending work and its own uncached
        prompt. Requests that have already waited past the SLO cannot be saved and do not
        keep the loop going.
        """
        slo, tps, src = self.params.slo_ttft_s, view.prefill_tps, slot_of[source]
        options = [self._option(view, slot_of, source, request) for request in line]
        moves: list[Migration] = []
        while line:
            waited = np.array([now - r.features.arrival_time for r in line])
            here = waited + np.cumsum([r.uncached_tokens for r in line]) / tps[src]
            if not np.any((here > slo) & (waited < slo)):
                break
            best: tuple[float, int, int, float] | None = None
            for k, option in enumerate(options):
                if option is None:
                    continue
                target, work = option
                there = (
                    waited[k] + (view.pending_prefill[target] + added[target] + work) / tps[target]
                )
                benefit = float(here[k] - there)
                if benefit > 0 and there < slo and (best is None or benefit > best[0]):
                    best = (benefit, k, target, work)
            if best is None:
                break
            benefit, k, target, work = best
            added[target] += work
            moves.append(Migration(line[k].features.request_id, source, view.ids[target], benefit))
            del line[k], options[k]
        return moves

    @staticmethod
    def _option(
        view: ClusterView, slot_of: dict[str, int], source: str, request: QueuedRequest
    ) -> tuple[int, float] | None:
        """(alternative slot, its prefill work there) for a movable request, else None."""
        if not request.movable:
            return None
        for candidate in request.candidates:
            slot = slot_of.get(candidate)
            if candidate != source and slot is not None and view.eligible[slot]:
                return slot, float(view.new_tokens(request.features)[slot])
        return None

    def _rings_for(self, healthy_ids: tuple[str, ...]) -> tuple[HashRing, HashRing]:
        if self._rings is None or self._rings[0] != healthy_ids:
            vnodes = self.params.virtual_nodes
            self._rings = (
                healthy_ids,
                HashRing(healthy_ids, 1, vnodes),
                HashRing(healthy_ids, 2, vnodes),
            )
        return self._rings[1], self._rings[2]
