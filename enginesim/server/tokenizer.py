"""Deterministic text tokenizer and synthetic text generator for enginesim.

Tokenization rule (documented so other components can reproduce it):

1. The text is cut into pieces, left to right, by the first alternative that
   matches at each position:
   - a special token: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``;
   - an optional single space followed by a run of letters/digits (``" hello"``);
   - an optional single space followed by one other non-space character
     (punctuation, symbols, ``_``);
   - one whitespace character (newline, tab, or a space not followed by a word).
2. Special tokens get fixed ids (Qwen2's: 151643, 151644, 151645). Every other
   piece gets ``crc32(piece as UTF-8) % 151643``.

So roughly one token per word (real BPE tokenizers give ~1.3), every character
belongs to exactly one piece, and cutting text at a piece boundary (before a
space, a newline or a special token) tokenizes each side independently. That
is what makes chat prefixes stable across turns.

Special tokens added to a prompt (vLLM's ``add_special_tokens``: completions by
default, chat only on request): a model of the Llama 3 family gets its BOS,
``<|begin_of_text|>``, before the prompt, as Llama 3's tokenizer adds it; other
models get nothing, as Qwen's tokenizer adds nothing. The BOS is tokenized as
text, like the one the llama3 chat template writes, so both give the same ids
(on a real Llama 3 both are the one token 128000).

Generated text is a stream of pieces ``" " + word`` from a fixed word list,
chosen by a hash of (request seed, position): sending a generated answer back
in a later prompt tokenizes to exactly the token ids the engine generated.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np

from chat_templates import template_for_model

VOCAB_SIZE = 151643
SPECIAL_TOKENS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
_ID_TO_SPECIAL = {v: k for k, v in SPECIAL_TOKENS.items()}
MAX_TOKEN_ID = max(SPECIAL_TOKENS.values())

_PIECE_RE = re.compile(
    r"<\|endoftext\|>|<\|im_start\|>|<\|im_end\|>"
    r"| ?[^\W_]+"
    r"| ?(?:[^\w\s]|_)"
    r"|\s"
)

_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his it an were are which this "
    "be or has had but not first one their its new after who they two her she been other "
    "when there all during into school time may years more most only over city some world "
    "would where later up such used many can state about national out known university "
    "united then made team american also film series well between three season part while "
    "under since being year both early war these through people high number called home "
    "south north each released government following several him including music because "
    "before around second well place back family house album area group name game second "
    "became took show life club until major work built station county member four public "
    "same system light river water model engine cache token batch queue block prefix "
    "router cluster policy metric signal vector memory stream server client request reply"
)
_WORDS = _WORD_TEXT.split()


def piece_id(piece: str) -> int:
    """The token id of one piece (special tokens have fixed ids)."""
    special = SPECIAL_TOKENS.get(piece)
    if special is not None:
        return special
    return zlib.crc32(piece.encode("utf-8")) % VOCAB_SIZE


# What each template family's tokenizer puts before a prompt when it adds special tokens.
ADDED_BOS = {"llama3": "<|begin_of_text|>"}


def added_bos(model: str) -> str:
    """The BOS text ``model``'s tokenizer adds to a prompt ("" for none; see above)."""
    return ADDED_BOS.get(template_for_model(model), "")


def split_pieces(text: str) -> list[str]:
    """Cut text into pieces; concatenating them gives the text back."""
    return _PIECE_RE.findall(text)


def encode(text: str) -> list[int]:
    """Token ids of a text."""
    return [piece_id(piece) for piece in split_pieces(text)]


_GEN_PIECES = tuple(" " + word for word in dict.fromkeys(_WORDS))
# Generated text is plain ASCII letters and spaces: it is valid JSON string
# content as is, which lets the SSE path skip json.dumps.
assert all(piece[1:].isascii() and piece[1:].isalpha() for piece in _GEN_PIECES)
_GEN_IDS = tuple(piece_id(piece) for piece in _GEN_PIECES)
_ID_TO_GEN_PIECE = dict(zip(_GEN_IDS, _GEN_PIECES, strict=True))
_GEN_ID_ARRAY = np.array(_GEN_IDS, dtype=np.int64)


def decode(token_ids: Sequence[int]) -> str:
    """Best-effort text of token ids: exact for special and generated tokens.

    Prompt pieces cannot be recovered from a hash, so unknown ids render as
    ``" <id>"``.
    """
    out = []
    for token_id in token_ids:
        piece = _ID_TO_SPECIAL.get(token_id) or _ID_TO_GEN_PIECE.get(token_id)
        out.append(piece if piece is not None else f" <{token_id}>")
    return "".join(out)


def prompt_seed(token_ids: Sequence[int]) -> int:
    """A stable 32-bit seed from prompt tokens (identical prompts, identical answers)."""
    return zlib.crc32(repr(list(token_ids[-64:])).encode() + len(token_ids).to_bytes(4, "big"))


class SyntheticText:
    """Generated tokens for one request: position j is a pure function of (seed, j)."""

    __slots__ = ("_seed",)

    def __init__(self, seed: int) -> None:
        self._seed = seed

    def _index(self, position: int) -> int:
        mixed = (self._seed * 0x9E3779B1 + position * 0x85EBCA77) & 0xFFFFFFFF
        mixed ^= mixed >> 15
        mixed = (mixed * 0x2C1B3C6D) & 0xFFFFFFFF
        mixed ^= mixed >> 12
        return mixed % len(_GEN_PIECES)

    def pieces(self, start: int, stop: int) -> list[str]:
        """Text pieces of generated positions [start, stop)."""
        return [_GEN_PIECES[self._index(j)] for j in range(start, stop)]

    def text(self, start: int, stop: int) -> str:
        return "".join(self.pieces(start, stop))

    def token_ids(self, start: int, stop: int) -> list[int]:
        return [_GEN_IDS[self._index(j)] for j in range(start, stop)]

    def token_id_array(self, start: int, stop: int) -> np.ndarray:
        """:meth:`token_ids` computed with numpy (a whole answer at submission)."""
        j = np.arange(start, max(stop, start), dtype=np.uint64)
        low = np.uint64(0xFFFFFFFF)
        mixed = (np.uint64(self._seed) * np.uint64(0x9E3779B1) + j * np.uint64(0x85EBCA77)) & low
        mixed ^= mixed >> np.uint64(15)
        mixed = (mixed * np.uint64(0x2C1B3C6D)) & low
        mixed ^= mixed >> np.uint64(12)
        return _GEN_ID_ARRAY[mixed % np.uint64(len(_GEN_PIECES))]
