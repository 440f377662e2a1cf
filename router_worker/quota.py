"""Tenant quotas held together by a cluster's routers, through one atomic Redis script.

Each check runs :data:`QUOTA_SCRIPT` (a Lua script: Redis runs it atomically, so two
routers cannot both take the last request of a minute): it reads the tenant's counts in
the current minute window and budget period (the windows of
:class:`router_worker.routing.quota.QuotaCheck`, aligned to the epoch so every router
agrees), refuses if the request would pass a limit, else adds it. A request's output
tokens are added at its end (fire and forget). A request refused after it passed (shed,
queue full, evicted, timed out, an error before it was served) is given its charge back
by the same script (``refund``), in the windows it was charged in, whichever router
refunds: the counts are sums, so takes and refunds of several routers commute.

**When Redis blips.** Every router also keeps its own count
(:class:`~router_worker.routing.quota.QuotaLedger`, charged with every request it lets
through, whoever decided). A check that fails or takes longer than :data:`TIMEOUT_S` is
decided by that count alone, and Redis is left alone for :data:`RETRY_S` (no request pays
a timeout during an outage). The overshoot is bounded: while Redis is unreachable, each of
the cluster's N routers admits at most one limit's worth of the tenant's requests (and
tokens) per window, so the tenant gets at most N × its limit in a window Redis misses;
once Redis answers again, its own counts apply (the requests the routers admitted alone
are not in them: the window after an outage may admit up to one limit more). A refund
Redis misses leaves its charge there (the conservative side).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from router_worker.routing.flow import Refusal, TenantSettings
from router_worker.routing.quota import (
    MINUTE,
    QuotaCharge,
    QuotaCheck,
    QuotaLedger,
    over_quota,
    retry_after,
)

log = logging.getLogger("router_worker.quota")

TIMEOUT_S = 0.25
RETRY_S = 2.0
WHICH = {1: "rpm", 2: "tpm", 3: "budget"}

# KEYS[1]: the minute window's hash (r: requests, t: tokens); KEYS[2]: the budget period's
# counter. ARGV: rpm, tpm, budget (0: none), tokens, minute TTL, period TTL, take|add|refund.
# Returns 0 when counted, else 1 (rpm), 2 (tpm) or 3 (budget) and counts nothing. A refund
# takes one request and its tokens off (never below 0, never recreating an expired key).
QUOTA_SCRIPT = """
local rpm, tpm, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens = tonumber(ARGV[4])
if ARGV[7] == 'refund' then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    local r = redis.call('HINCRBY', KEYS[1], 'r', -1)
    if r < 0 then redis.call('HINCRBY', KEYS[1], 'r', -r) end
    local t = redis.call('HINCRBY', KEYS[1], 't', -tokens)
    if t < 0 then redis.call('HINCRBY', KEYS[1], 't', -t) end
  end
  if redis.call('EXISTS', KEYS[2]) == 1 then
    local spent = redis.call('DECRBY', KEYS[2], tokens)
    if spent < 0 then redis.call('INCRBY', KEYS[2], -spent) end
  end
  return 0
end
if ARGV[7] == 'take' then
  local requests = tonumber(redis.call('HGET', KEYS[1], 'r') or '0')
  local used = tonumber(redis.call('HGET', KEYS[1], 't') or '0')
  local spent = tonumber(redis.call('GET', KEYS[2]) or '0')
  if rpm > 0 and requests + 1 > rpm then return 1 end
  if tpm > 0 and used + tokens > tpm then return 2 end
  if budget > 0 and spent + tokens > budget then return 3 end
  redis.call('HINCRBY', KEYS[1], 'r', 1)
end
redis.call('HINCRBY', KEYS[1], 't', tokens)
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('INCRBY', KEYS[2], tokens)
redis.call('EXPIRE', KEYS[2], ARGV[6])
return 0
"""


def quota_keys(cluster: str, tenant: str, check: QuotaCheck) -> list[str]:
    base = f"switchyard:quota:{cluster}:{tenant}"
    return [f"{base}:m:{check.minute}", f"{base}:b:{check.period_s}:{check.period}"]


class SharedQuota:
    """The cluster-wide quota check of one router (local only without a Redis URL)."""

    def __init__(self, redis_url: str | None, cluster: str = "default") -> None:
        self.redis_url = redis_url
        self.cluster = cluster
        self.local = QuotaLedger()
        self._redis: Any = None
        self._script: Any = None
        self._skip_until = 0.0
        self._pending: set[asyncio.Task[None]] = set()
        self.fallbacks = 0  # checks decided locally because Redis failed

    async def take(
        self, settings: TenantSettings, tokens: int, now: float
    ) -> QuotaCharge | Refusal | None:
        """Charge one request of ``tokens`` prompt tokens (its charge, for a refund), or
        refuse it (429); None: the tenant has no limits."""
        check = QuotaCheck.of(settings, now)
        if not check.limited:
            return None
        if self.redis_url is not None and time.monotonic() >= self._skip_until:
            try:
                code = await asyncio.wait_for(
                    self._run(settings.name, check, tokens, "take"), TIMEOUT_S
                )
            except Exception as error:
                self._failed(error)
            else:
                which = WHICH.get(int(code))
                if which is not None:
                    return over_quota(settings.name, which, retry_after(check, which, now))
                self.local.charge(settings.name, check, tokens)
                return QuotaCharge(settings.name, check, tokens, shared=True)
        refusal = self.local.take(settings, tokens, now)
        return refusal or QuotaCharge(settings.name, check, tokens)

    async def refund(self, charge: QuotaCharge) -> None:
        """Give a refused request's charge back: locally, and in Redis if it was counted
        there (bounded by :data:`TIMEOUT_S`; a failed refund leaves the charge, the
        conservative side)."""
        self.local.refund(charge)
        if charge.shared and self.redis_url is not None:
            await self._refund_shared(charge)

    def refund_soon(self, charge: QuotaCharge) -> None:
        """:meth:`refund` without waiting (from a synchronous caller)."""
        self.local.refund(charge)
        if charge.shared and self.redis_url is not None:
            self._spawn(self._refund_shared(charge))

    async def _refund_shared(self, charge: QuotaCharge) -> None:
        if time.monotonic() < self._skip_until:
            return  # Redis is out: its charge stays (the conservative side)
        try:
            await asyncio.wait_for(
                self._run(charge.tenant, charge.check, charge.tokens, "refund"), TIMEOUT_S
            )
        except Exception as error:
            self._failed(error)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def add_tokens(self, settings: TenantSettings, tokens: int, now: float) -> None:
        """Charge a request's output tokens at its end (in Redis without waiting)."""
        self.local.add_tokens(settings, tokens, now)
        check = QuotaCheck.of(settings, now)
        if not check.limited or not tokens or self.redis_url is None:
            return
        if time.monotonic() < self._skip_until:
            return
        self._spawn(self._add(settings.name, check, tokens))

    async def _add(self, tenant: str, check: QuotaCheck, tokens: int) -> None:
        try:
            await asyncio.wait_for(self._run(tenant, check, tokens, "add"), 1.0)
        except Exception as error:
            self._failed(error)

    async def _run(self, tenant: str, check: QuotaCheck, tokens: int, mode: str) -> Any:
        if self._script is None:
            import redis.asyncio as aioredis

            assert self.redis_url is not None
            self._redis = aioredis.Redis.from_url(
                self.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5
            )
            self._script = self._redis.register_script(QUOTA_SCRIPT)
        args = (
            check.requests_per_minute,
            check.tokens_per_minute,
            check.token_budget,
            tokens,
            int(2 * MINUTE),
            check.period_s + 60,
            mode,
        )
        return await self._script(keys=quota_keys(self.cluster, tenant, check), args=args)

    def _failed(self, error: BaseException) -> None:
        if time.monotonic() >= self._skip_until:
            log.warning("quota: Redis unavailable (%r); counting locally", error)
        self.fallbacks += 1
        self._skip_until = time.monotonic() + RETRY_S

    async def settle(self) -> None:
        """Wait for the charges and refunds sent without waiting."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
