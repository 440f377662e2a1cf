"""The demo's disaggregated cluster, on a fresh `make demo` stack (`scripts/demo.py` itself):
the OpenAI SDK, unchanged, is served through its router streaming and not, each request
prefilled on a prefill instance and decoded on a decode instance (the router's headers
say where; the engines' own counters confirm both calls), and its live view in chromium
shows the split."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

import engine_interface as ei
from devharness import scrape_total

from .demo_stack import Demo, demo_stack
from .helpers import page_snapshot
from .stack import MODEL, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(600),
]
PREFILL, DECODE = ("pd00", "pd01"), ("pd02", "pd03")


@pytest.fixture
def demo(transactional_db, tmp_path) -> Iterator[Demo]:
    with demo_stack(tmp_path) as stack:
        yield stack


def engine_url(demo: Demo, name: str) -> str:
    """The disaggregated cluster's instance ``name`` (pdNN), at the demo's ports."""
    from controlplane.models import Instance

    assert demo.pd_cluster is not None, demo.banner
    return Instance.objects.get(cluster_id=demo.pd_cluster, name=name).url


def counters(demo: Demo) -> dict[str, tuple[float, float]]:
    """Per instance: requests the engine finished, and KV reads it made."""
    out = {}
    for name in PREFILL + DECODE:
        url = engine_url(demo, name)
        out[name] = (
            scrape_total(url, ei.REQUEST_SUCCESS.total),
            scrape_total(url, ei.NIXL_BYTES.name + "_count"),
        )
    return out


def test_the_openai_sdk_is_served_through_the_disaggregated_cluster(browser, demo) -> None:
    assert demo.pd_cluster is not None, demo.banner
    wait_for(lambda: demo.process.poll() is None, 1, "the demo running")
    client = openai.OpenAI(
        base_url=demo.pd_router + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    before = counters(demo)
    # llm-d's threshold: more than 256 prompt tokens uncached on the decode pool → split
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Plan a two-stage route for this long question. " * 60}
    ]
    whole = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=8
    )
    check_split(whole.headers)
    answer = whole.parse()
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    assert answer.choices[0].message.content

    messages[0]["content"] = "Stream the second half of a long question, please. " * 60
    with client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
    ) as streamed:
        check_split(streamed.headers)
        chunks = list(streamed.parse())
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 10  # the prefill's one token is never relayed
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10

    # The engines' own counters: the prefill pool answered two calls (the prefills), the
    # decode pool answered two and read their KV twice; nothing else was sent to them.
    after = counters(demo)
    finished = {name: after[name][0] - before[name][0] for name in after}
    reads = {name: after[name][1] - before[name][1] for name in after}
    assert sum(finished[n] for n in PREFILL) == 2 and sum(reads[n] for n in PREFILL) == 0
    assert sum(finished[n] for n in DECODE) == 2 and sum(reads[n] for n in DECODE) == 2

    live_view_shows_the_split(browser, demo)


def check_split(headers) -> None:
    assert headers["x-switchyard-stage"] == "decode", dict(headers)
    assert headers["x-switchyard-prefill-instance"] in PREFILL
    assert headers["x-switchyard-instance"] in DECODE


def live_view_shows_the_split(browser, demo: Demo) -> None:
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    try:
        page.goto(f"{demo.url}/login/")
        page.fill("input[name=username]", "operator")
        page.fill("input[name=password]", demo.password)
        page.click("button.primary")
        page.wait_for_url(f"{demo.url}/")
        page.goto(f"{demo.url}/clusters/{demo.pd_cluster}/")
        page.wait_for_selector("#disagg-live:not(.hidden)", timeout=30_000)
        try:
            wait_for(
                lambda: ((page_snapshot(page) or {}).get("disaggregation") or {}).get("split") == 2,
                60,
                "the live view's two splits",
            )
        except AssertionError:
            url = f"{demo.url}/clusters/{demo.pd_cluster}/snapshot.json"
            raise AssertionError(f"{page_snapshot(page)}\n{page.request.get(url).text()}") from None
        assert page.get_by_test_id("split-ratio").inner_text() == "100.0%"
        assert page.get_by_test_id("decider").inner_text().startswith("Decider: prefix_threshold")
    finally:
        context.close()
