"""Traffic capture: every finished request, recorded the way a replay needs it.

While the router's config carries a ``capture`` (the control plane starts and stops one
per cluster), :meth:`CaptureBuffer.add` keeps, for each finished request, a tuple of what
the request path already holds (its features, the instance, TTFT/TPOT): an append, no
hashing, no copy. The telemetry writer drains the buffer off the request path
(:meth:`CaptureBuffer.drain`): it turns each prompt's chained block hashes and its session
key into keyed digests under the capture's salt, so ids are equal exactly when the
prefixes are within one capture, yet no content can be guessed from them (a dictionary of
known prompts' hashes is useless without the salt), and ships them to the cluster's
capture stream (:func:`router_worker.telemetry_contract.capture_stream`).

The buffer is bounded: while Redis is unreachable it keeps the newest `CAPTURE_BUFFER`
requests and counts the ones it drops (``dropped``), which the capture's page shows.
"""

from __future__ import annotations

import uuid
from collections import deque
from hashlib import blake2b
from typing import NamedTuple

from router_worker import telemetry_contract as contract
from router_worker.config import CaptureSpec
from router_worker.routing.features import RequestFeatures

CAPTURE_BUFFER = 50_000
DIGEST_CACHE = 200_000  # block hash -> digest, per capture: shared prefixes repeat
_ID_MASK = (1 << 63) - 1  # trace ids are signed 64-bit in every reader


class _Finished(NamedTuple):
    capture: CaptureSpec
    features: RequestFeatures
    output_tokens: int
    instance: str
    arm: str
    status: int
    ttft_s: float | None
    tpot_s: float | None


class _Salted:
    """Keyed digests under one capture's salt, the block hashes' cached."""

    def __init__(self, salt: str) -> None:
        self.key = salt.encode()[:64]  # blake2b's key is at most 64 bytes
        self.blocks: dict[int, int] = {}

    def digest(self, data: bytes) -> bytes:
        return blake2b(data, key=self.key, digest_size=8).digest()

    def block_ids(self, hashes: tuple[int, ...]) -> list[int]:
        blocks = self.blocks
        if len(blocks) > DIGEST_CACHE:
            blocks.clear()
        out = []
        for value in hashes:
            salted = blocks.get(value)
            if salted is None:
                raw = self.digest(value.to_bytes(8, "little"))
                salted = blocks[value] = int.from_bytes(raw, "little") & _ID_MASK
            out.append(salted)
        return out

    def session(self, key: str | None) -> str | None:
        return None if key is None else self.digest(key.encode()).hex()


class CaptureBuffer:
    """Finished requests of the capture in progress, until the telemetry writer ships them."""

    def __init__(self) -> None:
        self._pending: deque[_Finished] = deque()
        self._salted: dict[int, _Salted] = {}
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
        """On the request path: an append (the oldest is dropped when the buffer is full)."""
        if len(self._pending) >= CAPTURE_BUFFER:
            self._pending.popleft()
            self.dropped += 1
        self._pending.append(
            _Finished(capture, features, output_tokens, instance, arm, status, ttft_s, tpot_s)
        )

    def __len__(self) -> int:
        return len(self._pending)

    def drain(self, cluster: str, router: str) -> list[contract.CaptureBatch]:
        """Take every buffered request out, as batches of at most `CAPTURE_BATCH` per
        capture (a config change mid-way leaves requests of two captures)."""
        batches: list[contract.CaptureBatch] = []
        current: contract.CaptureBatch | None = None
        while self._pending:
            item = self._pending.popleft()
            if current is None or current.capture != item.capture.id or _full(current):
                current = contract.CaptureBatch(
                    id=uuid.uuid4().hex,
                    cluster=cluster,
                    router=router,
                    capture=item.capture.id,
                    requests=[],
                )
                batches.append(current)
            current.requests.append(self._record(item))
        return batches

    def _record(self, item: _Finished) -> contract.CapturedRequest:
        salted = self._salted.get(item.capture.id)
        if salted is None or salted.key != item.capture.salt.encode()[:64]:
            self._salted = {item.capture.id: _Salted(item.capture.salt)}
            salted = self._salted[item.capture.id]
        features = item.features
        return contract.CapturedRequest(
            at=features.arrival_time,
            prompt_tokens=features.prompt_tokens,
            output_tokens=item.output_tokens,
            block_size=features.block_size,
            hash_ids=salted.block_ids(features.block_hashes),
            session=salted.session(features.session_key),
            turn=features.turn_index,
            instance=item.instance,
            arm=item.arm,
            status=item.status,
            ttft_s=item.ttft_s,
            tpot_s=item.tpot_s,
        )


def _full(batch: contract.CaptureBatch) -> bool:
    return len(batch.requests) >= contract.CAPTURE_BATCH
