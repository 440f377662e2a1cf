"""Keyed digests of captured traffic: what the router computes of a captured request's
prompt and session, and the control plane's ingest computes again of what it stores, under
one capture's salt, so ids are equal exactly when the prefixes are within one capture and
no content can be guessed without the salt."""

from __future__ import annotations

from hashlib import blake2b

from router_worker.routing.features import DEFAULT_TENANT

DIGEST_CACHE = 200_000  # block hash -> digest, per capture: shared prefixes repeat
_ID_MASK = (1 << 63) - 1  # trace ids are signed 64-bit in every reader


class CaptureKey:
    """Keyed digests under one capture's salt (blake2b, 64 bits), block hashes cached."""

    def __init__(self, salt: str) -> None:
        self.key = salt.encode()[:64]  # blake2b's key is at most 64 bytes
        self.blocks: dict[int, int] = {}

    def _digest(self, data: bytes) -> bytes:
        return blake2b(data, key=self.key, digest_size=8).digest()

    def block_ids(self, hashes: tuple[int, ...]) -> list[int]:
        """Trace ids (63 bits: signed 64-bit in every reader) of a prompt's block hashes."""
        blocks = self.blocks
        if len(blocks) > DIGEST_CACHE:
            blocks.clear()
        out = []
        for value in hashes:
            salted = blocks.get(value)
            if salted is None:
                raw = self._digest(value.to_bytes(8, "little"))
                salted = blocks[value] = int.from_bytes(raw, "little") & _ID_MASK
            out.append(salted)
        return out

    def session(self, key: str | None) -> str | None:
        return None if key is None else self._digest(key.encode()).hex()

    def tenant(self, name: str) -> str:
        """A tenant's name as the capture records it: a keyed digest (16 hex digits, a
        valid tenant name for replays), except the default tenant's, which names no one."""
        if name == DEFAULT_TENANT:
            return name
        return self._digest(b"tenant\x00" + name.encode()).hex()
