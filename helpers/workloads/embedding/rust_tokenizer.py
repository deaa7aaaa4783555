"""The model's tokenizer as sentence-transformers calls it, in Rust, without the Python wrapper.

``RustTokenizer`` gives the ids of ``tokenizer(texts, truncation=True, max_length=...)``
(special tokens added, truncated to the model's ``max_seq_length`` on the side transformers
truncates) from a copy of the Rust tokenizer inside a transformers "fast" tokenizer, or from a
model's tokenizer.json: the same ids (tests/test_feeder.py), about half the CPU of the wrapper's
call, which pads into tensors and checks each call. The feeder tokenizes with it, or with the
word cache in front of it (helpers.workloads.embedding.word_cache); tokenizing processes build it
anew from its JSON (helpers.workloads.embedding.tokenizing).
"""
from __future__ import annotations

from typing import Any

UNBOUNDED = 2**31 - 1  # the length of a model that says none (transformers' "very large",
# 10**30, which the Rust tokenizer cannot take)


class RustTokenizer:
    """``tokenizer(texts, truncation=True, max_length=...)``'s ids, from the Rust tokenizer
    ``rust`` (truncation and padding set here on it: give it a copy); ``pad_id``: the id that
    pads a batch; ``side``: the end a long text loses (transformers' ``truncation_side``)."""

    def __init__(self, rust: Any, pad_id: int, max_length: int, side: str = "right") -> None:
        max_length = min(int(max_length), UNBOUNDED)
        self.rust, self.pad_id, self.max_length = rust, pad_id, max_length
        self.rust.enable_truncation(max_length=max_length, direction=side)
        self.rust.no_padding()
        self._encode = getattr(self.rust, "encode_batch_fast", self.rust.encode_batch)  # (no
        # character offsets: 5-10 % less CPU, the same ids; tokenizers >= 0.21)

    @classmethod
    def of(cls, tokenizer: Any, max_length: int) -> RustTokenizer:
        """From a transformers tokenizer (a copy of its Rust one: its own is left as it was)."""
        from tokenizers import Tokenizer

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise ValueError(f"{type(tokenizer).__name__} has no Rust tokenizer (a 'fast' "
                             f"tokenizer): the feeder needs one")
        return cls(Tokenizer.from_str(backend.to_str()), int(tokenizer.pad_token_id or 0),
                   max_length, getattr(tokenizer, "truncation_side", "right") or "right")

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, special tokens included."""
        return [encoding.ids for encoding in self._encode(texts)]
