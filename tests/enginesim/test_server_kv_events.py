"""KV events over ZMQ: frames, both encodings, replay; consistent with the engine's cache."""

from __future__ import annotations

import time

import httpx
import msgpack
import pytest
import zmq

from enginesim.engine.hashing import block_hashes

MODEL = "Qwen/Qwen2-7B-Instruct"
INSTANCE = 2
BLOCK = 16


PROBE_BASE = 60_000  # token ids of the subscription probes, apart from the tests' prompts


def _event_tokens(event) -> list[int]:
    """The token ids of a BlockStored event in either encoding, else []."""
    if isinstance(event, dict):
        return event["token_ids"] if event["type"] == "BlockStored" else []
    return event[3] if event[0] == "BlockStored" else []


def _subscribe(endpoint: str, url: str) -> tuple[zmq.Socket, int]:
    """A SUB socket that is known to receive: the PUB drops what it sends before the
    subscription lands, so one-block probe prompts are sent until one's event arrives,
    then a last probe whose event ends everything the earlier probes caused. Returns the
    socket and the sequence number of that last probe's batch."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    probe = PROBE_BASE

    def send_probe() -> list[int]:
        nonlocal probe
        tokens = list(range(probe, probe + BLOCK))  # one full block: one BlockStored
        probe += BLOCK
        body = {"model": MODEL, "prompt": tokens, "max_tokens": 1}
        httpx.post(url + "/v1/completions", json=body).raise_for_status()
        return tokens

    deadline = time.monotonic() + 30
    while not sock.poll(100):
        assert time.monotonic() < deadline, "no KV event arrived in 30 s"
        send_probe()
    last = send_probe()
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    while True:
        _, seq, payload = sock.recv_multipart()
        _, events, _ = msgpack.unpackb(payload)
        if any(_event_tokens(event) == last for event in events):
            return sock, int.from_bytes(seq, "big")


def _receive_until(sock: zmq.Socket, done) -> list[tuple[int, list]]:
    """(seq, batch) messages until ``done(batches)``; fails on timeout."""
    batches: list[tuple[int, list]] = []
    while not done(batches):
        topic, seq, payload = sock.recv_multipart()
        assert topic == b""
        assert len(seq) == 8
        batches.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
    return batches


def _stored_tokens(batches) -> list[int]:
    tokens = []
    for _, (_, events, _) in batches:
        for event in events:
            if event["type"] == "BlockStored":
                tokens.extend(event["token_ids"])
    return tokens


def test_block_stored_events_match_the_prompt_blocks(sim):
    sock, _ = _subscribe(sim.kv_endpoint(INSTANCE), sim.url(INSTANCE))
    prompt = list(range(5000, 5070))  # 4 full blocks + 6 tokens
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3}
    httpx.post(sim.url(INSTANCE) + "/v1/completions", json=body).raise_for_status()
    batches = _receive_until(sock, lambda got: len(_stored_tokens(got)) >= 64)
    sock.close()

    seqs = [seq for seq, _ in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    ts, _, dp_rank = batches[0][1]
    assert isinstance(ts, float) and dp_rank == 0
    stored = [e for _, (_, evs, _) in batches for e in evs if e["type"] == "BlockStored"]
    assert _stored_tokens(batches) == prompt[:64]
    hashes = [h for event in stored for h in event["block_hashes"]]
    assert hashes == block_hashes(prompt, BLOCK)
    assert stored[0]["parent_block_hash"] is None
    assert all(event["block_size"] == BLOCK for event in stored)

    # A second identical prompt is a full-block cache hit: nothing new is stored.
    usage = httpx.post(sim.url(INSTANCE) + "/v1/completions", json=body).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 64


def _replay(endpoint: str) -> list[tuple[int, list]]:
    """Every buffered (seq, batch) from 0, up to the end marker."""
    dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = []
    while True:
        empty, seq, payload = dealer.recv_multipart()
        assert empty == b""
        if seq == (-1).to_bytes(8, "big", signed=True):
            assert payload == b""
            break
        replayed.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
    dealer.close()
    return replayed


def test_replay_returns_buffered_batches_then_the_end_marker(sim):
    body = {"model": MODEL, "prompt": list(range(7000, 7040)), "max_tokens": 2}
    httpx.post(sim.url(INSTANCE) + "/v1/completions", json=body).raise_for_status()
    replayed = _replay(sim.kv_replay_endpoint(INSTANCE))
    seqs = [seq for seq, _ in replayed]
    assert seqs == list(range(len(seqs)))
    assert _stored_tokens(replayed)[-32:] == list(range(7000, 7032))


@pytest.fixture
def array_server(sim_factory):
    return sim_factory("--kv-encoding", "array")


def test_array_encoding_is_vllm_positional(array_server):
    sock, probed = _subscribe(array_server.kv_endpoint(0), array_server.url(0))
    prompt = list(range(9000, 9032))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    httpx.post(array_server.url(0) + "/v1/completions", json=body).raise_for_status()
    (seq, (_, events, _)), *_ = _receive_until(sock, lambda got: bool(got))
    sock.close()
    assert seq == probed + 1  # numbered on from the probes' batches
    # sequence numbers start at 0 on a fresh instance: its first batch, the first probe's
    first_seq, (_, first_events, _) = _replay(array_server.kv_replay_endpoint(0))[0]
    assert first_seq == 0
    assert _event_tokens(first_events[0]) == list(range(PROBE_BASE, PROBE_BASE + BLOCK))
    tag, hashes, parent, token_ids, block_size, lora_id, medium, *_ = events[0]
    assert tag == "BlockStored"
    assert hashes == block_hashes(prompt, BLOCK) and parent is None
    assert token_ids == prompt and block_size == BLOCK
    assert lora_id is None and medium == "GPU"
