"""Deterministic ChatML chat template (the one Qwen2 models use).

Each message renders as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; with
``add_generation_prompt`` (the default) ``<|im_start|>assistant\\n`` follows.
There is no implicit system message. Because every message ends with a
newline and generated text starts with a space, turn N+1's prompt starts with
turn N's prompt followed by turn N's answer, token for token, as on real vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_ROLES = {"system", "user", "assistant", "tool", "developer"}


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (bad role or content)."""


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ChatTemplateError("only text content parts are supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ChatTemplateError("message content must be a string or a list of parts")


def render_chat(messages: Sequence[Any], add_generation_prompt: bool = True) -> str:
    """The prompt text for a list of OpenAI chat messages."""
    if not isinstance(messages, list | tuple) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    out = []
    for message in messages:
        if not isinstance(message, dict):
            raise ChatTemplateError("each message must be an object")
        role = message.get("role")
        if role not in _ROLES:
            raise ChatTemplateError(f"unsupported message role: {role!r}")
        out.append(f"<|im_start|>{role}\n{_content_text(message.get('content'))}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)
