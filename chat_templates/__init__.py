"""A model's own chat template, rendered as vLLM renders it (shared by router and enginesim).

vLLM turns chat ``messages`` into prompt text with the model's Jinja ``chat_template`` (the
string in its ``tokenizer_config.json``), through ``transformers``' ``apply_chat_template``.
This package does the same with ``jinja2`` alone, so the router (which must know the exact
prompt to hash its blocks) and enginesim (the vLLM stand-in) render identical bytes:

- the template runs in jinja2's ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
  ``lstrip_blocks``, the ``loopcontrols`` extension, a no-op ``{% generation %}`` block, the
  globals ``raise_exception(message)`` and ``strftime_now(format)``, and a ``tojson`` filter
  that does not HTML-escape; variables: ``messages``, ``tools``, ``documents``,
  ``add_generation_prompt``, the special tokens of the tokenizer config (``bos_token``,
  ``eos_token``, ...) and the request's ``chat_template_kwargs``;
  the sandbox keeps Python's internals (``__class__``, ``__globals__``...) and mutating
  methods (``append``, ``update``...) out of reach: such an attribute reads as undefined
  (empty, as in transformers), and using it (``''.__class__.__mro__``, ``x.append(1)``)
  fails with :class:`ChatTemplateError` before anything is reached or changed;
- content as vLLM resolves it: a template that loops over ``message['content']`` gets a list
  of ``{"type": "text", "text": ...}`` parts ("openai" format), any other gets one string
  ("string" format) in which the text parts are joined with ``"\\n"``; ``null`` content is
  empty. Text parts are ``text`` (also ``input_text``/``output_text``), ``refusal`` and
  ``thinking`` parts, and bare strings. Any other part (``image_url``, audio...) is refused
  with a 400: the simulated models take text only;
- roles are the template's to judge: ChatML and Llama 3 render any role, a template may
  refuse one with ``raise_exception`` (the ``plain`` template does), which is a 400.

Which built-in a model speaks when none is configured comes from its name
(:func:`template_for_model`, see :mod:`chat_templates.families`): Llama 3 models get
``llama3``, Qwen and every other model ChatML. The router and enginesim both use it.

Every request-level problem raises :class:`ChatTemplateError` carrying the OpenAI ``param``;
both sides answer it as the same 400. Loading problems raise :class:`TemplateLoadError`.

Layering: this package imports neither ``router_worker``, ``enginesim`` nor Django, so both
the router and the engine server may import it (they may not import each other:
docs/architecture.md, "Layers and their rules").
"""

from chat_templates.families import DEFAULT_TEMPLATE, template_for_model
from chat_templates.renderer import (
    BUILTIN_TEMPLATES,
    ChatTemplate,
    ChatTemplateError,
    TemplateLoadError,
    is_builtin,
    load_chat_template,
)

__all__ = [
    "BUILTIN_TEMPLATES",
    "DEFAULT_TEMPLATE",
    "ChatTemplate",
    "ChatTemplateError",
    "TemplateLoadError",
    "is_builtin",
    "load_chat_template",
    "template_for_model",
]
