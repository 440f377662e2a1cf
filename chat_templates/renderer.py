"""Loading and rendering chat templates (see the package docstring for the rules)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
# Built-in templates and the special tokens their models' tokenizer configs declare.
BUILTIN_TEMPLATES: dict[str, dict[str, str]] = {
    "chatml": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "plain": {},
}
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# Content parts vLLM reads as text, and the key holding their text.
TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
ContentFormat = Literal["string", "openai"]


class ChatTemplateError(ValueError):
    """A request the template cannot render: a 400 naming ``param``."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self) -> tuple[type[ChatTemplateError], tuple[str, str]]:
        return (ChatTemplateError, (self.message, self.param))


class TemplateLoadError(ValueError):
    """A chat template that cannot be loaded or compiled (a configuration error)."""


class _TemplateRaised(jinja2.TemplateError):
    """``raise_exception`` called by the template: its message goes to the client as is."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers marks assistant spans with it
    to build training masks); rendering only needs its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


def _loops_over_content(template: nodes.Template) -> bool:
    """vLLM's "auto" content format: "openai" when the template iterates over a message's
    ``content`` (``for part in message['content']``, possibly through filters)."""
    for loop in template.find_all(nodes.For):
        target = loop.iter
        while isinstance(target, nodes.Filter | nodes.Test) and target.node is not None:
            target = target.node
        if isinstance(target, nodes.Getitem) and isinstance(target.arg, nodes.Const):
            if target.arg.value == "content":
                return True
        elif isinstance(target, nodes.Getattr) and target.attr == "content":
            return True
    return False


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template with the special tokens it may use."""

    name: str
    source: str
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    content_format: ContentFormat = "string"
    compiled: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def compile(
        cls, name: str, source: str, special_tokens: Mapping[str, str] | None = None
    ) -> ChatTemplate:
        try:
            parsed = _ENV.parse(source)
            compiled = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise TemplateLoadError(
                f"chat template {name}: line {error.lineno}: {error.message}"
            ) from None
        content_format: ContentFormat = "openai" if _loops_over_content(parsed) else "string"
        return cls(name, source, dict(special_tokens or {}), content_format, compiled)

    def render(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Any = None,
        documents: Any = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of ``messages`` (raises :class:`ChatTemplateError`)."""
        if add_generation_prompt and continue_final_message:
            raise ChatTemplateError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "continue_final_message",
            )
        conversation = [self._message(i, m) for i, m in enumerate(_message_list(messages))]
        variables = {
            **self.special_tokens,
            **(template_kwargs or {}),
            "messages": conversation,
            "tools": tools,
            "documents": documents,
            "add_generation_prompt": add_generation_prompt,
        }
        text = self._run(variables)
        return _cut_after_final(text, conversation) if continue_final_message else text

    def render_request(self, body: Mapping[str, Any]) -> str:
        """The prompt text of a chat-completions request body, with its template options."""
        kwargs = body.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ChatTemplateError(
                "`chat_template_kwargs` must be an object.", "chat_template_kwargs"
            )
        return self.render(
            body.get("messages"),
            add_generation_prompt=_flag(body, "add_generation_prompt", True),
            continue_final_message=_flag(body, "continue_final_message", False),
            tools=_list_or_none(body, "tools"),
            documents=_list_or_none(body, "documents"),
            template_kwargs=kwargs,
        )

    def _message(self, index: int, message: Any) -> dict[str, Any]:
        if not isinstance(message, dict):
            raise ChatTemplateError(f"`messages.{index}` must be an object.")
        if not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"`messages.{index}.role` must be a string.")
        texts = _content_texts(index, message.get("content"))
        if self.content_format == "openai":
            content: Any = [{"type": "text", "text": text} for text in texts]
        else:
            content = "\n".join(texts)
        return {**message, "content": content}

    def _run(self, variables: dict[str, Any]) -> str:
        try:
            return str(self.compiled.render(**variables))
        except _TemplateRaised as error:
            raise ChatTemplateError(
                error.message or "the chat template refused the request"
            ) from None
        except Exception as error:  # a template bug meeting this input: still the client's 400
            raise ChatTemplateError(
                f"The chat template could not render these messages: "
                f"{type(error).__name__}: {error}"
            ) from None


def _message_list(messages: Any) -> list[Any]:
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("`messages` must be a non-empty list of messages.")
    return messages


def _content_texts(index: int, content: Any) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise ChatTemplateError(
            f"`messages.{index}.content` must be a string, null, or a list of content parts."
        )
    texts = []
    for number, part in enumerate(content):
        where = f"`messages.{index}.content.{number}`"
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise ChatTemplateError(f"{where} must be an object with a string `type`.")
        key = TEXT_PART_KEYS.get(kind)
        if key is None:
            raise ChatTemplateError(
                f"{where}: content part type {json.dumps(kind)} is not "
                "supported; this model takes text only."
            )
        text = part.get(key)
        if text is None:  # vLLM skips a text part without text
            continue
        if not isinstance(text, str):
            raise ChatTemplateError(f"{where}.{key} must be a string.")
        texts.append(text)
    return texts


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ChatTemplateError(f"`{name}` must be a boolean.", name)
    return value


def _list_or_none(body: Mapping[str, Any], name: str) -> list[Any] | None:
    value = body.get(name)
    if value is not None and not isinstance(value, list):
        raise ChatTemplateError(f"`{name}` must be a list.", name)
    return value


def _cut_after_final(text: str, conversation: list[dict[str, Any]]) -> str:
    """``continue_final_message``: the prompt ends where the last message's content ends,
    so the model continues it (transformers cuts the rendered text the same way)."""
    final = conversation[-1]["content"]
    if isinstance(final, list):
        final = "\n".join(part["text"] for part in final)
    final = final.strip()
    position = text.rfind(final) if final else -1
    if position < 0:
        raise ChatTemplateError(
            "continue_final_message: the final message's content does "
            "not appear in the rendered prompt.",
            "continue_final_message",
        )
    return text[: position + len(final)]


# ----- loading --------------------------------------------------------------------------


def is_builtin(spec: str) -> bool:
    return spec in BUILTIN_TEMPLATES


def load_chat_template(spec: str) -> ChatTemplate:
    """A built-in template name (``chatml``, ``llama3``, ``plain``), the path of a model's
    ``tokenizer_config.json`` (its ``chat_template`` and special tokens), or the path of a
    ``.jinja`` file (vLLM's ``--chat-template``). Files are read on every call: a config
    applied again picks up an edited file."""
    if is_builtin(spec):
        return _builtin(spec)
    path = Path(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TemplateLoadError(
            f"chat template {spec!r} is neither a built-in "
            f"({', '.join(BUILTIN_TEMPLATES)}) nor a readable file: "
            f"{error}"
        ) from None
    if path.suffix == ".json":
        return _from_tokenizer_config(spec, text)
    return ChatTemplate.compile(spec, text)


@lru_cache(maxsize=len(BUILTIN_TEMPLATES))
def _builtin(name: str) -> ChatTemplate:
    source = (BUILTIN_DIR / f"{name}.jinja").read_text(encoding="utf-8")
    return ChatTemplate.compile(name, source, BUILTIN_TEMPLATES[name])


def _from_tokenizer_config(spec: str, text: str) -> ChatTemplate:
    try:
        config = json.loads(text)
    except ValueError as error:
        raise TemplateLoadError(f"{spec}: not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise TemplateLoadError(f"{spec}: a tokenizer config must be a JSON object")
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the one called "default"
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source:
        raise TemplateLoadError(
            f'{spec}: no `chat_template` string (or named "default" '
            f"template) in this tokenizer config"
        )
    return ChatTemplate.compile(spec, source, _special_tokens(config))


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """``bos_token`` etc. as strings; tokenizer configs give each as a string or as an
    added-token object ``{"content": ...}``."""
    tokens = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens
