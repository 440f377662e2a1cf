"""Oversized-upload drill: 80 MiB bodies thrown at the control plane's replay upload form
under uvicorn, anonymously and as signed-in users, with Content-Length and chunked. Each
must be refused with a clear 413 before the body reaches the disk: the server process's
bytes written (``wchar`` in /proc/<pid>/io: every write(2) to a file, the temporary spool
included; socket sends are not counted) must stay near zero. A real trace upload by an
operator still works afterwards."""

from __future__ import annotations

import json
import re
import select
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client

from controlplane.models import Policy, ReplayJob
from devharness import free_port, stop_process
from tests.drills.report import Outcome, record
from tests.web.helpers import Server, make_cluster, make_user, start_asgi

MIB = 1024 * 1024
OVERSIZED = 80 * MIB
PIECE = 64 * 1024
# "About zero": a log line or two; a spooled body would be tens of MiB.
DISK_SLACK = 64 * 1024


@dataclass
class Attempt:
    status: int | None
    body: str
    sent: int  # body bytes the client got onto the wire before the answer
    disk: int  # bytes the server wrote to files meanwhile


@pytest.fixture
def upload_server(transactional_db, tmp_path, monkeypatch) -> Iterator[Server]:
    monkeypatch.setenv("SWITCHYARD_VAR_DIR", str(tmp_path / "var"))
    server = start_asgi(free_port(), tmp_path / "uvicorn.log")
    yield server
    stop_process(server.process)


def written_bytes(pid: int) -> int:
    stats = Path(f"/proc/{pid}/io").read_text()
    found = re.search(r"^wchar: (\d+)$", stats, re.M)
    assert found is not None
    return int(found.group(1))


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def throw(
    server: Server, path: str, *, chunked: bool, cookie: str = "", expect_continue: bool = False
) -> Attempt:
    """POST an 80 MiB body over a raw socket, stopping as soon as the server answers."""
    port = int(server.url.rsplit(":", 1)[1])
    before = written_bytes(server.process.pid)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_head(path, chunked, cookie, expect_continue))
        sent = 0 if expect_continue and _answered(sock, 2.0) else _stream(sock, chunked)
        answer = _read_answer(sock)
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None
    body = answer.partition(b"\r\n\r\n")[2].decode(errors="replace")
    return Attempt(status, body, sent, written_bytes(server.process.pid) - before)


def _head(path: str, chunked: bool, cookie: str, expect_continue: bool) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: multipart/form-data; boundary=drill",
        "Transfer-Encoding: chunked" if chunked else f"Content-Length: {OVERSIZED}",
    ]
    lines += [f"Cookie: {cookie}"] if cookie else []
    lines += ["Expect: 100-continue"] if expect_continue else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answered(sock: socket.socket, wait_s: float) -> bool:
    return bool(select.select([sock], [], [], wait_s)[0])


def _stream(sock: socket.socket, chunked: bool) -> int:
    piece = b"x" * PIECE
    frame = f"{PIECE:x}\r\n".encode() + piece + b"\r\n" if chunked else piece
    sent = 0
    try:
        while sent < OVERSIZED and not _answered(sock, 0):
            sock.sendall(frame)
            sent += PIECE
        if chunked and sent >= OVERSIZED:
            sock.sendall(b"0\r\n\r\n")
    except OSError:  # the server answered and closed while we were still sending
        pass
    return sent


def _read_answer(sock: socket.socket) -> bytes:
    answer = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            data = sock.recv(65536)
        except OSError:
            break
        if not data:
            break
        answer += data
        head, _, body = answer.partition(b"\r\n\r\n")
        length = re.search(rb"content-length: (\d+)", head, re.I)
        if length and len(body) >= int(length.group(1)):
            break
    return answer


def verdict(attempt: Attempt) -> tuple[str, str]:
    clear = attempt.status == 413 and "request body too large" in attempt.body
    return (
        "clear" if clear else "lost",
        f"413 body too large: {attempt.sent} B sent, {attempt.disk} B written"
        if clear
        else f"status {attempt.status}: {attempt.body[:200]!r}",
    )


def upload_real_trace(server: Server, cookie: str, cluster_id: int) -> httpx.Response:
    """An operator's ordinary 2 MiB trace upload through the same server (CSRF included)."""
    rows = "".join(
        json.dumps(
            {"timestamp": k, "input_length": 900, "output_length": 20, "hash_ids": [k, k + 1]}
        )
        + "\n"
        for k in range(25_000)
    )
    name, value = cookie.split("=", 1)
    with httpx.Client(base_url=server.url, cookies={name: value}, timeout=60) as client:
        client.get(f"/clusters/{cluster_id}/replays/")
        policy = Policy.objects.filter(cluster_id=cluster_id).first()
        assert policy is not None
        return client.post(
            f"/clusters/{cluster_id}/replays/create/",
            headers={"X-CSRFToken": client.cookies["csrftoken"]},
            data={"policies": str(policy.pk), "max_requests": "10"},
            files={"upload": ("real.jsonl", rows.encode())},
        )


def test_oversized_uploads_are_refused_before_reaching_the_disk(upload_server) -> None:
    cluster = make_cluster()
    path = f"/clusters/{cluster.pk}/replays/create/"
    operator = session_cookie(make_user("operator", "drill-uploader"))
    viewer = session_cookie(make_user("viewer", "drill-viewer"))
    cases: dict[str, dict[str, Any]] = {
        "anonymous, Content-Length": {"chunked": False},
        "anonymous, Content-Length, Expect: 100-continue": {
            "chunked": False,
            "expect_continue": True,
        },
        "anonymous, chunked": {"chunked": True},
        "forged session cookie, Content-Length": {"chunked": False, "cookie": "sessionid=forged"},
        "viewer, Content-Length": {"chunked": False, "cookie": viewer},
        "operator, Content-Length over 64 MiB": {"chunked": False, "cookie": operator},
        "operator, chunked": {"chunked": True, "cookie": operator},
    }
    outcome, attempts = Outcome(), {}
    for name, options in cases.items():
        attempts[name] = throw(upload_server, path, **options)
        outcome.add(*verdict(attempts[name]))
    real = upload_real_trace(upload_server, operator, cluster.pk)
    outcome.add("ok" if real.status_code == 302 else "lost", f"real upload: {real.status_code}")
    most_written = max(a.disk for a in attempts.values())
    record(
        "oversized uploads (80 MiB, anonymous and signed-in)",
        outcome,
        None,
        notes=f"{len(cases)} refusals (413) + 1 real 2 MiB upload accepted; most bytes "
        f"written to disk by the server before a refusal: {most_written}",
        disk_bytes_max=most_written,
        client_bytes_sent_max=max(a.sent for a in attempts.values()),
    )
    assert outcome.lost == 0, {n: a for n, a in attempts.items() if verdict(a)[0] != "clear"}
    assert most_written <= DISK_SLACK, {n: a.disk for n, a in attempts.items()}
    assert attempts["anonymous, Content-Length, Expect: 100-continue"].sent == 0
    assert ReplayJob.objects.filter(cluster=cluster).count() == 1
