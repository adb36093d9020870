"""Tokenizers for the ``lm`` task: a byte-level one by default, or any Hugging Face tokenizer by name.

Both expose ``vocab_size``, ``eos_id``, ``encode_batch(texts) -> list[np.ndarray]`` (int64 ids per
text), ``encode(text) -> np.ndarray`` and ``decode(ids) -> str``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from archsearch.errors import UserError


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255, plus ``eos_id = 256`` between documents (vocab 257).

    A byte tokenizer needs no vocabulary file and no download, and makes bits per byte the plain
    per-token loss in bits.
    """

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``transformers.AutoTokenizer`` by name or path; needs the ``transformers`` package.

    Documents are separated by the tokenizer's EOS token (or its SEP / PAD token when it has no EOS).
    """

    def __init__(self, name: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise UserError(
                f"lm.tokenizer: {name!r} needs the transformers package (pip install transformers); "
                "the built-in tokenizer is 'byte'"
            ) from None
        try:
            self.tok = AutoTokenizer.from_pretrained(name)
        except Exception as exc:  # OSError (not found / offline), ValueError (unknown kind), ...
            raise UserError(f"lm.tokenizer: cannot load {name!r}: {str(exc).splitlines()[0]}") from None
        self.name = name
        eos = self.tok.eos_token_id
        for alt in (self.tok.sep_token_id, self.tok.pad_token_id):
            eos = alt if eos is None else eos
        if eos is None:
            raise UserError(f"lm.tokenizer: {name!r} has no EOS, SEP or PAD token to separate documents")
        self.eos_id = int(eos)
        self.vocab_size = len(self.tok)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        ids = self.tok(list(texts), add_special_tokens=False)["input_ids"]
        return [np.asarray(i, dtype=np.int64) for i in ids]

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))


def get_tokenizer(name: str) -> ByteTokenizer | HFTokenizer:
    """``"byte"`` -> :class:`ByteTokenizer`; anything else -> :class:`HFTokenizer` (transformers)."""
    if name == "byte":
        return ByteTokenizer()
    return HFTokenizer(name)
