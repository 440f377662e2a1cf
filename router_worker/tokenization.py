"""Prompt → token ids, in three tokenization modes, plus the chat template.

1. ``ids``: a completions ``prompt`` given as token ids is used as it is.
2. ``exact``: a local HF ``tokenizer.json`` (``tokenizers`` package) configured with
   ``router.tokenizer_path``; chat messages are rendered with the configured template first.
3. ``approx``: a deterministic chunker. The UTF-8 bytes of the text are cut into
   4-byte chunks and each chunk read as one little-endian uint32 "token" (the last
   chunk zero-padded). **Ratio: 4 bytes per token**, i.e. about 4 characters of
   English text, close to what BPE tokenizers give (≈ 4 chars/token). Two texts
   sharing a prefix share the token ids of that prefix (up to the last full chunk),
   which is all prefix-aware routing needs; token counts are estimates. It costs a
   few µs for a long prompt (one ``numpy.frombuffer``).

Chat templates (:mod:`chat_templates`, shared with enginesim): ``router.chat_template``
names a built-in (``chatml``, Qwen's format; ``llama3``; ``plain``; when unset, the one of
the config's ``model`` family, else ``chatml``) or the path of the model's
``tokenizer_config.json`` (its ``chat_template`` and special tokens) or of a ``.jinja``
file, and chat requests are rendered with it exactly as vLLM renders them
(``add_generation_prompt``, ``continue_final_message``, ``tools``, ``documents`` and
``chat_template_kwargs`` included). Messages the template cannot render are a 400 naming the
field, the same 400 the engine gives. The exact mode is exact for any model whose
``tokenizer.json`` and template are configured.

Special tokens, as vLLM's ``add_special_tokens`` (completions: true by default, chat: false,
since the template writes them): the exact mode lets the ``tokenizer.json`` add what it adds
(its post-processor: Llama 3's puts ``<|begin_of_text|>`` first, Qwen's adds nothing). The
approx mode has no vocabulary and adds nothing; token ids are used as given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from chat_templates import DEFAULT_TEMPLATE, ChatTemplateError, load_chat_template

BYTES_PER_TOKEN = 4
TokenizationMode = Literal["ids", "exact", "approx"]


class PromptError(ValueError):
    """The prompt or messages have the wrong shape; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def approx_token_ids(text: str) -> np.ndarray:
    """Mode 3 (``approx``): 4-byte chunks of the UTF-8 text as uint32 ids (see module docstring)."""
    data = text.encode("utf-8", "surrogatepass")
    pad = -len(data) % BYTES_PER_TOKEN
    if pad:
        data += b"\0" * pad
    return np.frombuffer(data, dtype="<u4")


class Tokenizer:
    """Chooses the tokenization mode and produces token ids for completions prompts and chat
    messages."""

    def __init__(
        self, tokenizer_path: str | None = None, chat_template: str = DEFAULT_TEMPLATE
    ) -> None:
        self.path = tokenizer_path
        self.chat_template = chat_template
        self.template = load_chat_template(chat_template)
        self._exact = None
        if tokenizer_path:
            from tokenizers import Tokenizer as HFTokenizer

            self._exact = HFTokenizer.from_file(tokenizer_path)

    def encode_text(self, text: str, *, add_special_tokens: bool) -> tuple[Any, TokenizationMode]:
        if self._exact is not None:
            ids = self._exact.encode(text, add_special_tokens=add_special_tokens).ids
            return np.asarray(ids, dtype=np.uint64), "exact"
        return approx_token_ids(text), "approx"

    def render(self, body: Mapping[str, Any]) -> str:
        """The prompt text of a chat request body (raises :class:`PromptError`)."""
        try:
            return self.template.render_request(body)
        except ChatTemplateError as error:
            raise PromptError(error.message, error.param) from None

    def encode_chat_body(
        self, body: Mapping[str, Any], *, add_special_tokens: bool = False
    ) -> tuple[Any, TokenizationMode]:
        return self.encode_text(self.render(body), add_special_tokens=add_special_tokens)

    def encode_chat(self, messages: Sequence[Any]) -> tuple[Any, TokenizationMode]:
        return self.encode_chat_body({"messages": messages})

    def encode_prompt(
        self, prompt: Any, *, add_special_tokens: bool
    ) -> tuple[Any, TokenizationMode]:
        """A completions ``prompt`` the intake has checked (text, token ids, or a batch of
        either); a batch is routed by its first item."""
        if isinstance(prompt, str):
            return self.encode_text(prompt, add_special_tokens=add_special_tokens)
        first = prompt[0]
        if isinstance(first, str):
            return self.encode_text(first, add_special_tokens=add_special_tokens)
        return token_id_array(first if isinstance(first, list) else prompt), "ids"


def token_id_array(values: Sequence[int]) -> np.ndarray:
    """Token ids already checked to be ints in ``[0, 2**64)`` as a uint64 array."""
    return np.array(values, dtype=np.uint64)
