"""Clock-agnostic vLLM v1 engine core.

The caller owns the clock: ``add_request(..., now)``, ``abort(req_id, now)`` and
``advance_to(t)`` all take virtual seconds (non-decreasing; earlier times are clamped to
the latest one seen). Steps run back to back while there is work; a step's scheduling
decision is committed when the step *starts* (so requests that arrive later cannot join
it) and its outputs are delivered once the caller's clock reaches the step's *end*.

A request becomes schedulable ``calibration.t_request`` after it arrives (the API server's
per-request work: HTTP, tokenisation, returning the first token), so it joins the first
step that starts once that has passed; with one constant delay, readiness keeps FCFS order.

An instance unlike its cost model (``EngineConfig.speed``, ``step_jitter``;
enginesim.engine.fleet) has each step's GPU time divided by its speed (in the cost model)
and multiplied by the jitter factor of the step's number.

Stretches where the batch only decodes (no prefill, no admission possible, no
preemption) are priced in one vectorised cost-model call and committed in a single
chunk, so simulated time advances without a Python loop per token or per step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from engine_interface.kv_events import BlockStored, KVEvent
from enginesim.engine.config import EngineConfig
from enginesim.engine.costmodel import StepBatch
from enginesim.engine.fleet import StepJitter
from enginesim.engine.hashing import block_hashes
from enginesim.engine.kvpool import BlockPool, PrefixNode
from enginesim.engine.transfer import LinkQueue, TransferStats

MAX_CHUNK_STEPS = 2048


class EngineRequestError(ValueError):
    """A request the engine refuses (too long, bad max_tokens, duplicate id)."""


@dataclass
class RequestOutput:
    req_id: str
    new_token_count: int  # tokens produced since this request's previous output
    num_output_tokens: int  # tokens produced so far (delivered)
    first_token_time: float | None
    finished: bool
    finish_reason: str | None  # "length" | "abort" | "error"
    num_cached_tokens: int  # prompt tokens not prefilled: local prefix hit + global tier
    arrival_time: float
    prompt_tokens: int
    finish_time: float | None = None
    last_token_time: float | None = None
    token_times: np.ndarray | None = None  # times of the new tokens (advance_to(per_token=True))
    num_tier_tokens: int = 0  # of num_cached_tokens, those loaded from the global tier


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    external_cache_hits: int
    num_preemptions: int
    num_gpu_blocks: int
    block_size: int
    prompt_tokens: int
    generation_tokens: int
    num_steps: int
    busy_time: float
    num_finished: int
    has_tier: bool = False  # a global KV tier is attached (the tier_* fields mean something)
    tier_bytes_read: int = 0
    tier_read_time: float = 0.0  # s the steps spent loading from the tier, waits included
    tier_read_wait: float = 0.0  # ... of which queued behind other engines' reads
    transfer: TransferStats = field(default_factory=TransferStats)  # disaggregation


@dataclass(eq=False)
class _Request:
    req_id: str
    prompt: np.ndarray
    max_tokens: int
    arrival: float
    ready: float  # arrival + the per-request overhead: the earliest step it may join
    hashes: list[int]  # of the full blocks of ``tokens``
    tokens: np.ndarray  # prompt (+ known output): what its cached blocks hold
    tip: PrefixNode  # end of the cached path it references (the pool's root: none)
    num_computed: int = 0
    num_output: int = 0
    num_private: int = 0  # allocated blocks not in the prefix cache
    num_checked_blocks: int = 0  # leading blocks computed and offered to the cache
    num_cached_tokens: int = -1
    num_tier_tokens: int = 0
    first_token_time: float | None = None
    last_token_end: float = 0.0  # end of the step that sampled its latest token
    finish_time: float | None = None
    finish_reason: str | None = None
    runs: list[list[int]] = field(default_factory=list)  # [first global step, token count]
    delivered: int = 0
    finish_reported: bool = False
    prompt_len: int = 0
    num_tokens: int = 0  # prompt + output tokens so far
    # Disaggregation: hold the blocks when finished (a prefill for a remote decode), or
    # read the prompt's KV from a prefill instance first (a remote prefill).
    hold_kv: bool = False
    remote_prefill: bool = False
    deadline: float = 0.0  # a remote prefill's room, or a hold's read, must come by then
    pull_started: float = 0.0
    pull_done: float = 0.0
    pull_bytes: int = 0
    block_ids: list[int] = field(default_factory=list)  # a hold's blocks, as named to a reader

    def __post_init__(self) -> None:
        self.prompt_len = self.num_tokens = len(self.prompt)

    @property
    def num_blocks(self) -> int:
        return self.num_held + self.num_private

    @property
    def num_held(self) -> int:
        """Cached blocks it references: its leading blocks, up to its path's end."""
        return self.tip.end


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        kv_event_sink: Callable[[list[KVEvent]], None] | None = None,
        fast_forward: bool = True,
        tier_link: int = 0,
    ) -> None:
        """``tier_link``: the global tier link this engine reads over (see GlobalKVTier)."""
        self.config = config
        self.cost_model = config.cost_model()
        self.block_size = config.block_size
        self.pool = BlockPool(
            config.num_gpu_blocks,
            config.enable_prefix_caching,
            record_events=kv_event_sink is not None,
        )
        self.tier = config.global_tier
        self.tier_link = tier_link
        self._tier_bytes = 0
        self._tier_time = 0.0
        self._tier_wait = 0.0
        self.kv_event_sink = kv_event_sink
        self.fast_forward = fast_forward
        self._t_request = config.calibration.t_request
        self._jitter = (
            StepJitter(config.step_jitter, config.jitter_seed) if config.step_jitter > 0 else None
        )
        self.requests: dict[str, _Request] = {}
        self.running: list[_Request] = []
        self.waiting: deque[_Request] = deque()
        # Disaggregation (enginesim.engine.transfer): remote prefills waiting for room to
        # read into, reads under way, finished prefills holding their blocks for a read.
        self.pulling: deque[_Request] = deque()
        self.transferring: list[_Request] = []
        self.held: dict[str, _Request] = {}
        self.link = LinkQueue(config.kv_link)
        self._kv_token_bytes = config.model.kv_bytes_per_token(config.kv_dtype)
        self._transfer = TransferStats()
        self._next_block_id = 0
        self.landed: list[tuple[str, int, float]] = []  # (id, bytes, s) since take_landed()
        self._dirty: dict[str, _Request] = {}  # requests with undelivered news
        self._eventful: dict[str, _Request] = {}  # ... whose news include a first token/finish
        self._step_ends = np.zeros(1024)
        self._num_steps = 0
        self._free_at = 0.0  # end of the last committed step
        self._last_t = 0.0
        self._counters = dict.fromkeys(
            ("queries", "hits", "external", "preemptions", "prompt", "generation", "finished"), 0
        )
        self._busy_time = 0.0
        # vllm:inter_token_latency_seconds' _sum and _count (tokens sampled so far)
        self._itl_sum = 0.0
        self._itl_count = 0
        self._preempted_this_step = False
        # Bumped by every change of the scheduler's state; keys the memo of the decode plan
        # (next_event_time computes it, the advance that follows needs it again).
        self._version = 0
        self._plan_memo: tuple[int, tuple[np.ndarray, ...] | None] = (-1, None)

    # ----------------------------------------------------------------- public API

    def add_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int] | np.ndarray,
        max_tokens: int,
        now: float,
        ignore_eos: bool = True,
        output_token_ids: Sequence[int] | np.ndarray | None = None,
        hold_kv: bool = False,
        remote_prefill: bool = False,
    ) -> None:
        """Queue a request arriving at ``now``; it generates exactly ``max_tokens`` tokens.

        ``output_token_ids`` (``max_tokens`` of them): the tokens it will generate, when the
        caller knows them (the HTTP server's synthetic text). Their full blocks then enter
        the prefix cache as they are computed, as in vLLM, so a follow-up turn that sends
        the answer back hits on it. Without them only prompt blocks are cached.

        ``hold_kv`` (a prefill for a remote decode): once finished, its blocks stay held
        until :meth:`release_held` or ``kv_hold_timeout``. ``remote_prefill``: the prompt's
        KV (all but its last token) is read from a prefill instance over the link first;
        the blocks are reserved when there is room (given up after ``kv_hold_timeout``).
        """
        prompt = np.asarray(prompt_token_ids, dtype=np.int64)
        self._validate(req_id, prompt, max_tokens)
        tokens = prompt
        if output_token_ids is not None:
            output = np.asarray(output_token_ids, dtype=np.int64)
            if len(output) != max_tokens:
                raise EngineRequestError(
                    f"output_token_ids holds {len(output)} ids; max_tokens is {max_tokens}"
                )
            tokens = np.concatenate([prompt, output])
        now = self._run_until(now)
        ready = now + self._t_request
        if not self.running and not self.waiting:
            self._free_at = max(self._free_at, ready)
        req = _Request(
            req_id,
            prompt,
            max_tokens,
            now,
            ready,
            block_hashes(tokens, self.block_size),
            tokens,
            self.pool.root,
        )
        req.hold_kv = hold_kv
        self.requests[req_id] = req
        if remote_prefill and len(prompt) > 1:
            req.remote_prefill = True
            req.deadline = now + self.config.kv_hold_timeout
            self.pulling.append(req)
        else:
            self.waiting.append(req)
        self._version += 1

    def abort(self, req_id: str, now: float, reason: str = "abort") -> bool:
        """Stop a request at ``now`` (reason "abort" or "error"); False if unknown/finished."""
        now = self._run_until(now)
        req = self.requests.get(req_id)
        if req is None or req.finish_time is not None:
            return False
        self._unqueue(req)
        self._truncate_undelivered(req, now)
        self._finish(req, now, reason)
        self._flush_events()
        self._version += 1
        return True

    def _unqueue(self, req: _Request) -> None:
        for queue in (self.running, self.waiting, self.pulling, self.transferring):
            if req in queue:
                queue.remove(req)
                return

    def release_held(self, req_id: str, now: float) -> bool:
        """The decode instance has read the held blocks of ``req_id``: free them; False if
        it holds none (never held, already released, or expired)."""
        self._run_until(now)
        req = self.held.pop(req_id, None)
        if req is None:
            return False
        self._release(req)
        self._version += 1
        return True

    def held_block_ids(self, req_id: str) -> list[int] | None:
        """The ids of the blocks ``req_id`` holds for a reader (None: it holds none)."""
        req = self.held.get(req_id)
        return None if req is None else list(req.block_ids)

    def held_tokens(self, req_id: str) -> int:
        """Prompt tokens whose KV ``req_id`` holds (0: none)."""
        req = self.held.get(req_id)
        return 0 if req is None else req.prompt_len

    def take_landed(self) -> list[tuple[str, int, float]]:
        """Reads landed since the last call: (request id, bytes, seconds)."""
        landed, self.landed = self.landed, []
        return landed

    def advance_to(
        self, t: float, per_token: bool = False, events_only: bool = False
    ) -> list[RequestOutput]:
        """Simulate every step that starts by ``t``; return outputs of steps ending by ``t``.

        ``events_only``: report only requests that got their first token or finished (their
        ``new_token_count`` still covers every token since their previous output); the
        replay simulator needs nothing else, and skipping the rest keeps calls O(events).
        """
        t = self._run_until(t)
        outputs = []
        candidates = self._eventful if events_only else self._dirty
        for req_id, req in list(candidates.items()):
            if events_only and not self._has_event_by(req, t):
                continue
            out = self._output(req, t, per_token)
            if out is not None:
                outputs.append(out)
            if req.finish_reported:
                self._dirty.pop(req_id, None)
                self._eventful.pop(req_id, None)
                del self.requests[req_id]
            elif req.delivered > 0 and req.finish_time is None:
                self._eventful.pop(req_id, None)
                if req.delivered == req.num_output:
                    self._dirty.pop(req_id, None)
        return outputs

    def next_event_time(self) -> float | None:
        """Time of the next step boundary where a request gets its first token or
        finishes, or where the scheduler could change the batch; None when idle."""
        if self._free_at > self._last_t and self._last_step_has_event():
            return self._free_at
        start = max(self._free_at, self._last_t)
        if not self.running and not self.waiting:
            if self._free_at > self._last_t:
                return self._free_at
            return self._idle_until(start)
        if not self.running and self.waiting[0].ready > start:
            wake = self._idle_until(start)
            return self.waiting[0].ready if wake is None else min(wake, self.waiting[0].ready)
        horizon = self._decode_horizon(start)
        return horizon if horizon is not None else start

    def unscheduled_ids(self) -> set[str]:
        """Requests waiting that the scheduler has never given a token (abort is free)."""
        return {req.req_id for req in self.waiting if req.num_output == 0 and req.num_computed == 0}

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting or self.pulling or self.transferring)

    def reset_prefix_cache(self) -> bool:
        """Clear the prefix cache (emits AllBlocksCleared); refused while blocks are in use."""
        ok = self.pool.reset()
        self._flush_events()
        self._version += 1
        return ok

    def stats(self) -> EngineStats:
        c = self._counters
        return EngineStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_usage=self.pool.usage,
            prefix_cache_queries=c["queries"],
            prefix_cache_hits=c["hits"],
            external_cache_hits=c["external"],
            num_preemptions=c["preemptions"],
            num_gpu_blocks=self.pool.num_blocks,
            block_size=self.block_size,
            prompt_tokens=c["prompt"],
            generation_tokens=c["generation"],
            num_steps=self._num_steps,
            busy_time=self._busy_time,
            num_finished=c["finished"],
            has_tier=self.tier is not None,
            tier_bytes_read=self._tier_bytes,
            tier_read_time=self._tier_time,
            tier_read_wait=self._tier_wait,
            transfer=self._transfer_stats(),
        )

    def itl_totals(self, now: float) -> tuple[float, int]:
        """``vllm:inter_token_latency_seconds``' ``_sum`` and ``_count`` as of ``now``: the
        tokens sampled by the steps started by then (each token after a request's first
        counts the time since the one before, as vLLM observes it). The engine advances
        lazily (a decode-only stretch is run at its end), so the steps of the stretch under
        way that started by ``now`` are counted from its plan, without running them (the
        plan is memoised on the scheduler's state: reading it changes nothing)."""
        total, count = self._itl_sum, self._itl_count
        if not self.fast_forward or self._free_at > now or not self.running:
            return total, count
        plan = self._decode_plan(self._free_at)
        if plan is None:
            return total, count
        ends = plan[0]
        steps = min(int(np.searchsorted(ends[:-1], now, side="right")) + 1, len(ends))
        end = float(ends[steps - 1])
        for req in self.running:
            total += end - req.last_token_end
        return total, count + steps * len(self.running)

    def _transfer_stats(self) -> TransferStats:
        held = self.held.values()
        return replace(
            self._transfer,
            in_flight=len(self.pulling) + len(self.transferring),
            held_requests=len(self.held),
            held_blocks=sum(r.num_blocks for r in held),
        )

    # ----------------------------------------------------------------- validation

    def _validate(self, req_id: str, prompt: np.ndarray, max_tokens: int) -> None:
        cfg = self.config
        if req_id in self.requests:
            raise EngineRequestError(f"duplicate request id {req_id!r}")
        if len(prompt) == 0:
            raise EngineRequestError("prompt must contain at least one token")
        if max_tokens < 1:
            raise EngineRequestError(f"max_tokens must be at least 1, got {max_tokens}")
        total = len(prompt) + max_tokens
        if total > cfg.max_model_len:
            raise EngineRequestError(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"you requested {total} tokens ({len(prompt)} in the messages, "
                f"{max_tokens} in the completion)."
            )
        if -(-total // self.block_size) > cfg.num_gpu_blocks:
            raise EngineRequestError(
                f"request needs {total} tokens of KV cache; the engine holds "
                f"{cfg.kv_capacity_tokens}"
            )

    # ----------------------------------------------------------------- main loop

    def _run_until(self, t: float) -> float:
        t = max(t, self._last_t)
        while self._has_work() and self._free_at <= t:
            if self.fast_forward and self._decode_chunk(self._free_at, t):
                continue
            if not self._step(self._free_at):
                wake = self._idle_until(self._free_at)
                if wake is None or wake > t:
                    break  # idle past t (or nothing schedulable)
                self._free_at = wake  # idle until a request is ready or a read lands
        self._last_t = t
        return t

    def _has_work(self) -> bool:
        return bool(self.running or self.waiting or self.pulling or self.transferring or self.held)

    def _idle_until(self, after: float) -> float | None:
        """The next time an idle engine has something to do: a waiting request ready, a
        read landing, a reservation or a hold timing out; None if never."""
        times = [r.pull_done for r in self.transferring]
        times += [r.deadline for r in self.pulling]
        times += [r.deadline for r in self.held.values()]
        if self.waiting and not self.running:
            times.append(self.waiting[0].ready)
        later = [x for x in times if x > after]
        return min(later) if later else None

    def _step(self, start: float) -> bool:
        scheduled, transfer_time = self._schedule(start)
        if not scheduled:
            return False
        new_tokens = [n for _, n, _ in scheduled]
        contexts = [c for _, _, c in scheduled]
        num_sampled = sum(1 for r, n, c in scheduled if n + c == r.num_tokens)
        batch = StepBatch.from_requests(new_tokens, contexts, num_sampled, transfer_time)
        duration = self.cost_model.step_time(batch)
        if self._jitter is not None:  # the GPU's part varies, the tier transfer does not
            factor = self._jitter.factor(self._num_steps)
            duration = (duration - transfer_time) * factor + transfer_time
        end = start + duration
        step = self._append_step_ends((end,))
        for req, n, _ in scheduled:
            req.num_computed += n
            self._cache_full_blocks(req)
            if req.num_computed == req.num_tokens:
                self._sample(req, step, 1, end)
        self._commit_time(start, end)
        self._flush_events()
        return True

    def _commit_time(self, start: float, end: float) -> None:
        self._busy_time += end - start
        self._free_at = end
        self._version += 1

    # ----------------------------------------------------------------- scheduling

    def _schedule(self, start: float) -> tuple[list[tuple[_Request, int, int]], float]:
        """One vLLM v1 scheduling pass for the step starting at ``start``: running
        requests first, then FCFS admission; also returns the step's tier load time."""
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[_Request, int, int]] = []
        self._preempted_this_step = False
        if self.held or self.pulling or self.transferring:
            self._expire(start)
            self._land(start)
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed, budget)
            if not self._grow_or_preempt(req, num_new):
                break
            scheduled.append((req, num_new, req.num_computed))
            budget -= num_new
            i += 1
        transfer_time = 0.0
        if not self._preempted_this_step:
            if self.pulling:
                self._start_pulls(start)
            transfer_time = self._admit(scheduled, budget, start)
        return scheduled, transfer_time

    def _grow_or_preempt(self, req: _Request, num_new: int) -> bool:
        """Allocate blocks for ``num_new`` more tokens of ``req``, preempting the newest
        running requests while blocks are short; False if ``req`` itself was preempted."""
        need = -(-(req.num_computed + num_new) // self.block_size) - req.num_blocks
        if need <= 0:
            return True
        while not self.pool.allocate(need):
            victim = self.running.pop()
            self._preempt(victim)
            self._preempted_this_step = True
            if victim is req:
                return False
        req.num_private += need
        return True

    def _admit(
        self, scheduled: list[tuple[_Request, int, int]], budget: int, start: float
    ) -> float:
        tier_blocks = 0
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.ready > start:
                break
            local, unreferenced, external = self._lookup(req)
            computed = (local + external) * self.block_size
            num_new = min(req.num_tokens - computed, budget)
            need = -(-(computed + num_new) // self.block_size) - local
            if need + unreferenced > self.pool.num_free:
                break
            req.tip = self.pool.acquire(req.hashes, local)
            self.pool.allocate(need)
            req.num_private = need
            req.num_checked_blocks = local
            req.num_computed = computed
            if external:
                self._load_from_tier(req, local, external)
                tier_blocks += external
            self._count_admission(req, local, external)
            self.waiting.popleft()
            self.running.append(req)
            scheduled.append((req, num_new, computed))
            budget -= num_new
        return self._read_tier(start, tier_blocks) if tier_blocks else 0.0

    # ----------------------------------------------------------------- KV transfer

    def _hold(self, req: _Request, when: float) -> None:
        """A finished prefill keeps its blocks for the decode instance's read."""
        req.deadline = when + self.config.kv_hold_timeout
        first = self._next_block_id
        self._next_block_id += req.num_blocks
        req.block_ids = list(range(first, first + req.num_blocks))
        self.held[req.req_id] = req

    def _expire(self, now: float) -> None:
        """Free holds never read, give up reservations never made, by their deadline."""
        for req_id in [k for k, r in self.held.items() if r.deadline <= now]:
            self._release(self.held.pop(req_id))
            self._transfer.expired += 1
            self._version += 1
        for req in [r for r in self.pulling if r.deadline <= now]:
            self.pulling.remove(req)
            self._transfer.failed += 1
            self._finish(req, req.deadline, "error")
            self._version += 1

    def _start_pulls(self, start: float) -> None:
        """Reserve blocks for remote prefills, in order, while there is room, and queue
        their reads on the link."""
        while self.pulling and len(self.running) + len(self.transferring) < (
            self.config.max_num_seqs
        ):
            req = self.pulling[0]
            local, unreferenced, _ = self._lookup(req)
            remote = req.num_tokens - 1  # the prompt's last token is computed here
            need = -(-remote // self.block_size) - local
            if need + unreferenced > self.pool.num_free:
                return
            self.pulling.popleft()
            req.tip = self.pool.acquire(req.hashes, local)
            self.pool.allocate(need)
            req.num_private = need
            req.num_checked_blocks = local
            req.pull_bytes = (remote - local * self.block_size) * self._kv_token_bytes
            req.pull_started = start
            req.pull_done = self.link.read(start, req.pull_bytes)
            self._count_admission(req, local, 0)
            req.num_cached_tokens = remote
            self.transferring.append(req)
            self._version += 1

    def _land(self, start: float) -> None:
        """Reads landed by ``start``: their requests join the running batch."""
        for req in [r for r in self.transferring if r.pull_done <= start]:
            self.transferring.remove(req)
            req.num_computed = req.num_tokens - 1
            pulled = req.num_computed - req.num_checked_blocks * self.block_size
            self._counters["external"] += pulled
            self._cache_full_blocks(req)
            self.running.append(req)
            stats = self._transfer
            stats.transfers += 1
            stats.bytes += req.pull_bytes
            stats.seconds += req.pull_done - req.pull_started
            self.landed.append((req.req_id, req.pull_bytes, req.pull_done - req.pull_started))
            self._version += 1

    def _lookup(self, req: _Request) -> tuple[int, int, int]:
        """Blocks of ``req`` cached locally (and how many of those are unreferenced)
        and, after those, in the global tier."""
        max_blocks = min(len(req.hashes), (req.num_tokens - 1) // self.block_size)
        local, unreferenced = self.pool.match(req.hashes, max_blocks)
        external = 0
        if self.tier is not None:
            external = self.tier.count_prefix(req.hashes, local, max_blocks)
        return local, unreferenced, external

    def _can_admit_head(self, free_budget: int) -> bool:
        """Read-only: could the head of the waiting queue be admitted now? (Ready or not:
        a decode stretch must not be fast-forwarded past the step it becomes ready for.)"""
        if not self.waiting or free_budget <= 0 or len(self.running) >= self.config.max_num_seqs:
            return False
        req = self.waiting[0]
        local, unreferenced, external = self._lookup(req)
        computed = (local + external) * self.block_size
        num_new = min(req.num_tokens - computed, free_budget)
        need = -(-(computed + num_new) // self.block_size) - local
        return need + unreferenced <= self.pool.num_free

    def _load_from_tier(self, req: _Request, local: int, external: int) -> None:
        hashes = req.hashes[local : local + external]
        assert self.tier is not None, "external blocks come only from a tier"
        self.tier.touch(hashes)
        self._cache_blocks(req, local + external)

    def _read_tier(self, start: float, blocks: int) -> float:
        """One read of the step's tier blocks over this engine's link, at the step's
        start; the step (it loads synchronously, before its forward pass) takes the
        queueing and the transfer on top of its compute."""
        num_bytes = blocks * self.config.block_bytes
        assert self.tier is not None, "tier blocks come only from a tier"
        wait, transfer = self.tier.read(start, num_bytes, self.tier_link)
        self._tier_bytes += num_bytes
        self._tier_time += wait + transfer
        self._tier_wait += wait
        return wait + transfer

    def _count_admission(self, req: _Request, local: int, external: int) -> None:
        c = self._counters
        c["queries"] += req.num_tokens
        c["hits"] += local * self.block_size
        c["external"] += external * self.block_size
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = (local + external) * self.block_size
            req.num_tier_tokens = external * self.block_size

    def _preempt(self, req: _Request) -> None:
        self._release(req)
        req.num_computed = 0
        req.num_checked_blocks = 0
        self.waiting.appendleft(req)
        self._counters["preemptions"] += 1
        self._version += 1

    def _release(self, req: _Request) -> None:
        self.pool.release(req.tip, req.num_private)
        req.tip, req.num_private = self.pool.root, 0

    # ----------------------------------------------------------------- prefix cache

    def _cache_full_blocks(self, req: _Request) -> None:
        full = min(req.num_computed // self.block_size, len(req.hashes))
        if full > req.num_checked_blocks:
            self._cache_blocks(req, full)

    def _cache_blocks(self, req: _Request, upto: int) -> None:
        """Enter prompt blocks [num_checked_blocks, upto) into the prefix cache."""
        if self.tier is not None:
            for h in req.hashes[req.num_checked_blocks : upto]:
                self.tier.store(h)
        req.num_checked_blocks = upto
        req.tip, duplicates, stored = self.pool.extend(req.tip, req.hashes, upto)
        req.num_private -= duplicates + len(stored)
        if stored and self.kv_event_sink is not None:
            self._emit_stored(req, upto - len(stored), upto, stored)

    def _emit_stored(self, req: _Request, first: int, upto: int, stored: list[int]) -> None:
        bs = self.block_size
        parent = req.hashes[first - 1] if first > 0 else None
        tokens = req.tokens[first * bs : upto * bs].tolist()
        self.pool.events.append(BlockStored(tuple(stored), parent, tuple(tokens), bs))

    def _flush_events(self) -> None:
        events = self.pool.take_events()
        if events and self.kv_event_sink is not None:
            self.kv_event_sink(events)

    # ----------------------------------------------------------------- decode fast path

    def _decode_state(self) -> tuple[np.ndarray, ...] | None:
        """Per-request arrays if the next step is decode-only and needs no preemption."""
        running = self.running
        n = len(running)
        if n == 0 or n > self.config.max_num_batched_tokens:
            return None
        if self.pulling or self.transferring or (self.held and self.waiting):
            return None  # a read lands, a reservation or a hold times out: step by step
        for r in running:
            if r.num_computed != r.num_tokens - 1:
                return None
        if self._can_admit_head(self.config.max_num_batched_tokens - n):
            return None
        columns = np.array(
            [
                (r.num_computed, r.max_tokens - r.num_output, r.num_held + r.num_private)
                for r in running
            ],
            dtype=np.int64,
        )
        computed, remaining, blocks = columns.T
        return computed, remaining, blocks

    def _block_limited_steps(self, computed: np.ndarray, blocks: np.ndarray, limit: int) -> int:
        """Largest K <= limit such that K decode steps fit in the free blocks."""
        first_need = blocks * self.block_size - computed  # step index of the first new block
        free = self.pool.num_free

        def demand(k: int) -> int:  # blocks needed by steps 0..k
            over = k - first_need
            return int(np.sum(np.where(over >= 0, over // self.block_size + 1, 0)))

        if demand(limit - 1) <= free:
            return limit
        lo, hi = 0, limit - 1  # feasible(lo) holds; feasible(hi + 1) fails
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if demand(mid - 1) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _decode_plan(self, start: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Step end times of the decode-only stretch from ``start``, with the running
        requests' computed tokens and blocks; None if the next step is not decode-only."""
        version, plan = self._plan_memo
        if version != self._version:
            plan = self._relative_decode_plan()
            self._plan_memo = (self._version, plan)
        if plan is None:
            return None
        offsets, computed, blocks = plan
        return start + offsets, computed, blocks

    def _relative_decode_plan(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        state = self._decode_state()
        if state is None:
            return None
        computed, remaining, blocks = state
        limit = int(min(remaining.min(), MAX_CHUNK_STEPS))
        steps = self._block_limited_steps(computed, blocks, limit)
        if steps == 0:
            return None
        times = self.cost_model.decode_step_times(len(computed), int(computed.sum()), steps)
        if self._jitter is not None:  # the stretch's steps are numbered from _num_steps
            times = times * self._jitter.factors(self._num_steps, steps)
        return np.cumsum(times), computed, blocks

    def _decode_horizon(self, start: float) -> float | None:
        """End of the decode-only stretch from ``start`` (first finish or block shortage)."""
        plan = self._decode_plan(start)
        return None if plan is None else float(plan[0][-1])

    def _decode_chunk(self, start: float, t: float) -> bool:
        plan = self._decode_plan(start)
        if plan is None:
            return False
        ends, computed, blocks = plan
        starts_le_t = np.searchsorted(ends[:-1], t, side="right") + 1  # step 0 starts at start
        m = min(int(starts_le_t), len(ends))
        ends = ends[:m]
        need = -(-(computed + m) // self.block_size) - blocks
        self.pool.allocate(int(need.sum()))
        first_step = self._append_step_ends(ends)
        end = float(ends[-1])
        for req, extra in zip(list(self.running), need.tolist(), strict=True):
            req.num_private += extra
            req.num_computed += m
            if req.num_checked_blocks < len(req.hashes):  # known output blocks to cache
                self._cache_full_blocks(req)
            self._sample(req, first_step, m, end)
        self._commit_time(start, end)
        self._flush_events()
        return True

    # ----------------------------------------------------------------- outputs

    def _append_step_ends(self, ends: np.ndarray | tuple[float]) -> int:
        first = self._num_steps
        needed = first + len(ends)
        if needed > len(self._step_ends):
            grown = np.zeros(max(needed, 2 * len(self._step_ends)))
            grown[:first] = self._step_ends[:first]
            self._step_ends = grown
        self._step_ends[first:needed] = ends
        self._num_steps = needed
        return first

    def _sample(self, req: _Request, first_step: int, count: int, last_end: float) -> None:
        """Record ``count`` tokens sampled at global steps first_step.. for ``req``."""
        if req.runs and req.runs[-1][0] + req.runs[-1][1] == first_step:
            req.runs[-1][1] += count
        else:
            req.runs.append([first_step, count])
        if req.first_token_time is None:
            req.first_token_time = float(self._step_ends[first_step])
            self._counters["prompt"] += req.prompt_len
            self._eventful[req.req_id] = req
            # vLLM's inter-token latency: each token after the first, the time since the
            # one before; over consecutive tokens the sum telescopes to last - previous.
            self._itl_sum += last_end - req.first_token_time
            self._itl_count += count - 1
        else:
            self._itl_sum += last_end - req.last_token_end
            self._itl_count += count
        req.last_token_end = last_end
        req.num_output += count
        req.num_tokens += count
        self._counters["generation"] += count
        self._dirty[req.req_id] = req
        if req.num_output >= req.max_tokens:
            self.running.remove(req)
            self._finish(req, last_end, "length")

    def _finish(self, req: _Request, when: float, reason: str) -> None:
        if req.hold_kv and reason == "length" and req.num_blocks:
            self._hold(req, when)
        else:
            self._release(req)
        req.finish_time = when
        req.finish_reason = reason
        self._counters["finished"] += 1
        self._dirty[req.req_id] = req
        self._eventful[req.req_id] = req

    def _last_step_has_event(self) -> bool:
        end = self._free_at
        return any(
            (r.finish_time == end and not r.finish_reported)
            or (r.first_token_time == end and r.delivered == 0)
            for r in self._eventful.values()
        )

    def _has_event_by(self, req: _Request, t: float) -> bool:
        if req.finish_time is not None and req.finish_time <= t:
            return True
        return req.delivered == 0 and req.first_token_time is not None and req.first_token_time <= t

    def _token_count_by(self, req: _Request, t: float) -> int:
        """Tokens of ``req`` whose step ended by ``t`` (only the last step can end later)."""
        last = self._num_steps - 1
        if req.runs and req.runs[-1][0] + req.runs[-1][1] - 1 == last and self._step_ends[last] > t:
            return req.num_output - 1
        return req.num_output

    def _token_times(self, req: _Request, lo: int, hi: int) -> np.ndarray:
        steps = np.concatenate([np.arange(s, s + c) for s, c in req.runs])
        return self._step_ends[steps[lo:hi]]

    def _token_time(self, req: _Request, index: int) -> float:
        for start, count in req.runs:
            if index < count:
                return float(self._step_ends[start + index])
            index -= count
        raise IndexError(index)

    def _truncate_undelivered(self, req: _Request, now: float) -> None:
        keep = self._token_count_by(req, now)
        if keep < req.num_output:
            req.runs[-1][1] -= 1
            if req.runs[-1][1] == 0:
                req.runs.pop()
            req.num_output = keep
            req.num_tokens = req.prompt_len + keep
            if keep == 0:
                req.first_token_time = None

    def _output(self, req: _Request, t: float, per_token: bool) -> RequestOutput | None:
        count = self._token_count_by(req, t)
        finished = req.finish_time is not None and req.finish_time <= t
        new = count - req.delivered
        if new <= 0 and not (finished and not req.finish_reported):
            return None
        times = self._token_times(req, req.delivered, count) if per_token and new > 0 else None
        last_time = self._token_time(req, count - 1) if count else None
        req.delivered = count
        req.finish_reported = finished
        first = req.first_token_time if count else None
        return RequestOutput(
            req_id=req.req_id,
            new_token_count=max(new, 0),
            num_output_tokens=count,
            first_token_time=first,
            finished=finished,
            finish_reason=req.finish_reason if finished else None,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            arrival_time=req.arrival,
            prompt_tokens=req.prompt_len,
            finish_time=req.finish_time if finished else None,
            last_token_time=last_time,
            token_times=times,
            num_tier_tokens=req.num_tier_tokens,
        )
