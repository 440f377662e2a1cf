"""Hostile strings in every free-text field an operator can set run nowhere.

Stored through the services as an operator would through the forms and the API: the
cluster's model and GPU names, an instance's KV-events endpoint, policy names and
descriptions, canary names, the reasons of every change (audit log, config versions),
and a failed replay's error. Then every page is opened in chromium. Each payload would run if
it reached the page unescaped, or reached a JavaScript string inside an attribute (the
canary page's old inline ``onclick="confirm('… {{ name }}?')"``), or an inline script:
nothing may set ``window.__pwned``, open a dialog, or add an element with an inline
handler, and every page carries a Content-Security-Policy that forbids inline script.
Names validated as slugs (clusters, instances, policies) refuse the payloads outright.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from controlplane.models import Cluster, ReplayJob
from controlplane.services import canaries, clusters, policies
from controlplane.services.errors import ServiceError
from tests.drills.report import Outcome, record

from .helpers import SYSTEM, login

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]

PAYLOADS = (
    "'+(window.__pwned=1)+'",  # breaks out of a JS string in an attribute
    '"><img src=x onerror="window.__pwned=1">',  # breaks out of an attribute
    "</script><script>window.__pwned=1</script>",  # breaks out of an inline script
    "<svg onload=window.__pwned=1>{{7*7}}",  # raw markup (and template syntax)
)


def seed(payload_index: int) -> Cluster:
    """A cluster whose every free-text field holds a payload (names cut to their limits)."""
    hostile = PAYLOADS[payload_index]
    cluster = clusters.create_cluster(
        SYSTEM, name=f"hostile-{payload_index}", model="qwen2-7b", gpu_type="h20", reason=hostile
    )
    # GPU and model names are checked on creation; a cluster stored before that may hold any
    Cluster.objects.filter(pk=cluster.pk).update(model=hostile[:128], gpu_type=hostile[:32])
    for index in range(3):
        clusters.add_instance(
            SYSTEM,
            cluster.pk,
            name=f"i{index}",
            url=f"http://127.0.0.1:{9400 + index}",
            kv_events=hostile,
            reason=hostile,
        )
    base = policies.create_policy(
        SYSTEM, cluster.pk, name="rr", kind="round_robin", description=hostile
    )
    candidate = policies.create_policy(
        SYSTEM, cluster.pk, name="lm", kind="lmetric", description=hostile
    )
    policies.activate_policy(SYSTEM, cluster.pk, base.pk, reason=hostile)
    canaries.create_canary(
        SYSTEM,
        cluster.pk,
        name=hostile[:64],
        baseline_policy_id=base.pk,
        candidate_policy_id=candidate.pk,
        baseline_instances=["i0", "i1"],
        candidate_instances=["i2"],
        weight_steps=[10, 50],
        reason=hostile,
    )
    ReplayJob.objects.create(
        cluster=cluster,
        state="failed",
        error=hostile,
        inputs={
            "trace": "shared:mooncake_synthetic_trace.jsonl",
            "rate_scale": 1.0,
            "seed": 0,
            "max_requests": 10,
            "policies": [{"kind": "lmetric", "params": {}}],
        },
    )
    return Cluster.objects.get(pk=cluster.pk)


def pages(base_url: str, cluster: Cluster) -> list[str]:
    at = f"{base_url}/clusters/{cluster.pk}"
    job = cluster.replays.get()
    return [
        f"{base_url}/",
        f"{at}/",
        f"{at}/policy/",
        f"{at}/canary/",
        f"{at}/replays/",
        f"{at}/canary/{cluster.canaries.get().pk}/",
        f"{at}/replays/{job.pk}/",
        f"{base_url}/hotspots/",
        f"{base_url}/audit/",
        f"{base_url}/audit/?cluster={cluster.pk}",
        f"{base_url}/api/v1/docs",
    ]


@pytest.mark.parametrize("name", ["'+alert(1)+'", "<b>x</b>", "a b"])
def test_slug_names_refuse_hostile_strings(transactional_db, name) -> None:
    with pytest.raises(ServiceError):
        clusters.create_cluster(SYSTEM, name=name, model="qwen2-7b", gpu_type="h20")
    cluster = clusters.create_cluster(SYSTEM, name="plain", model="qwen2-7b", gpu_type="h20")
    with pytest.raises(ServiceError):
        clusters.add_instance(SYSTEM, cluster.pk, name=name, url="http://127.0.0.1:1", reason="r")
    with pytest.raises(ServiceError):
        policies.create_policy(SYSTEM, cluster.pk, name=name, kind="round_robin")


def test_hostile_strings_run_on_no_page(browser, asgi_server) -> None:
    seeded = [seed(index) for index in range(len(PAYLOADS))]
    page = login(browser, asgi_server.url, "operator", bypass_csp=False)
    dialogs: list[str] = []

    def on_dialog(dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    refused: list[str] = []  # CSP violations: our own pages must need no exception
    page.on(
        "console",
        lambda message: (
            refused.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    outcome = Outcome()  # one page visit per (payload, page): "lost" = anything ran
    try:
        for cluster in seeded:
            for url in pages(asgi_server.url, cluster):
                problem = _visit(page, url, dialogs)
                outcome.add("lost" if problem else "ok", f"{url}: {problem}")
        record(
            "hostile strings in every UI field (chromium, CSP enforced)",
            outcome,
            None,
            f"{len(PAYLOADS)} payloads stored in every free-text field, "
            f"{outcome.sent} page visits; lost = a visit where script ran, a dialog "
            "opened, an inline handler appeared or the page failed",
        )
        assert outcome.lost == 0, outcome.lost_examples
        assert refused == []
        # The canary's action buttons ask first, showing the name as plain text; dismissing
        # the question leaves the canary as it was.
        hostile = PAYLOADS[0]
        page.goto(f"{asgi_server.url}/clusters/{seeded[0].pk}/canary/")
        page.click("button[data-action=start]")
        assert dialogs == [f"start canary {hostile}?"]
        assert page.evaluate("window.__pwned") is None
        assert seeded[0].canaries.get().state == "draft"
        assert page.js_errors == []
    finally:
        page.context.close()


def _visit(page, url: str, dialogs: list[str]) -> str:
    """Open one page; what went wrong there, or "" when nothing ran."""
    response = page.goto(url)
    if response is None or not response.ok:
        return f"status {None if response is None else response.status}"
    csp = response.headers.get("content-security-policy", "")
    if (
        "script-src 'self'" not in csp
        or "unsafe-inline'" in csp.split("script-src")[1].split(";")[0]
    ):
        return f"CSP {csp!r}"
    page.wait_for_load_state("networkidle")
    if page.evaluate("window.__pwned") is not None:
        return "script ran"
    if page.locator("[onerror], [onload], [onclick]").count():
        return "inline handler in the page"
    return f"dialogs {dialogs}" if dialogs else ""


def test_the_admin_shows_hostile_strings_inert_under_the_csp(browser, asgi_server) -> None:
    cluster = seed(1)
    page = login(browser, asgi_server.url, "admin", bypass_csp=False)
    get_user_model().objects.filter(username="e2e-admin").update(is_staff=True, is_superuser=True)
    refused: list[str] = []
    page.on(
        "console",
        lambda message: (
            refused.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    try:
        for path in (
            "/admin/",
            "/admin/controlplane/cluster/",
            f"/admin/controlplane/cluster/{cluster.pk}/change/",
            "/admin/controlplane/canarysplit/",
        ):
            response = page.goto(asgi_server.url + path)
            assert response is not None and response.ok, path
            assert "script-src 'self'" in response.headers["content-security-policy"]
            page.wait_for_load_state("networkidle")
            assert page.evaluate("window.__pwned") is None, path
            assert page.locator("[onerror], [onload]").count() == 0, path
        assert refused == []
    finally:
        page.context.close()
