"""Which built-in template a model speaks, from its name (one map for router and enginesim).

Only families we can name are listed. A model belongs to one when the last part of its name
(after any ``org/``), in any case, starts with the family's name and version:

- Llama 3 (3, 3.1, 3.2, 3.3) → ``llama3``: ``meta-llama/Llama-3.1-8B-Instruct``,
  ``Meta-Llama-3-8B-Instruct``, enginesim's ``llama-3.1-8b``, ``llama3.1:8b``;
- Qwen → ``chatml``: ``Qwen/Qwen3-8B``, ``Qwen/Qwen2.5-7B-Instruct``, ``qwen2-7b``.

Anything else gets ChatML, the default, as before; that includes Llama 2 and Llama 4 (other
formats), and fine-tunes named after themselves (``Hermes-3-Llama-3.1-8B`` speaks ChatML).
"""

from __future__ import annotations

import re

DEFAULT_TEMPLATE = "chatml"
MODEL_FAMILIES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(meta-)?llama-?3(\.\d+)?([-_:]|$)"), "llama3"),
    (re.compile(r"qwen(\d+(\.\d+)?)?([-_:]|$)"), "chatml"),
)


def template_for_model(model: str | None) -> str:
    """The built-in template of ``model``'s family; ChatML for a model no family names."""
    name = (model or "").rsplit("/", 1)[-1].lower()
    for pattern, template in MODEL_FAMILIES:
        if pattern.match(name):
            return template
    return DEFAULT_TEMPLATE
