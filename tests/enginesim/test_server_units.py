"""Pure pieces of enginesim's HTTP server: tokenizer, chat template, wire encodings."""

from __future__ import annotations

import asyncio

import pytest

from chat_templates import template_for_model
from engine_interface.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, encode_event
from enginesim.engine.models import MODELS
from enginesim.server import chat, tokenizer
from enginesim.server.driver import VirtualClock
from enginesim.server.faults import FaultError, FaultRequest
from enginesim.server.kv_events import instance_endpoints
from enginesim.server.metrics import buckets_1_2_5
from enginesim.server.openai_api import APIError, ChunkRenderer, parse_chat, parse_completion


def test_pieces_cover_the_text_exactly():
    text = "Hello, world!  foo_bar\n\t<|im_start|>user\nHi 42 héllo"
    pieces = tokenizer.split_pieces(text)
    assert "".join(pieces) == text
    assert pieces[:4] == ["Hello", ",", " world", "!"]
    assert tokenizer.encode("<|im_start|><|im_end|>") == [151644, 151645]


def test_generated_text_tokenizes_back_to_the_generated_ids():
    gen = tokenizer.SyntheticText(12345)
    assert tokenizer.encode(gen.text(0, 50)) == gen.token_ids(0, 50)
    assert gen.text(0, 10) + gen.text(10, 20) == gen.text(0, 20)
    assert tokenizer.SyntheticText(12346).text(0, 20) != gen.text(0, 20)


def test_follow_up_turn_extends_previous_prompt_and_answer():
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]
    prompt1 = tokenizer.encode(chat.render_chat(first))
    answer = tokenizer.SyntheticText(tokenizer.prompt_seed(prompt1))
    follow = [*first, {"role": "assistant", "content": answer.text(0, 30)},
              {"role": "user", "content": "And then?"}]  # fmt: skip
    prompt2 = tokenizer.encode(chat.render_chat(follow))
    assert prompt2[: len(prompt1) + 30] == prompt1 + answer.token_ids(0, 30)


def test_roles_are_the_templates_to_judge():
    wizard = [{"role": "wizard", "content": "x"}]
    assert chat.render_chat(wizard).startswith("<|im_start|>wizard\n")  # as Qwen's template
    with pytest.raises(chat.ChatTemplateError, match="Unknown role"):
        chat.render_chat(wizard, template=chat.model_template("qwen2-7b", "plain"))


def test_each_model_renders_its_own_family_by_default():
    user = [{"role": "user", "content": "hi"}]
    assert chat.model_template("qwen2-7b").render(user).startswith("<|im_start|>user")
    assert (
        chat.model_template("llama-3.1-8b")
        .render(user)
        .startswith("<|begin_of_text|><|start_header_id|>user")
    )


def test_a_model_key_and_its_served_name_make_one_template_family():
    """enginesim picks the template from the model key, a router from the served name."""
    for key, spec in MODELS.items():
        assert template_for_model(key) == template_for_model(spec.served_name), key
    assert template_for_model("llama-3.1-8b") == "llama3"


def test_add_special_tokens_puts_the_models_bos_before_a_text_prompt():
    """As vLLM with Llama 3's tokenizer: completions get the BOS unless told not to, chat
    only when asked (its template wrote one), token ids never; Qwen adds nothing."""
    bos = tokenizer.added_bos("llama-3.1-8b")
    assert bos == "<|begin_of_text|>" and tokenizer.added_bos("qwen2-7b") == ""
    bos_ids, text_ids = tokenizer.encode(bos), tokenizer.encode("a b")

    def completion(**body):
        return parse_completion(body, "m", 100, bos=bos).prompt_token_ids

    assert completion(prompt="a b") == completion(prompt="a b", add_special_tokens=True)
    assert completion(prompt="a b") == bos_ids + text_ids
    assert completion(prompt="a b", add_special_tokens=False) == text_ids
    assert completion(prompt=[1, 2], add_special_tokens=True) == [1, 2]
    assert parse_completion({"prompt": "a b"}, "m", 100).prompt_token_ids == text_ids
    user = {"messages": [{"role": "user", "content": "hi"}]}
    llama = chat.model_template("llama-3.1-8b")
    rendered = tokenizer.encode(llama.render_request(user))
    assert rendered[: len(bos_ids)] == bos_ids  # the template's own BOS: the same ids
    assert parse_chat(user, "m", 1000, llama, bos).prompt_token_ids == rendered
    with_bos = parse_chat({**user, "add_special_tokens": True}, "m", 1000, llama, bos)
    assert with_bos.prompt_token_ids == bos_ids + rendered
    for bad in ("yes", None, 1):
        with pytest.raises(APIError) as caught:
            completion(prompt="a", add_special_tokens=bad)
        assert caught.value.status == 400 and caught.value.param == "add_special_tokens"


def test_block_stored_array_encoding_follows_vllm_field_order():
    event = BlockStored((11, 12), 10, tuple(range(32)), 16)
    assert encode_event(event, medium="GPU") == [
        "BlockStored", [11, 12], 10, list(range(32)), 16, None, "GPU", None,
    ]  # fmt: skip
    assert encode_event(BlockRemoved((11,)), medium="GPU") == ["BlockRemoved", [11], "GPU"]
    assert encode_event(AllBlocksCleared()) == ["AllBlocksCleared"]


def test_map_encoding_names_every_field():
    encoded = encode_event(BlockStored((11,), None, tuple(range(16)), 16), positional=False)
    assert encoded["type"] == "BlockStored"
    assert encoded["block_hashes"] == [11]
    assert encoded["parent_block_hash"] is None
    assert encoded["token_ids"] == list(range(16))
    assert encoded["block_size"] == 16
    assert encode_event(AllBlocksCleared(), positional=False) == {"type": "AllBlocksCleared"}


def test_instance_endpoints_offset_pub_and_replay_ports():
    assert instance_endpoints("tcp://127.0.0.1:5557", 3) == (
        "tcp://127.0.0.1:5560", "tcp://127.0.0.1:5660",
    )  # fmt: skip
    with pytest.raises(ValueError):
        instance_endpoints("ipc:///tmp/x", 0)


def test_vllm_token_buckets():
    assert buckets_1_2_5(100) == [1, 2, 5, 10, 20, 50, 100]
    assert buckets_1_2_5(32768)[-1] == 20000


def test_virtual_clock_runs_slower_after_a_slow_fault():
    wall = [100.0]
    clock = VirtualClock(2.0, wall=lambda: wall[0])
    wall[0] = 104.0
    assert clock.now() == pytest.approx(2.0)
    clock.set_wall_per_virtual(20.0)
    wall[0] = 124.0
    assert clock.now() == pytest.approx(3.0)
    assert clock.wall_delay(0.5) == pytest.approx(10.0)


def test_fault_requests_are_validated():
    assert FaultRequest.from_json({"mode": "slow", "factor": 3}).factor == 3.0
    expected = (2, FaultRequest("drop_midstream", 1.0, 4))
    assert FaultRequest.from_cli("2:drop_midstream:4") == expected
    with pytest.raises(FaultError):
        FaultRequest.from_json({"mode": "explode"})
    with pytest.raises(FaultError):
        FaultRequest.from_json({"mode": "slow", "factor": 0})


def test_request_parsing_mirrors_vllm_limits():
    req = parse_completion({"prompt": [1, 2, 3], "max_tokens": 4}, "m", 100)
    assert (req.prompt_token_ids, req.max_tokens, req.natural_stop) == ([1, 2, 3], 4, False)
    assert parse_completion({"prompt": "a b"}, "m", 100).max_tokens == 16
    chat_req = parse_chat({"messages": [{"role": "user", "content": "hi"}]}, "m", 1000)
    assert chat_req.natural_stop and 16 <= chat_req.max_tokens <= 256
    with pytest.raises(APIError) as not_found:
        parse_completion({"model": "other", "prompt": "x"}, "m", 100)
    assert not_found.value.status == 404
    with pytest.raises(APIError) as too_long:
        parse_completion({"prompt": [1] * 90, "max_tokens": 20}, "m", 100)
    assert too_long.value.status == 400
    assert too_long.value.body()["error"]["type"] == "BadRequestError"


def test_chunk_renderer_emits_valid_json_events():
    import json

    renderer = ChunkRenderer("chat", "chatcmpl-1", 7, "m")
    chunk = renderer.content_chunk(' "quoted"\n', "length")
    assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
    body = json.loads(chunk[6:])
    assert body["choices"][0]["delta"] == {"content": ' "quoted"\n'}
    assert body["choices"][0]["finish_reason"] == "length"
    usage = json.loads(renderer.usage_chunk({"prompt_tokens": 1})[6:])
    assert usage["choices"] == [] and usage["object"] == "chat.completion.chunk"


def test_request_stream_wakes_waiters():
    from enginesim.server.driver import RequestStream

    async def scenario() -> int:
        stream = RequestStream("r", 3, 5, False, 0.0)
        waiter = asyncio.ensure_future(stream.wait_beyond(0))
        await asyncio.sleep(0)
        stream.num_output_tokens = 2
        stream.notify()
        await asyncio.wait_for(waiter, 1.0)
        return stream.num_output_tokens

    assert asyncio.run(scenario()) == 2


def test_synthetic_answer_ids_vectorised_agree_with_the_reference():
    for seed in (0, 1, 2**32 - 1, 987654321):
        text = tokenizer.SyntheticText(seed)
        assert text.token_id_array(0, 300).tolist() == text.token_ids(0, 300)
        assert text.token_id_array(5, 5).tolist() == []
