"""Clients that judge every answer: ok, clear failure, or lost (see report.py)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from tests.drills.report import Outcome

MODEL = "Qwen/Qwen2-7B-Instruct"
ABORTED = re.compile(r'"finish_reason":\s*"abort"')
ERROR_KEYS = {"message", "type", "param", "code"}


def is_error_body(text: str) -> bool:
    try:
        error = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and set(error) == ERROR_KEYS and bool(error["message"])


def classify_whole(status: int, text: str) -> str:
    if status == 200:
        try:
            return "ok" if json.loads(text)["choices"] else "lost"
        except (ValueError, KeyError, TypeError):
            return "lost"
    return "clear" if status >= 400 and is_error_body(text) else "lost"


def classify_stream(status: int, text: str) -> str:
    if status != 200:
        return "clear" if is_error_body(text) else "lost"
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return "lost"
    if any(is_error_body(event) for event in events[:-1]):
        return "clear"
    if ABORTED.search(text):
        return "lost"  # cut short but dressed as a normal end
    return "ok" if len(events) >= 2 else "lost"


def body(tag: str, stream: bool, max_tokens: int = 24) -> dict:
    prompt = " ".join(f"{tag}{i}" for i in range(60))
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}


async def one(
    client: httpx.AsyncClient, url: str, payload: dict, transport: str = "lost"
) -> tuple[str, str]:
    """(verdict, detail) of one request; a refused or cut connection counts as ``transport``
    (a clear failure where the router itself is the thing being killed)."""
    try:
        if payload.get("stream"):
            async with client.stream("POST", url, json=payload) as response:
                text = (await response.aread()).decode(errors="replace")
                return classify_stream(response.status_code, text), text[-200:]
        response = await client.post(url, json=payload)
        return classify_whole(response.status_code, response.text), response.text[:200]
    except httpx.TimeoutException as error:
        return "lost", f"{type(error).__name__}: {error}"  # a hung client is never clear
    except httpx.HTTPError as error:
        return transport, f"{type(error).__name__}: {error}"


@dataclass
class Load:
    """Steady concurrent load: ``concurrency`` workers, alternating stream and not."""

    url: str
    concurrency: int = 8
    max_tokens: int = 24
    timeout_s: float = 30.0
    pause_s: float = 0.0
    transport: str = "lost"

    async def run(
        self,
        count: int | None = None,
        until: Callable[[], bool] | None = None,
    ) -> Outcome:
        outcome = Outcome()
        counter = iter(range(10**9))
        limits = httpx.Limits(max_connections=self.concurrency * 2)

        async with httpx.AsyncClient(
            timeout=self.timeout_s, limits=limits, trust_env=False
        ) as client:

            async def worker() -> None:
                while True:
                    k = next(counter)
                    if (count is not None and k >= count) or (until is not None and until()):
                        return
                    payload = body(f"d{k}-", stream=k % 2 == 0, max_tokens=self.max_tokens)
                    verdict, detail = await one(client, self.url, payload, self.transport)
                    outcome.add(verdict, detail)
                    if self.pause_s or verdict != "ok":  # no hammering a dead endpoint
                        await asyncio.sleep(self.pause_s if verdict == "ok" else 0.25)

            await asyncio.gather(*(worker() for _ in range(self.concurrency)))
        return outcome


def run_for(url: str, seconds: float, **options: float) -> Outcome:
    """Blocking: load for ``seconds`` of wall time."""
    deadline = time.monotonic() + seconds
    load = Load(url, **options)  # type: ignore[arg-type]
    return asyncio.run(load.run(until=lambda: time.monotonic() >= deadline))


async def steady(
    url: str,
    rate: float,
    seconds: float,
    max_tokens: int = 32,
    timeout_s: float = 30.0,
    prompts: int | None = None,
) -> Outcome:
    """Open-loop load: one request every ``1/rate`` s for ``seconds``, stream and not;
    cycling through ``prompts`` distinct prompts when given (else all unique)."""
    outcome = Outcome()
    limits = httpx.Limits(max_connections=256)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, trust_env=False) as client:

        async def send(k: int) -> None:
            tag = k if prompts is None else k % prompts
            payload = body(f"soak{tag}-", stream=k % 2 == 0, max_tokens=max_tokens)
            verdict, detail = await one(client, url, payload)
            outcome.add(verdict, detail)

        start, tasks = time.monotonic(), []
        for k in range(int(rate * seconds)):
            delay = start + k / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(k)))
        await asyncio.gather(*tasks)
    return outcome


class BackgroundLoad:
    """Steady load in a thread; ``transport`` says how refused/cut connections count."""

    def __init__(self, url: str, transport: str = "lost", max_tokens: int = 16) -> None:
        self.stop = threading.Event()
        self.box: list[Outcome] = []
        load = Load(
            url + "/v1/completions",
            concurrency=3,
            max_tokens=max_tokens,
            pause_s=0.02,
            transport=transport,
        )
        self.thread = threading.Thread(
            target=lambda: self.box.append(asyncio.run(load.run(until=self.stop.is_set))),
            daemon=True,
        )
        self.thread.start()

    def finish(self) -> Outcome:
        self.stop.set()
        self.thread.join(timeout=60)
        return self.box[0]
