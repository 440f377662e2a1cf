"""Tenant quotas: requests and tokens a minute, tokens per budget period.

Fixed windows aligned to the epoch (a minute window starts at a multiple of 60 s, a budget
period at a multiple of its length), so several routers counting in one place (Redis, see
:mod:`router_worker.quota`) agree on which window a request falls in. This is the counter
one router keeps on its own: the replay simulator's, and the live router's while Redis is
unreachable. Pure: ``now`` is passed in.

A request is charged its prompt tokens when it passes the quota (:meth:`QuotaLedger.take`)
and its output tokens when it ends (:meth:`QuotaLedger.add_tokens`): a request that would
take its tenant over a limit is refused with 429 and a ``Retry-After`` until the window
turns. A request refused after it passed the quota (shed, a full queue, evicted, timed out,
an error before it was served) is given its charge back (:meth:`QuotaLedger.refund`, in
the windows it was charged in): only requests served count against a quota.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from router_worker.routing.flow import BUDGET_PERIODS, Refusal, TenantSettings

MINUTE = 60.0


@dataclass(frozen=True, slots=True)
class QuotaCheck:
    """One check, as both the local ledger and the Redis script run it: the windows it
    counts in and the limits (0: none)."""

    minute: int  # index of the minute window
    period: int  # index of the budget period
    period_s: int
    requests_per_minute: int
    tokens_per_minute: int
    token_budget: int

    @classmethod
    def of(cls, settings: TenantSettings, now: float) -> QuotaCheck:
        period_s = BUDGET_PERIODS[settings.budget_period]
        return cls(
            int(now // MINUTE),
            int(now // period_s),
            period_s,
            settings.requests_per_minute or 0,
            settings.tokens_per_minute or 0,
            settings.token_budget or 0,
        )

    @property
    def limited(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute or self.token_budget)


@dataclass(frozen=True, slots=True)
class QuotaCharge:
    """What one request was charged, in which windows: what a refund gives back.
    ``shared``: counted in Redis too (:mod:`router_worker.quota`), not only locally."""

    tenant: str
    check: QuotaCheck
    tokens: int
    shared: bool = False

    @classmethod
    def of(
        cls, settings: TenantSettings, tokens: int, now: float, shared: bool = False
    ) -> QuotaCharge:
        return cls(settings.name, QuotaCheck.of(settings, now), tokens, shared)


def over_quota(tenant: str, which: str, retry_after_s: float) -> Refusal:
    """The 429 for ``tenant`` over its ``which`` limit (rpm, tpm, budget)."""
    words = {
        "rpm": "request rate",
        "tpm": "token rate",
        "budget": "token budget",
    }
    return Refusal(
        429,
        max(1, math.ceil(retry_after_s)),
        "quota",
        f"Tenant {tenant!r} is over its {words[which]}; retry later.",
    )


def retry_after(check: QuotaCheck, which: str, now: float) -> float:
    """Seconds until the window of limit ``which`` turns."""
    if which == "budget":
        return (check.period + 1) * check.period_s - now
    return (check.minute + 1) * MINUTE - now


@dataclass(slots=True)
class _Counts:
    minute: int = -1
    requests: int = 0
    tokens: int = 0
    period: int = -1
    period_s: int = 0
    budget_used: int = 0


class QuotaLedger:
    """One router's own count of each tenant's use, in the shared windows."""

    def __init__(self) -> None:
        self._counts: dict[str, _Counts] = {}

    def take(self, settings: TenantSettings, tokens: int, now: float) -> Refusal | None:
        """Charge one request of ``tokens`` prompt tokens, or refuse it (429) and charge
        nothing."""
        check = QuotaCheck.of(settings, now)
        if not check.limited:
            return None
        counts = self._current(settings.name, check)
        which = None
        if check.requests_per_minute and counts.requests + 1 > check.requests_per_minute:
            which = "rpm"
        elif check.tokens_per_minute and counts.tokens + tokens > check.tokens_per_minute:
            which = "tpm"
        elif check.token_budget and counts.budget_used + tokens > check.token_budget:
            which = "budget"
        if which is not None:
            return over_quota(settings.name, which, retry_after(check, which, now))
        self.charge(settings.name, check, tokens)
        return None

    def charge(self, tenant: str, check: QuotaCheck, tokens: int) -> None:
        """Count one request of ``tokens`` without checking (one another counter let in)."""
        counts = self._current(tenant, check)
        if counts.minute == check.minute:  # else a window already past here
            counts.requests += 1
            counts.tokens += tokens
        if (counts.period, counts.period_s) == (check.period, check.period_s):
            counts.budget_used += tokens

    def refund(self, charge: QuotaCharge) -> None:
        """Give a refused request's charge back, in the windows it was charged in (a
        window since turned has nothing left to give back)."""
        counts = self._counts.get(charge.tenant)
        if counts is None or not charge.check.limited:
            return
        if counts.minute == charge.check.minute:
            counts.requests = max(0, counts.requests - 1)
            counts.tokens = max(0, counts.tokens - charge.tokens)
        if (counts.period, counts.period_s) == (charge.check.period, charge.check.period_s):
            counts.budget_used = max(0, counts.budget_used - charge.tokens)

    def add_tokens(self, settings: TenantSettings, tokens: int, now: float) -> None:
        """Charge ``tokens`` more (a request's output, at its end)."""
        check = QuotaCheck.of(settings, now)
        if not check.limited:
            return
        counts = self._current(settings.name, check)
        if counts.minute == check.minute:
            counts.tokens += tokens
        if (counts.period, counts.period_s) == (check.period, check.period_s):
            counts.budget_used += tokens

    def _current(self, tenant: str, check: QuotaCheck) -> _Counts:
        counts = self._counts.setdefault(tenant, _Counts())
        # Forward only: a check of a window already past (taken before an await, or the
        # clock stepped back) does not reset the current one.
        if counts.minute < check.minute:
            counts.minute, counts.requests, counts.tokens = check.minute, 0, 0
        if counts.period < check.period or counts.period_s != check.period_s:
            counts.period, counts.period_s, counts.budget_used = check.period, check.period_s, 0
        return counts
