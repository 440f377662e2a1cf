"""The served model's chat template, rendered as vLLM renders it.

Rendering is :mod:`chat_templates`, the module the router renders with too, so both give
the same bytes and the same 400 for messages a template cannot render (roles are the
template's to judge; non-text content parts are refused). ``--chat-template`` picks a
built-in (``chatml``, ``llama3``, ``plain``) or a ``tokenizer_config.json`` / ``.jinja``
path, as vLLM's option does; by default each model gets its own family's format, from the
map the router derives its template from too (:func:`chat_templates.template_for_model`):
Llama 3's for ``llama-3.1-8b``, ChatML for the Qwen models.

The built-in ChatML has no implicit system message. Because every message ends with a
newline and generated text starts with a space, turn N+1's prompt starts with turn N's
prompt followed by turn N's answer, token for token, as on real vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chat_templates import (
    DEFAULT_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    load_chat_template,
    template_for_model,
)

__all__ = ["ChatTemplate", "ChatTemplateError", "model_template", "render_chat"]


def model_template(model_key: str, spec: str | None = None) -> ChatTemplate:
    """The template an instance serving ``model_key`` renders with (``spec`` overrides)."""
    return load_chat_template(spec or template_for_model(model_key))


def render_chat(
    messages: Sequence[Any],
    add_generation_prompt: bool = True,
    template: ChatTemplate | None = None,
) -> str:
    """The prompt text for a list of OpenAI chat messages (raises ChatTemplateError)."""
    chosen = template or load_chat_template(DEFAULT_TEMPLATE)
    return chosen.render(messages, add_generation_prompt=add_generation_prompt)


def render_request(body: Mapping[str, Any], template: ChatTemplate | None = None) -> str:
    """The prompt text of a chat request body, with its template options."""
    return (template or load_chat_template(DEFAULT_TEMPLATE)).render_request(body)
