"""What the web UI and realtime tests share: users and clusters made through the services,
server processes on this test run's database and Redis (uvicorn ASGI app), router-like
state snapshots and events written the way routers write them, replay jobs as their
cells leave them, a logged-in browser page, the publisher's message collector, and pages
parsed into element trees."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.models import Cluster, ReplayCell, ReplayJob
from controlplane.services import clusters, policies, replay_cells
from controlplane.services.audit import Actor
from devharness import control_plane as cp
from devharness import start_process as harness_start
from devharness import stop_process, wait_http
from router_worker.contract.telemetry import (
    EVENTS_STREAM,
    STATE_TTL_S,
    EventKind,
    EventRecord,
    InstanceSnapshot,
    StateSnapshot,
    WindowStats,
    dumps_state,
    state_key,
    state_pattern,
)


def instance(
    name: str, pending: float = 0, pending_max: float | None = None, batch: float = 0, **extra
) -> InstanceSnapshot:
    return InstanceSnapshot(
        name=name,
        health=extra.pop("health", "healthy"),
        pending_prefill_tokens=pending,
        pending_prefill_tokens_max=pending if pending_max is None else pending_max,
        batch_size=batch,
        batch_size_max=extra.pop("batch_max", batch),
        in_flight=extra.pop("in_flight", 0),
        **extra,
    )


def window(requests: int = 10, **stats) -> WindowStats:
    base = {
        "seconds": 30.0,
        "requests": requests,
        "errors": 0,
        "requests_per_s": requests / 30,
        "output_tokens_per_s": 100.0,
    }
    return WindowStats(**{**base, **stats})


def snapshot(
    cluster: str,
    router: str,
    instances: list[InstanceSnapshot],
    *,
    ts: float | None = None,
    version: int | None = 1,
    policy: str = "lmetric",
    **extra,
) -> StateSnapshot:
    return StateSnapshot(
        ts=time.time() if ts is None else ts,
        cluster=cluster,
        router=router,
        config_version=version,
        policy=policy,
        instances=instances,
        window=extra.pop("window", window()),
        **extra,
    )


def write_state(client: redis.Redis, snap: StateSnapshot) -> None:
    client.set(state_key(snap.cluster, snap.router), dumps_state(snap), ex=STATE_TTL_S)


def write_event(
    client: redis.Redis, cluster: str, kind: EventKind, router: str = "r1", **payload
) -> EventRecord:
    event = EventRecord.new(cluster, router, kind, time.time(), **payload)
    client.xadd(EVENTS_STREAM, event.to_stream_fields())  # type: ignore[arg-type]  # stub: invariant dict
    return event


def hotspot_payload(transition: str = "confirmed", prefix_class: str = "c7") -> dict:
    return {
        "transition": transition,
        "prefix_class": prefix_class,
        "prefix_hash": "ab12cd34ef",
        "x": 4.0,
        "x_bar": 1.0,
        "m": 1,
        "m_bar": 3,
        "window": 30.0,
        "instances": ["i0"],
    }


# ----- replay jobs as their cells leave them ------------------------------------------------
def replay_summary(goodput: float) -> dict:
    return {"requests": 100, "completed": 100, "goodput_rps": goodput, "ttft_mean_s": 0.5}


def finished_job(cluster, goodputs: dict[str, list[list[float]]]) -> ReplayJob:
    """A job over the cluster's policies (by name) whose cells measured these goodputs,
    per policy a list over loads (×1, ×1.5) of per-seed values."""
    chosen = [p for p in cluster.policies.order_by("name") if p.name in goodputs]
    inputs = {
        "trace": "shared:x.jsonl",
        "policies": [p.spec() for p in chosen],
        "policy_ids": [p.pk for p in chosen],
        "active_policy_id": cluster.active_policy_id,
        "rate_scales": [1.0, 1.5],
        "seeds": [0, 1, 2],
    }
    job = ReplayJob.objects.create(cluster=cluster, inputs=inputs)
    for cell in replay_cells.create_cells(job):
        value = goodputs[chosen[cell.policy].name][inputs["rate_scales"].index(cell.rate_scale)]
        result = {
            "summary": replay_summary(value[cell.seed]),
            "ttft_percentiles": None,
            "instances": 3,
            "requests": 100,
            "percentiles": [50],
            "lower_bound": {},
        }
        ReplayCell.objects.filter(pk=cell.pk).update(state="succeeded", result=result)
    assert replay_cells.finish_job(job.pk) == "succeeded"
    job.refresh_from_db()
    return job


ROOT = Path(__file__).resolve().parents[2]
SYSTEM = Actor.system("web-tests")
PASSWORD = "web-tests-password-123"


def make_user(role: str | None, username: str | None = None):
    user = get_user_model().objects.create_user(username or f"web-{role}", password=PASSWORD)
    if role is not None:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def make_cluster(
    instance_urls: list[str] | None = None,
    name: str | None = None,
    model: str = "Qwen/Qwen2-7B-Instruct",
) -> Cluster:
    """A cluster with instances i0.. and policies lm (active) and rr, via the services."""
    name = name or f"web-{uuid.uuid4().hex[:8]}"
    cluster = clusters.create_cluster(SYSTEM, name=name, model=model, gpu_type="h20")
    urls = instance_urls or [f"http://127.0.0.1:{9300 + i}" for i in range(3)]
    for index, url in enumerate(urls):
        clusters.add_instance(SYSTEM, cluster.pk, name=f"i{index}", url=url, reason="setup")
    lm = policies.create_policy(SYSTEM, cluster.pk, name="lm", kind="lmetric")
    policies.create_policy(SYSTEM, cluster.pk, name="rr", kind="round_robin")
    policies.activate_policy(SYSTEM, cluster.pk, lm.pk, reason="setup")
    return Cluster.objects.get(pk=cluster.pk)


def clear_state(client: redis.Redis, cluster_name: str) -> None:
    for key in client.scan_iter(match=state_pattern(cluster_name)):
        client.delete(key)


def subprocess_env() -> dict[str, str]:
    """The environment of a server process that shares this test run's database and Redis."""
    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings_test",
        "SWITCHYARD_DATABASE_URL": url,
        "SWITCHYARD_REDIS_URL": settings.REDIS_URL,
        "SWITCHYARD_CHANNEL_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
        "SWITCHYARD_SERVE_STATIC": "1",
        "PYTHONUNBUFFERED": "1",
    }


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log: Path


def start_process(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """A server process on this test run's database and Redis (or ``env``), output in
    ``log``."""
    return harness_start(args, cwd=ROOT, env=env or subprocess_env(), log=log, stdin=None)


def start_asgi(port: int, log: Path, env: dict[str, str] | None = None) -> Server:
    """The full ASGI application (HTTP + websockets) under uvicorn, on the test database."""
    process = start_process(cp.web_command(port), log, env)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", 30, process=process, log=log)
    except BaseException:
        stop_process(process)
        raise
    return Server(process, f"http://127.0.0.1:{port}", log)


# ----- the browser: a logged-in page and its live snapshot --------------------------------
def login(browser, base_url: str, role: str, *, bypass_csp: bool = True):
    """A logged-in page. ``bypass_csp``: Playwright's string predicates (wait_for_function)
    are evaluated in the page, which our CSP forbids; the hostile-input test keeps the CSP
    and checks that our own pages raise no violation."""
    user = make_user(role, f"e2e-{role}")
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, bypass_csp=bypass_csp)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.js_errors = errors  # checked by the tests: our scripts must not throw
    page.goto(f"{base_url}/login/")
    page.fill("input[name=username]", user.username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button.primary")
    page.wait_for_url(f"{base_url}/")
    return page


def page_snapshot(page) -> Any:
    """The page's live snapshot, as JSON (null before the first message)."""
    return page.evaluate("window.switchyardLive && window.switchyardLive.state.snapshot")


# ----- the publisher's sink ------------------------------------------------------------
class Collector:
    def __init__(self) -> None:
        self.messages: list[tuple[str, dict]] = []

    async def __call__(self, group: str, message: dict) -> None:
        self.messages.append((group, message))

    def of_type(self, kind: str) -> list[dict]:
        return [m for _, m in self.messages if m["type"] == kind]


# ----- replay forms: the shared trace and the cluster's policies -------------------------
TRACE = "mooncake_synthetic_trace.jsonl"


def policy_ids(cluster) -> list[str]:
    return [str(p.pk) for p in cluster.policies.order_by("name")]


# ----- pages as element trees ----------------------------------------------------------
VOID = {"input", "br", "meta", "link", "img", "hr", "source", "col", "area", "base", "wbr"}


class Element:
    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag, self.attrs, self.text = tag, attrs, ""
        self.children: list[Element] = []

    def find_all(self, tag: str | None = None, **attrs: str) -> list[Element]:
        found = []
        for child in self.children:
            if (tag is None or child.tag == tag) and all(
                child.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items()
            ):
                found.append(child)
            found += child.find_all(tag, **attrs)
        return found

    def find(self, tag: str | None = None, **attrs: str) -> Element:
        found = self.find_all(tag, **attrs)
        assert len(found) == 1, (tag, attrs, len(found))
        return found[0]


class Tree(HTMLParser):
    """The page as nested elements (the stdlib parser; no HTML library is pinned)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.root = Element("root", {})
        self.stack = [self.root]
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        element = Element(tag, {k: ("" if v is None else v) for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        while len(self.stack) > 1:
            if self.stack.pop().tag == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self.stack[1:]:
            element.text += data


def parse(response) -> Element:
    return Tree(response.content.decode()).root


def described(root: Element, control: Element) -> str:
    """The text of every element the control's aria-describedby names."""
    ids = control.attrs.get("aria-describedby", "").split()
    assert ids, control.attrs
    return " ".join(" ".join(root.find(id=i).text.split()) for i in ids)
