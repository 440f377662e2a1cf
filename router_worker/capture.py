"""Traffic capture: every finished request, recorded the way a replay needs it.

While the router's config carries a ``capture`` (the control plane starts and stops one
per cluster), :meth:`CaptureBuffer.add` keeps, for each finished request, a tuple of what
the request path already holds (its features, the instance, its arm, TTFT/TPOT): an
append, no hashing, no copy; the config version it was routed under comes with the
capture's spec (:attr:`CaptureSpec.config_version`). The telemetry writer drains the buffer
off the request path (:meth:`CaptureBuffer.drain`) to the cluster's capture stream
(:func:`router_worker.contract.telemetry.capture_stream`): the prompt as keyed digests of
its block hashes and the session key as a keyed digest, both under the capture's salt
(:class:`~router_worker.contract.capture.CaptureKey`), so no prompt's fingerprint leaves
the router: ids are equal exactly when the prefixes are within one capture, yet no content
can be guessed from a stream entry, a quarantined one, a stored row or a downloaded trace
(a dictionary of known prompts' hashes is useless without the salt). Digesting in the
writer keeps it off the request path: a thousand blocks of a unique long prompt cost about
a millisecond (``python -m bench.router_overhead.run --only capture``).

Everything is bounded in bytes as well as in requests: a prompt sends at most
`contract.MAX_CAPTURE_BLOCKS` blocks (its first ones; its token count stays whole), a
stream entry at most `contract.CAPTURE_BATCH` requests and `contract.CAPTURE_BATCH_BLOCKS`
blocks, and while Redis is unreachable the buffer keeps the newest `CAPTURE_BUFFER`
requests holding at most `CAPTURE_BUFFER_BLOCKS` blocks, counting the ones it drops
(``dropped``).
"""

from __future__ import annotations

import uuid
from collections import deque
from typing import NamedTuple

from router_worker.contract import telemetry as contract
from router_worker.contract.capture import CaptureKey
from router_worker.contract.config import CaptureSpec
from router_worker.routing.features import RequestFeatures

CAPTURE_BUFFER = 50_000
CAPTURE_BUFFER_BLOCKS = 2_000_000  # ~16 MiB packed: 30 prompts of a million tokens


class _Finished(NamedTuple):
    capture: CaptureSpec
    features: RequestFeatures
    output_tokens: int
    instance: str
    arm: str
    status: int
    ttft_s: float | None
    tpot_s: float | None


class CaptureBuffer:
    """Finished requests of the capture in progress, until the telemetry writer ships them."""

    def __init__(self) -> None:
        self._pending: deque[_Finished] = deque()
        self._keys: dict[int, CaptureKey] = {}
        self._blocks = 0  # the pending requests' blocks, as they will be sent
        self.dropped = 0

    def add(
        self,
        capture: CaptureSpec,
        features: RequestFeatures,
        *,
        output_tokens: int,
        instance: str,
        arm: str,
        status: int,
        ttft_s: float | None,
        tpot_s: float | None,
    ) -> None:
        """On the request path: an append (the oldest are dropped while the buffer is full,
        in requests or in blocks)."""
        blocks = _blocks(features)
        while self._pending and (
            len(self._pending) >= CAPTURE_BUFFER or self._blocks + blocks > CAPTURE_BUFFER_BLOCKS
        ):
            self._blocks -= _blocks(self._pending.popleft().features)
            self.dropped += 1
        self._blocks += blocks
        self._pending.append(
            _Finished(capture, features, output_tokens, instance, arm, status, ttft_s, tpot_s)
        )

    def clear(self) -> None:
        """Forget what is buffered (a router without Redis has nowhere to send it)."""
        self._pending.clear()
        self._blocks = 0

    def __len__(self) -> int:
        return len(self._pending)

    def drain(
        self, cluster: str, router: str, max_model_len: int | None = None
    ) -> list[contract.CaptureBatch]:
        """Take every buffered request out, as batches of at most `CAPTURE_BATCH` requests
        and `CAPTURE_BATCH_BLOCKS` blocks per capture (a config change mid-way leaves
        requests of two captures)."""
        batches: list[contract.CaptureBatch] = []
        current: contract.CaptureBatch | None = None
        blocks = 0
        while self._pending:
            item = self._pending.popleft()
            size = _blocks(item.features)
            self._blocks -= size
            if (
                current is None
                or current.capture != item.capture.id
                or len(current.requests) >= contract.CAPTURE_BATCH
                or blocks + size > contract.CAPTURE_BATCH_BLOCKS
            ):
                current = contract.CaptureBatch(
                    id=uuid.uuid4().hex,
                    cluster=cluster,
                    router=router,
                    capture=item.capture.id,
                    requests=[],
                    max_model_len=max_model_len,
                    keyed=True,
                )
                batches.append(current)
                blocks = 0
            current.requests.append(self._record(item))
            blocks += size
        self._blocks = 0
        return batches

    def _record(self, item: _Finished) -> contract.CaptureRecord:
        key = self._keys.get(item.capture.id)
        if key is None or key.key != item.capture.salt.encode()[:64]:
            key = CaptureKey(item.capture.salt)
            self._keys = {item.capture.id: key}  # one capture at a time
        features = item.features
        return contract.CaptureRecord(
            at=features.arrival_time,
            prompt_tokens=features.prompt_tokens,
            output_tokens=item.output_tokens,
            block_size=features.block_size,
            block_hashes=contract.encode_block_hashes(
                key.block_ids(features.block_hashes[: contract.MAX_CAPTURE_BLOCKS])
            ),
            session=key.session(features.session_key),
            turn=features.turn_index,
            tenant=key.tenant(features.tenant),
            priority=features.priority,
            instance=item.instance,
            arm=item.arm,
            config_version=item.capture.config_version,
            status=item.status,
            ttft_s=item.ttft_s,
            tpot_s=item.tpot_s,
        )


def _blocks(features: RequestFeatures) -> int:
    """The blocks a request sends (its first `MAX_CAPTURE_BLOCKS`)."""
    return min(len(features.block_hashes), contract.MAX_CAPTURE_BLOCKS)
