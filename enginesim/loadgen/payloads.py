"""OpenAI request bodies synthesised from trace records.

* Prefix traces (Mooncake, Azure, bursts): ``POST /v1/completions`` with ``prompt`` as the
  record's token ids (:func:`enginesim.replay.traces.synthesize_tokens`), so a router or
  engine sees exactly the trace's prefix sharing, no tokenizer involved.
* Session traces (records with a ``session_id``, e.g. Bailian or the agentic generator):
  ``POST /v1/chat/completions`` with the conversation as messages, so the router derives
  the turn (earlier assistant messages) the way it does for real chat traffic. The
  record's token stream is cut at the boundaries the previous turn of the session
  defines (its prompt length, then its reply length): earlier turns become alternating
  user/assistant messages, the new tail the last user message. Text is one pseudo-word
  per token id, so equal token runs give equal text and the sessions' shared prefixes
  survive any tokenizer. A turn whose predecessor was not sent in this run is sent as
  one user message (turn 0 to the router).

Every body asks for exactly the record's output length (``max_tokens`` plus vLLM's
``ignore_eos``), streams, and asks for the usage chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from enginesim.replay.traces import TraceRecord, synthesize_tokens

MAX_SESSIONS = 50_000  # remembered sessions (oldest forgotten first)
_SYLLABLES = (
    "ka",
    "lo",
    "mi",
    "ne",
    "su",
    "ta",
    "ri",
    "vo",
    "de",
    "po",
    "ga",
    "zu",
    "be",
    "fi",
    "ho",
    "ju",
)


def _word(token: int) -> str:
    # four syllables from the token id's low 16 bits: 65536 distinct short words
    return "".join(_SYLLABLES[(token >> shift) & 15] for shift in (0, 4, 8, 12))


def tokens_to_text(tokens: np.ndarray) -> str:
    return " ".join(_word(int(t)) for t in tokens)


@dataclass
class _Turn:
    prompt_tokens: int
    output_tokens: int
    messages: list[dict[str, str]] = field(default_factory=list)


class PayloadBuilder:
    """Builds request bodies; remembers each session's last turn to rebuild its history."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._sessions: dict[str, _Turn] = {}

    def build(self, record: TraceRecord) -> tuple[str, dict[str, Any]]:
        """``(path, body)`` for one record."""
        common = {
            "model": self.model,
            "max_tokens": max(record.output_tokens, 1),
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        tokens = synthesize_tokens(record)
        if record.session_id is None:
            return "/v1/completions", {**common, "prompt": tokens.tolist()}
        messages = self._messages(record, tokens)
        body = {**common, "messages": messages, "user": record.session_id}
        return "/v1/chat/completions", body

    def _messages(self, record: TraceRecord, tokens: np.ndarray) -> list[dict[str, str]]:
        previous = self._sessions.get(record.session_id or "")
        cut = 0 if previous is None else previous.prompt_tokens + previous.output_tokens
        if previous is None or record.turn == 0 or cut >= len(tokens):
            messages = [{"role": "user", "content": tokens_to_text(tokens)}]
        else:
            reply = tokens[previous.prompt_tokens : cut]
            messages = [
                *previous.messages,
                {"role": "assistant", "content": tokens_to_text(reply)},
                {"role": "user", "content": tokens_to_text(tokens[cut:])},
            ]
        key = record.session_id or ""
        self._sessions.pop(key, None)
        self._sessions[key] = _Turn(record.input_tokens, record.output_tokens, messages)
        if len(self._sessions) > MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        return messages
