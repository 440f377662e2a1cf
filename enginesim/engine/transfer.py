"""KV transfer between a prefill and a decode instance (prefill/decode disaggregation).

vLLM's NIXL flow, as enginesim models it: the prefill instance computes the prompt
(``max_tokens`` 1, ``kv_transfer_params.do_remote_decode``) and, when the request
finishes, *holds* its blocks instead of freeing them, until the decode instance has read
them or a timeout (vLLM's ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``, 480 s) passes. The decode
instance (``do_remote_prefill``) reserves blocks for the prompt it does not hold itself,
reads them over its link and then computes the prompt's last token (its first output)
and decodes as usual.

A transfer's time is ``latency + bytes / bandwidth`` on the decode instance's link; reads
of one instance queue on its link (one read at a time, the next one starting when the
previous one's bytes are through). Bytes are the pulled tokens × the model's KV bytes
per token (``ModelSpec.kv_bytes_per_token``: 2 × layers × KV heads × head dim × dtype).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

ROLES = ("prefill", "decode", "both")

# vLLM's default for how long a prefill instance keeps a finished request's blocks for
# the decode instance to read (VLLM_NIXL_ABORT_REQUEST_TIMEOUT), in seconds.
DEFAULT_HOLD_TIMEOUT = 480.0


@dataclass(frozen=True)
class LinkSpec:
    """A prefill → decode link: bandwidth (bytes/s, one direction) and per-transfer latency
    (s: the read's setup and notification, not its bytes)."""

    key: str
    bandwidth: float
    latency: float
    source: str

    def transfer_time(self, num_bytes: int) -> float:
        return self.latency + num_bytes / self.bandwidth


LINKS: dict[str, LinkSpec] = {
    "nvlink": LinkSpec(
        "nvlink", 450e9, 5e-6, "NVLink 4: 900 GB/s bidirectional per GPU, nominal (one node)"
    ),
    "rdma": LinkSpec(
        "rdma", 50e9, 20e-6, "400 Gb/s InfiniBand NDR / RoCE NIC per GPU, nominal (GPUDirect)"
    ),
    "tcp": LinkSpec("tcp", 3.125e9, 200e-6, "25 Gb/s effective TCP (NIXL's UCX over TCP)"),
}


def get_link(key: str) -> LinkSpec:
    try:
        return LINKS[key.lower()]
    except KeyError:
        raise KeyError(f"unknown KV link {key!r}; known: {', '.join(sorted(LINKS))}") from None


class LinkQueue:
    """One instance's link: reads go one after the other; a read's latency overlaps the
    next read's bytes."""

    __slots__ = ("free_at", "link")

    def __init__(self, link: LinkSpec) -> None:
        self.link = link
        self.free_at = 0.0

    def read(self, start: float, num_bytes: int) -> float:
        """Queue a read of ``num_bytes`` asked for at ``start``; returns when it lands."""
        begin = max(start, self.free_at)
        self.free_at = begin + num_bytes / self.link.bandwidth
        return self.free_at + self.link.latency


def parse_role(text: str) -> str:
    role = text.strip().lower()
    if role not in ROLES:
        raise ValueError(f"unknown role {text!r}; use one of {', '.join(ROLES)}")
    return role


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The disaggregation flags ``serve`` and ``replay`` share."""
    from enginesim.engine.fleet import argtype

    parser.add_argument(
        "--roles",
        type=argtype("--roles", parse_role),
        default=None,
        metavar="ROLE@INSTANCES",
        help="prefill/decode disaggregation: each instance's role, prefill, decode or both "
        "(prefill@0-3,decode@4-15; the others both), or one per instance",
    )
    parser.add_argument(
        "--kv-link",
        choices=sorted(LINKS),
        default="rdma",
        help="the link decode instances read prefilled KV over (bandwidth and latency preset)",
    )
    parser.add_argument(
        "--kv-hold-timeout",
        type=float,
        default=DEFAULT_HOLD_TIMEOUT,
        help="simulated seconds a prefill holds its blocks for a read (vLLM's "
        "VLLM_NIXL_ABORT_REQUEST_TIMEOUT), and a read waits for room",
    )


@dataclass
class TransferStats:
    """A decode instance's reads and a prefill instance's held blocks (EngineStats)."""

    transfers: int = 0  # reads landed
    bytes: int = 0  # bytes read
    seconds: float = 0.0  # sum of the reads' durations, queueing on the link included
    failed: int = 0  # reads given up (no room before the timeout)
    in_flight: int = 0  # decode side: reads waiting for room or under way
    held_requests: int = 0  # prefill side: finished requests whose blocks wait for a read
    held_blocks: int = 0
    expired: int = 0  # prefill side: holds freed by the timeout, never read
