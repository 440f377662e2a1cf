"""The router and enginesim render chat requests alike, for three real chat templates.

For ChatML (enginesim's default for Qwen), Llama 3 (``--chat-template llama3``) and the
plain template (loaded from a model's ``tokenizer_config.json`` on both sides), a running
enginesim instance and a running router in front of it see the same conversations:
the prompt text the engine renders (``/tokenize`` token strings, joined) is byte for byte
what the router's configured tokenizer renders; with a ``tokenizer.json`` equivalent to the
engine's tokenizer the router's exact tier gives the engine's very token ids (the router's
count for a routed request equals the engine's ``usage.prompt_tokens``); and a body neither
can render gets the same 400 from both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chat_templates import TemplateLoadError, load_chat_template
from chat_templates.renderer import BUILTIN_DIR, ChatTemplate
from devharness import free_port
from enginesim.server import tokenizer as engine_tokenizer
from router_worker.config import ConfigError, parse_config
from router_worker.tokenization import PromptError, Tokenizer
from tests.enginesim.conftest import SimServer, start_server, stop_server
from tests.router.conftest import MODEL

SYSTEM = {"role": "system", "content": "You are terse."}
CONVERSATIONS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hello there"}]},
    {"messages": [SYSTEM, {"role": "user", "content": "  Why is the sky blue?  "}]},
    {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": " seven"},
            {"role": "user", "content": "Another, please: héllo, naïve 数字"},
        ]
    },
    {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "first part"},
                    "a bare string part",
                    {"type": "text", "text": "third, after a newline"},
                ],
            },
            {"role": "assistant", "content": None},
            {"role": "tool", "content": [{"type": "text", "text": "42"}]},
        ]
    },
    {
        "messages": [
            {"role": "user", "content": "Finish my sentence"},
            {"role": "assistant", "content": "The cache is"},
        ],
        "add_generation_prompt": False,
    },
    {
        "messages": [
            {"role": "user", "content": "Finish my sentence"},
            {"role": "assistant", "content": "The cache is"},
        ],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
INVALID: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]}]},
    {"messages": [{"role": "user", "content": 7}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": ["x"]}]}]},
    {"messages": [{"role": 3, "content": "x"}]},
    {"messages": []},
    {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"},
    {"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": True},
]
# The plain template refuses roles it does not know (raise_exception); ChatML takes any.
WIZARD = {"messages": [{"role": "wizard", "content": "abracadabra"}]}


def tokenizer_config(directory: Path, name: str) -> Path:
    """A model's tokenizer_config.json holding one of our templates (bos as an added-token
    object, the way Llama's config gives it)."""
    path = directory / f"{name}-tokenizer_config.json"
    path.write_text(
        json.dumps(
            {
                "chat_template": (BUILTIN_DIR / f"{name}.jinja").read_text(),
                "bos_token": {"content": "<|begin_of_text|>", "special": True},
                "eos_token": "<|eot_id|>",
                "model_max_length": 131072,
            }
        )
    )
    return path


def engine_equivalent_tokenizer(directory: Path, texts: list[str]) -> str:
    """A HF tokenizer.json that tokenizes like enginesim: its piece regex, its piece ids."""
    from tokenizers import Regex, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {
        piece: engine_tokenizer.piece_id(piece)
        for text in texts
        for piece in engine_tokenizer.split_pieces(text)
    }
    vocab["[UNK]"] = engine_tokenizer.VOCAB_SIZE + 100
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Split(
        Regex(engine_tokenizer._PIECE_RE.pattern), behavior="isolated"
    )
    path = directory / "tokenizer.json"
    hf.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def setups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """template name → (engine, the router's chat_template setting); one engine each."""
    directory = tmp_path_factory.mktemp("templates")
    plain_config = str(tokenizer_config(directory, "plain"))
    specs = {
        "chatml": ("chatml", ()),
        "llama3": ("llama3", ("--chat-template", "llama3")),
        "plain": (plain_config, ("--chat-template", plain_config)),
    }
    texts = [
        Tokenizer(None, spec).render(body) for spec, _ in specs.values() for body in CONVERSATIONS
    ]
    tokenizer_path = engine_equivalent_tokenizer(directory, texts)
    engines: dict[str, SimServer] = {}
    try:
        for name, (_, flags) in specs.items():
            engines[name] = start_server(1, False, *flags)
        yield {name: (engines[name], spec) for name, (spec, _) in specs.items()} | {
            "tokenizer_path": tokenizer_path
        }
    finally:
        for engine in engines.values():
            stop_server(engine)


def router_document(url: str, chat_template: str, tokenizer_path: str) -> dict[str, Any]:
    return {
        "cluster": "tpl",
        "model": MODEL,
        "instances": [{"name": "i0", "url": url}],
        "policy": {"kind": "round_robin", "params": {}},
        "router": {
            "scrape_interval_s": 0.5,
            "health_interval_s": 0.5,
            "kv_events": False,
            "tokenizer_path": tokenizer_path,
            "chat_template": chat_template,
        },
    }


def engine_tokenize(engine: SimServer, body: dict[str, Any]) -> tuple[str, list[int]]:
    response = httpx.post(
        engine.url(0) + "/tokenize", json={**body, "return_token_strs": True}, timeout=10
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    return "".join(answer["token_strs"]), answer["tokens"]


@pytest.mark.parametrize("name", ["chatml", "llama3", "plain"])
def test_router_and_engine_render_the_same_bytes_and_token_ids(setups, router_factory, name):
    engine, spec = setups[name]
    router_tokenizer = Tokenizer(setups["tokenizer_path"], spec)
    router = router_factory(router_document(engine.url(0), spec, setups["tokenizer_path"]))
    for body in CONVERSATIONS:
        engine_text, engine_ids = engine_tokenize(engine, body)
        assert router_tokenizer.render(body).encode() == engine_text.encode(), body
        ids, tier = router_tokenizer.encode_chat_body(body)
        assert tier == "exact" and [int(i) for i in ids] == engine_ids, body
        response = httpx.post(
            router.url + "/v1/chat/completions",
            timeout=30,
            json={"model": MODEL, "max_tokens": 1, **body},
        )
        assert response.status_code == 200, response.text
        routed = router.state()["recent_decisions"][-1]
        assert routed["tier"] == "exact"
        assert (
            routed["prompt_tokens"] == response.json()["usage"]["prompt_tokens"] == len(engine_ids)
        ), body


def test_templates_differ_where_the_formats_do(setups):
    """Guards the parity test from passing on three copies of one format."""
    body = CONVERSATIONS[1]
    texts = {
        name: engine_tokenize(setups[name][0], body)[0] for name in ("chatml", "llama3", "plain")
    }
    assert texts["chatml"] == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>"
        "user\n  Why is the sky blue?  <|im_end|>\n<|im_start|>assistant\n"
    )
    assert texts["llama3"] == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse."
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhy is the sky blue?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert texts["plain"] == ("system: You are terse.\nuser:   Why is the sky blue?  \nassistant: ")


@pytest.mark.parametrize("name", ["chatml", "plain"])
def test_invalid_bodies_get_the_same_400_from_router_and_engine(setups, router_factory, name):
    """The router refuses these itself: it fronts a port nobody listens on, so a body it let
    through would come back 502/503, never the engine's 400."""
    engine, spec = setups[name]
    nowhere = f"http://127.0.0.1:{free_port()}"
    router = router_factory(router_document(nowhere, spec, setups["tokenizer_path"]))
    cases = [*INVALID, WIZARD] if name == "plain" else INVALID
    for body in cases:
        document = {"model": MODEL, "max_tokens": 1, **body}
        from_router = httpx.post(router.url + "/v1/chat/completions", json=document, timeout=10)
        from_engine = httpx.post(engine.url(0) + "/v1/chat/completions", json=document, timeout=10)
        assert from_router.status_code == from_engine.status_code == 400, body
        assert from_router.json() == from_engine.json(), body
        assert from_router.json()["error"]["param"] is not None
    if name == "chatml":  # the template takes any role: the router lets it through
        document = {"model": MODEL, "max_tokens": 1, **WIZARD}
        assert (
            httpx.post(
                engine.url(0) + "/v1/chat/completions", json=document, timeout=10
            ).status_code
            == 200
        )
        assert httpx.post(
            router.url + "/v1/chat/completions", json=document, timeout=10
        ).status_code in (502, 503)


# ----- loading (no processes) --------------------------------------------------------------


def test_a_tokenizer_config_renders_like_the_builtin_with_its_special_tokens(tmp_path):
    from_config = load_chat_template(str(tokenizer_config(tmp_path, "llama3")))
    for body in CONVERSATIONS:
        assert from_config.render_request(body) == load_chat_template("llama3").render_request(body)
    named = tmp_path / "named.json"
    named.write_text(
        json.dumps(
            {
                "chat_template": [
                    {"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                    {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"},
                ],
                "bos_token": "<s>",
            }
        )
    )
    assert load_chat_template(str(named)).render([{"role": "user", "content": "x"}]) == "<s>x"


def test_content_format_follows_the_template_like_vllms_auto_mode():
    looping = ChatTemplate.compile(
        "t",
        "{% for m in messages %}{% for p in m['content'] "
        "| selectattr('type', 'equalto', 'text') %}"
        "[{{ p['text'] }}]{% endfor %}{% endfor %}",
    )
    assert looping.content_format == "openai"
    assert load_chat_template("chatml").content_format == "string"
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, "b"]},
        {"role": "user", "content": "c"},
    ]
    assert looping.render(parts) == "[a][b][c]"
    assert load_chat_template("plain").render(parts) == "user: a\nb\nuser: c\nassistant: "


def test_bad_template_settings_are_refused_with_the_field_named(tmp_path):
    document = {
        "cluster": "c",
        "model": MODEL,
        "instances": [{"name": "i0", "url": "http://127.0.0.1:1"}],
        "policy": {"kind": "round_robin", "params": {}},
        "router": {"chat_template": "chatlm"},
    }
    with pytest.raises(ConfigError, match="chat_template"):
        parse_config(document)
    document["router"]["chat_template"] = "llama3"
    assert parse_config(document).router.chat_template == "llama3"
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    no_template = tmp_path / "tokenizer_config.json"
    no_template.write_text(json.dumps({"bos_token": "<s>"}))
    for spec, why in [
        (str(tmp_path / "missing.json"), "readable"),
        (str(broken), "line 1"),
        (str(no_template), "no `chat_template`"),
    ]:
        with pytest.raises(TemplateLoadError, match=why):
            Tokenizer(None, spec)


def test_template_errors_reach_the_router_as_prompt_errors_naming_the_field():
    tokenizer = Tokenizer(None, "chatml")
    with pytest.raises(PromptError) as caught:
        tokenizer.render({"messages": [{"role": "user", "content": [IMAGE]}]})
    assert caught.value.param == "messages" and "image_url" in str(caught.value)
    with pytest.raises(PromptError) as caught:
        tokenizer.render(
            {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]}
        )
    assert caught.value.param == "chat_template_kwargs"


def test_the_shared_renderer_imports_neither_side():
    """DESIGN.md: router_worker and enginesim's server may not import each other; both may
    import chat_templates only because it imports neither (nor Django)."""
    import subprocess
    import sys

    code = (
        "import sys, chat_templates; chat_templates.load_chat_template('llama3'); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'router_worker', 'enginesim', 'django', 'controlplane'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    ).stdout
    assert out.strip() == "[]"
