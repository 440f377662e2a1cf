"""The router honours a request's ``add_special_tokens`` with vLLM's defaults (no processes).

vLLM's completions request defaults it to true (the tokenizer adds e.g. Llama 3's
``<|begin_of_text|>``), its chat request to false (the template already wrote the BOS).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from router_worker.errors import APIError
from router_worker.intake import IntakeSettings, take_in, take_in_with
from router_worker.tokenization import Tokenizer

BOS_ID = 9


@pytest.fixture(scope="module")
def llama_like(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny tokenizer.json whose post-processor adds a BOS, as Llama 3's does."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "user": 1, "hello": 2, "world": 3, ":": 4, "assistant": 5, "<s>": BOS_ID}
    tiny = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tiny.pre_tokenizer = pre_tokenizers.Whitespace()
    tiny.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", BOS_ID)]
    )
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tiny.save(str(path))
    return str(path)


def prompt_tokens(tokenizer: Tokenizer, endpoint: Any, **body: Any) -> int:
    raw = json.dumps({"model": "m", **body}).encode()
    return take_in(raw, endpoint, tokenizer, block_size=16).prompt_tokens


def test_completions_add_the_tokenizers_bos_unless_told_not_to(llama_like):
    tokenizer = Tokenizer(llama_like, "plain")

    def count(prompt: Any, **special: bool) -> int:
        return prompt_tokens(tokenizer, "completions", prompt=prompt, **special)

    assert count("hello world") == count("hello world", add_special_tokens=True) == 3
    assert count("hello world", add_special_tokens=False) == 2
    assert count(["hello world", "x"]) == 3
    # token ids are the prompt as the engine will see it: nothing is added
    assert count([2, 3], add_special_tokens=True) == 2
    ids, tier = tokenizer.encode_text("hello world", add_special_tokens=True)
    assert tier == "exact" and [int(i) for i in ids] == [BOS_ID, 2, 3]


def test_chat_adds_nothing_unless_asked(llama_like):
    tokenizer = Tokenizer(llama_like, "plain")  # "user: hello\nassistant: ": 5 tokens
    messages = [{"role": "user", "content": "hello"}]
    assert prompt_tokens(tokenizer, "chat", messages=messages) == 5
    assert prompt_tokens(tokenizer, "chat", messages=messages, add_special_tokens=False) == 5
    assert prompt_tokens(tokenizer, "chat", messages=messages, add_special_tokens=True) == 6


def test_the_approx_tier_has_no_special_tokens_to_add():
    tokenizer = Tokenizer()
    counts = {
        prompt_tokens(tokenizer, "completions", prompt="hello world", add_special_tokens=flag)
        for flag in (True, False)
    }
    assert counts == {3}


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_non_boolean_add_special_tokens_is_a_400_naming_it(llama_like, endpoint, value):
    body = {"prompt": "hello"} if endpoint == "completions" else {"messages": [{"role": "user"}]}
    raw = json.dumps({"model": "m", "add_special_tokens": value, **body}).encode()
    with pytest.raises(APIError) as caught:
        take_in(raw, endpoint, Tokenizer(llama_like, "plain"), block_size=16)
    assert caught.value.status == 400
    assert caught.value.param == "add_special_tokens"
    assert "boolean" in caught.value.message


def test_a_worker_process_takes_the_field_in_alike(llama_like):
    """Big bodies are taken in by worker processes (take_in_with): same tokens."""
    settings = IntakeSettings(llama_like, "plain", 16)
    raw = json.dumps({"model": "m", "prompt": "hello world"}).encode()
    assert take_in_with(raw, "completions", settings).prompt_tokens == 3
