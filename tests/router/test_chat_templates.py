"""The router and enginesim render chat requests alike, for three real chat templates.

For ChatML (a Qwen model), Llama 3 (a Llama 3.1 model: both sides pick its template from the
model's name, nobody configures one) and the plain template (loaded from a model's
``tokenizer_config.json`` on both sides), a running enginesim instance and a running router
in front of it see the same conversations: the prompt text the engine renders (``/tokenize``
token strings, joined) is byte for byte what the router's tokenizer renders; with a
``tokenizer.json`` equivalent to the engine's tokenizer (for Llama 3 with its BOS-adding
post-processor) the router's exact tier gives the engine's very token ids, for chat and for
completions with and without ``add_special_tokens`` (the router's count for a routed request
equals the engine's ``usage.prompt_tokens``); and a body neither can render gets the same
400 from both. Both also render, for a few conversations, exactly what vLLM renders,
written out by hand from vLLM's rules (the parity alone would hold for one shared mistake).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from chat_templates import (
    ChatTemplateError,
    TemplateLoadError,
    load_chat_template,
    template_for_model,
)
from chat_templates.renderer import BUILTIN_DIR, ChatTemplate
from devharness import Fleet, free_port
from enginesim.server import tokenizer as engine_tokenizer
from router_worker.contract.config import ConfigError, parse_config
from router_worker.tokenization import PromptError, Tokenizer
from tests.fleets import fast_fleet
from tests.router.helpers import MODEL

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"  # enginesim's llama-3.1-8b serves this name
BOS = "<|begin_of_text|>"
PROMPT = "The cache is warm, the queue is short."

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
    # vLLM: the tokenizer's special tokens on top of the template's (Llama 3: a second BOS)
    {"messages": [{"role": "user", "content": "Hello there"}], "add_special_tokens": True},
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


def engine_equivalent_tokenizer(path: Path, texts: list[str], bos: str = "") -> str:
    """A HF tokenizer.json that tokenizes like enginesim: its piece regex, its piece ids, and
    for a model whose tokenizer adds a BOS, a post-processor adding the engine's BOS ids
    (a real Llama 3 tokenizer.json adds ``<|begin_of_text|>`` the same way)."""
    from tokenizers import Regex, models, pre_tokenizers, processors
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
    if bos:
        special = {
            "id": bos,
            "ids": engine_tokenizer.encode(bos),
            "tokens": engine_tokenizer.split_pieces(bos),
        }
        hf.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[special]
        )
    hf.save(str(path))
    return str(path)


@dataclass
class Setup:
    """One engine and what a router in front of it is configured with."""

    engine: Fleet
    model: str
    chat_template: str | None  # the router's setting; None: derived from the model
    tokenizer_path: str

    def document(self, url: str | None = None) -> dict[str, Any]:
        router: dict[str, Any] = {
            "scrape_interval_s": 0.5,
            "health_interval_s": 0.5,
            "kv_events": False,
            "tokenizer_path": self.tokenizer_path,
        }
        if self.chat_template is not None:
            router["chat_template"] = self.chat_template
        return {
            "cluster": "tpl",
            "model": self.model,
            "instances": [{"name": "i0", "url": url or self.engine.url(0)}],
            "policy": {"kind": "round_robin", "params": {}},
            "router": router,
        }

    def tokenizer(self) -> Tokenizer:
        """The router's tokenizer, as the router builds it from its configuration."""
        settings = parse_config(self.document()).router
        return Tokenizer(settings.tokenizer_path, settings.chat_template)


@pytest.fixture(scope="module")
def setups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Setup]]:
    """template name → Setup; one engine each. Only the plain template is configured:
    ChatML and Llama 3 follow the served model on both sides."""
    directory = tmp_path_factory.mktemp("templates")
    plain_config = str(tokenizer_config(directory, "plain"))
    plans = {  # name: (model, router's chat_template, engine flags, BOS its tokenizer adds)
        "chatml": (MODEL, None, (), ""),
        "llama3": (LLAMA, None, ("--model", "llama-3.1-8b"), BOS),
        "plain": (MODEL, plain_config, ("--chat-template", plain_config), ""),
    }
    texts = [PROMPT, BOS] + [
        load_chat_template(template or template_for_model(model)).render_request(body)
        for model, template, _, _ in plans.values()
        for body in CONVERSATIONS
    ]
    engines: dict[str, Fleet] = {}
    try:
        for name, (_, _, flags, _) in plans.items():
            engines[name] = fast_fleet(1, extra=flags).start()
        yield {
            name: Setup(
                engines[name],
                model,
                template,
                engine_equivalent_tokenizer(directory / f"{name}-tokenizer.json", texts, bos),
            )
            for name, (model, template, _, bos) in plans.items()
        }
    finally:
        for engine in engines.values():
            engine.stop()


def engine_tokenize(engine: Fleet, body: dict[str, Any]) -> tuple[str, list[int]]:
    response = httpx.post(
        engine.url(0) + "/tokenize", json={**body, "return_token_strs": True}, timeout=10
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    return "".join(answer["token_strs"]), answer["tokens"]


def route(router: Any, setup: Setup, path: str, body: dict[str, Any]) -> tuple[str, int]:
    """Send ``body`` through the router: the tier and prompt tokens the router counted,
    checked against the engine's own count (``usage.prompt_tokens``)."""
    response = httpx.post(
        router.url + path, timeout=30, json={"model": setup.model, "max_tokens": 1, **body}
    )
    assert response.status_code == 200, response.text
    routed = router.state()["recent_decisions"][-1]
    assert routed["prompt_tokens"] == response.json()["usage"]["prompt_tokens"], body
    return routed["tier"], routed["prompt_tokens"]


@pytest.mark.parametrize("name", ["chatml", "llama3", "plain"])
def test_router_and_engine_render_the_same_bytes_and_token_ids(setups, router_factory, name):
    setup = setups[name]
    router_tokenizer = setup.tokenizer()
    router = router_factory(setup.document())
    for body in CONVERSATIONS:
        engine_text, engine_ids = engine_tokenize(setup.engine, body)
        special = body.get("add_special_tokens", False)
        if not special:  # with it, the engine's token strings start with what it added
            assert router_tokenizer.render(body).encode() == engine_text.encode(), body
        ids, tier = router_tokenizer.encode_chat_body(body, add_special_tokens=special)
        assert tier == "exact" and [int(i) for i in ids] == engine_ids, body
        assert route(router, setup, "/v1/chat/completions", body) == ("exact", len(engine_ids))


# What vLLM renders for CONVERSATIONS[0, 1, 3, 5] with each template, written out by hand
# from its rules (vllm/entrypoints/chat_utils.py, then transformers' apply_chat_template):
# a template that reads message['content'] as a string gets the text parts (and bare
# strings) joined with "\n", None as ""; chat completions add the generation prompt unless
# told not to; continue_final_message cuts the render right after the final message's
# (stripped) content; the template's own text is rendered as jinja reads it ({{- -}} and
# {%- -%} eat the whitespace around them).
HEAD = "<|start_header_id|>{}<|end_header_id|>\n\n"
MULTIPART = "first part\na bare string part\nthird, after a newline"
VLLM_RENDERS: dict[str, dict[int, str]] = {
    "chatml": {
        0: "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
        1: "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\n  Why is the sky blue?  <|im_end|>\n<|im_start|>assistant\n",
        3: f"<|im_start|>user\n{MULTIPART}<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n",
        5: "<|im_start|>user\nFinish my sentence<|im_end|>\n<|im_start|>assistant\nThe cache is",
    },
    "llama3": {
        0: f"{BOS}{HEAD.format('user')}Hello there<|eot_id|>{HEAD.format('assistant')}",
        1: f"{BOS}{HEAD.format('system')}You are terse.<|eot_id|>"
        f"{HEAD.format('user')}Why is the sky blue?<|eot_id|>{HEAD.format('assistant')}",
        3: f"{BOS}{HEAD.format('user')}{MULTIPART}<|eot_id|>{HEAD.format('assistant')}"
        f"<|eot_id|>{HEAD.format('tool')}42<|eot_id|>{HEAD.format('assistant')}",
        5: f"{BOS}{HEAD.format('user')}Finish my sentence<|eot_id|>"
        f"{HEAD.format('assistant')}The cache is",
    },
    "plain": {
        0: "user: Hello there\nassistant: ",
        1: "system: You are terse.\nuser:   Why is the sky blue?  \nassistant: ",
        3: f"user: {MULTIPART}\nassistant: \ntool: 42\nassistant: ",
        5: "user: Finish my sentence\nassistant: The cache is",
    },
}


@pytest.mark.parametrize("name", ["chatml", "llama3", "plain"])
def test_router_and_engine_render_what_vllm_renders(setups, name):
    """Both sides against expectations written independently of the shared renderer."""
    setup = setups[name]
    router_tokenizer = setup.tokenizer()
    for index, expected in VLLM_RENDERS[name].items():
        body = CONVERSATIONS[index]
        assert router_tokenizer.render(body) == expected, (index, body)
        assert engine_tokenize(setup.engine, body)[0] == expected, (index, body)


@pytest.mark.parametrize("name", ["chatml", "llama3"])
def test_completions_add_special_tokens_as_the_engine_does(setups, router_factory, name):
    """vLLM's completions add the tokenizer's special tokens unless told not to: Llama 3's
    tokenizer puts its BOS first, Qwen's adds nothing. Token ids are never added to."""
    setup = setups[name]
    router_tokenizer = setup.tokenizer()
    router = router_factory(setup.document())
    engine_ids = {}
    for special in (None, True, False):
        body: dict[str, Any] = {"prompt": PROMPT}
        if special is not None:
            body["add_special_tokens"] = special
        engine_ids[special] = engine_tokenize(setup.engine, body)[1]
        ids, tier = router_tokenizer.encode_text(PROMPT, add_special_tokens=special is not False)
        assert tier == "exact" and [int(i) for i in ids] == engine_ids[special], body
        assert route(router, setup, "/v1/completions", body) == ("exact", len(ids))
        as_ids = {**body, "prompt": [5, 6, 7]}
        assert route(router, setup, "/v1/completions", as_ids) == ("ids", 3)
    added = engine_tokenizer.encode(BOS) if name == "llama3" else []
    assert engine_ids[None] == engine_ids[True] == added + engine_ids[False]


def test_templates_differ_where_the_formats_do(setups):
    """Guards the parity test from passing on three copies of one format."""
    body = CONVERSATIONS[1]
    texts = {
        name: engine_tokenize(setups[name].engine, body)[0]
        for name in ("chatml", "llama3", "plain")
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
    setup = setups[name]
    engine = setup.engine
    nowhere = f"http://127.0.0.1:{free_port()}"
    router = router_factory(setup.document(nowhere))
    cases = [*INVALID, WIZARD] if name == "plain" else INVALID
    for body in cases:
        document = {"model": setup.model, "max_tokens": 1, **body}
        from_router = httpx.post(router.url + "/v1/chat/completions", json=document, timeout=10)
        from_engine = httpx.post(engine.url(0) + "/v1/chat/completions", json=document, timeout=10)
        assert from_router.status_code == from_engine.status_code == 400, body
        assert from_router.json() == from_engine.json(), body
        assert from_router.json()["error"]["param"] is not None
    if name == "chatml":  # the template takes any role: the router lets it through
        document = {"model": setup.model, "max_tokens": 1, **WIZARD}
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
    document: dict[str, Any] = {
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


def configured_template(model: str | None, **router: Any) -> str:
    document = {
        "model": model,
        "instances": [{"name": "i0", "url": "http://127.0.0.1:1"}],
        "policy": {"kind": "round_robin", "params": {}},
        "router": router,
    }
    return parse_config(document).router.chat_template


def test_an_unset_template_follows_the_model_and_a_set_one_wins():
    """A managed router's config names the model and no template: it must still render
    Llama 3's format for a Llama 3 model."""
    assert configured_template(LLAMA) == "llama3"
    rendered = Tokenizer(None, configured_template(LLAMA)).render(CONVERSATIONS[0])
    assert rendered == load_chat_template("llama3").render_request(CONVERSATIONS[0])
    assert rendered.startswith(BOS + "<|start_header_id|>user<|end_header_id|>\n\nHello")
    assert configured_template(LLAMA, chat_template=None) == "llama3"
    assert configured_template(LLAMA, chat_template="chatml") == "chatml"
    assert configured_template(MODEL, chat_template="llama3") == "llama3"
    for llama3 in ("Meta-Llama-3-8B-Instruct", "meta-llama/Llama-3.3-70B-Instruct", "llama3.1:8b"):
        assert configured_template(llama3) == "llama3", llama3
    others = [
        "Qwen/Qwen3-8B",
        "qwen2-7b",
        None,
        "meta-llama/Llama-2-7b-chat-hf",  # other formats, though named Llama
        "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "huggyllama/llama-30b",
        "NousResearch/Hermes-3-Llama-3.1-8B",  # a fine-tune that speaks ChatML
        "mistralai/Mistral-7B-Instruct-v0.3",
    ]
    for model in others:
        assert configured_template(model) == "chatml", model


# Templates reaching for Python's internals or mutating what they are given.
ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ raise_exception.__globals__['__builtins__'] }}",
    "{% set _ = messages.append({'role': 'system', 'content': 'injected'}) %}{{ messages }}",
    "{{ messages[0].update({'content': 'rewritten'}) }}{{ messages }}",
    "{% set _ = tools.clear() %}",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_the_sandbox_refuses_templates_reaching_for_python_internals(tmp_path, source):
    jinja = tmp_path / "escape.jinja"
    jinja.write_text(source)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": source, "bos_token": "<s>"}))
    messages = [{"role": "user", "content": "x"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    for spec in (str(jinja), str(config)):
        with pytest.raises(ChatTemplateError, match=r"SecurityError: .* is unsafe") as caught:
            load_chat_template(spec).render(messages, tools=tools)
        assert caught.value.param == "messages"
        assert messages == [{"role": "user", "content": "x"}]
        assert tools == [{"type": "function", "function": {"name": "f"}}]
        with pytest.raises(PromptError, match="unsafe"):  # the router's 400
            Tokenizer(None, spec).render({"messages": messages, "tools": tools})


def test_the_sandbox_reads_internals_as_undefined():
    """One step in, an internal reads as undefined and renders empty (as in transformers,
    whose output the router must match byte for byte): nothing of Python shows."""
    leaky = ChatTemplate.compile(
        "t", "[{{ ''.__class__ }}{{ raise_exception.__globals__ }}{{ '{0.__class__}'.format(1) }}]"
    )
    assert leaky.render([{"role": "user", "content": "x"}]) == "[]"


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
    """router_worker and enginesim's server may not import each other; both may
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
