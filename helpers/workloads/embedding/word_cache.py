"""Below the bare tokenizer: a cache of words to ids for BERT-style WordPiece tokenizers.

IgniteMS keeps a per-worker cache of whitespace words to ids and calls the full tokenizer only
on a miss (ANCHORS.md). For a tokenizer whose configuration says its rules are BERT's (a
``BertNormalizer`` that cleans text, the ``BertPreTokenizer``, a ``WordPiece`` model, a template
that puts special tokens around one text), a text of printable ASCII is tokenized by those rules
in Python's C string methods: lower-cased (where the normalizer says so), split into runs of
letters and digits and single punctuation characters (every printable ASCII character that is
neither is BERT's punctuation), each word's ids looked up in a dictionary that the model's own
WordPiece fills on a miss, truncated as the tokenizer truncates, the special tokens put around.
The saving is in not crossing into Rust per text: measured on the sample, 19 µs a text against
141 µs for ``encode_batch`` on one thread (ANCHORS.md; ``python -m helpers.bench feed``).

A text the rules cannot vouch for goes to the tokenizer itself: anything outside printable ASCII
and tab, newline and carriage return (accents, CJK, emoji, control characters, which the
normalizer removes or splits), and a text holding an added token's content (``[MASK]``, which
the tokenizer matches before normalizing). The ids are the tokenizer's on every text
(tests/test_word_cache.py: the whole sample, and hostile texts). The cache is bounded
(``MAX_WORDS``; emptied when full: a corpus's frequent words come back at once).
"""
from __future__ import annotations

import json
import re
import threading
from itertools import chain
from typing import Any

MAX_WORDS = 131_072  # words a cache holds (~30 MB) before it is emptied
_VOUCHED = re.compile(r"[^\x20-\x7e\t\n\r]")  # a character the rules do not vouch for
_WORDS_CASED = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9 \t\n\r]")  # letters and digits, or one
# punctuation character (BERT's: every printable ASCII character that is neither)
_WORDS_UNCASED = re.compile(r"[a-z0-9]+|[^a-z0-9 \t\n\r]")
_SPACES = str.maketrans("\t\n\r", "   ")


def _normalizers(config: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not config:
        return []
    return list(config.get("normalizers", [])) if config.get("type") == "Sequence" else [config]


def why_not(rust: Any) -> str | None:
    """Why the word cache cannot stand in for the Rust tokenizer ``rust`` (None: it can): its
    normalizer, pre-tokenizer, model, template or truncation is not BERT's as this module
    reproduces it."""
    config = json.loads(rust.to_str())
    normalizers = _normalizers(config.get("normalizer"))
    kinds = [n.get("type") for n in normalizers]
    if not set(kinds) <= {"BertNormalizer", "Lowercase"} or "BertNormalizer" not in kinds:
        return f"its normalizer is {kinds or 'none'}, not BERT's"
    if not all(n.get("clean_text", False) for n in normalizers if n["type"] == "BertNormalizer"):
        return "its BertNormalizer keeps control characters (clean_text=False)"
    if (config.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        return f"its pre-tokenizer is {(config.get('pre_tokenizer') or {}).get('type')}, " \
               f"not BERT's"
    if (config.get("model") or {}).get("type") != "WordPiece":
        return f"its model is {(config.get('model') or {}).get('type')}, not WordPiece"
    post = (config.get("post_processor") or {}).get("type")
    if post not in ("TemplateProcessing", "BertProcessing", None):
        return f"its post-processor is {post}"
    truncation = config.get("truncation") or {}
    if truncation and (truncation.get("direction", "Right") != "Right"
                       or truncation.get("stride", 0)):
        return "it truncates from the left, or with a stride"
    if config.get("padding"):
        return "it pads"
    return None


class WordCache:
    """``RustTokenizer.encode``'s ids for the texts it vouches for, from a cache of words (the
    module docstring); the others from ``tokenizer`` itself. ``tokenizer``: a RustTokenizer
    (its truncation and padding already set); ValueError where ``why_not`` says why not."""

    def __init__(self, tokenizer: Any, max_words: int = MAX_WORDS) -> None:
        reason = why_not(tokenizer.rust)
        if reason is not None:
            raise ValueError(f"the word cache cannot stand in for this tokenizer: {reason}")
        self.tokenizer, self.pad_id = tokenizer, tokenizer.pad_id
        self.max_length, self.max_words = tokenizer.max_length, max_words
        rust = tokenizer.rust
        config = json.loads(rust.to_str())
        self._words = (_WORDS_UNCASED if any(
            n.get("type") == "Lowercase" or n.get("lowercase", False)
            for n in _normalizers(config.get("normalizer"))) else _WORDS_CASED)
        self._lower = self._words is _WORDS_UNCASED
        self._added = tuple({token["content"].lower() for token in config.get("added_tokens", [])
                             if token.get("content")})
        self._spaced = any(" " in added for added in self._added)
        model = rust.model

        class Words(dict):  # (a miss: the model's own WordPiece on the word)
            def __missing__(self, word: str) -> list[int]:
                ids = self[word] = [token.id for token in model.tokenize(word)]
                return ids

        self._cache: dict[str, list[int]] = Words()
        self.prefix, self.suffix = self._specials(rust)
        self._room = self.max_length - len(self.prefix) - len(self.suffix)
        if self._room < 1:
            raise ValueError(f"the word cache cannot stand in for this tokenizer: max_length="
                             f"{self.max_length} leaves no room beside its special tokens")
        self._local = threading.local()

    @staticmethod
    def _specials(rust: Any) -> tuple[list[int], list[int]]:
        """The ids the template puts before and after one text's (from a probe)."""
        probe = "probe"
        bare, whole = rust.encode(probe, add_special_tokens=False).ids, rust.encode(probe).ids
        for start in range(len(whole) - len(bare) + 1):
            if whole[start:start + len(bare)] == bare:
                return whole[:start], whole[start + len(bare):]
        raise ValueError("the word cache cannot stand in for this tokenizer: its template "
                         "changes a text's own ids")

    def vouches(self, text: str) -> bool:
        """Whether the rules give the tokenizer's ids for ``text``."""
        return self._vouched(text) is not None

    def _vouched(self, text: str) -> str | None:
        """``text`` as the rules read it (lower-cased where the normalizer lowers), or None
        where they do not vouch for it."""
        if _VOUCHED.search(text) is not None:
            return None
        lowered = text.lower()
        if self._added and (any(added in lowered for added in self._added) or (
                self._spaced and any(added in lowered.translate(_SPACES)
                                     for added in self._added))):
            return None  # (the tokenizer matches added tokens before it normalizes, or, for a
            # normalized one, after \t \n \r became spaces)
        return lowered if self._lower else text

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, special tokens included (``RustTokenizer.encode``'s)."""
        if len(self._cache) > self.max_words:
            self._cache.clear()
        cache, words, room = self._cache, self._words.findall, self._room
        prefix, suffix, vouched = self.prefix, self.suffix, self._vouched
        out: list[list[int] | None] = []
        others: list[int] = []
        for position, text in enumerate(texts):
            read = vouched(text)
            if read is None:
                others.append(position)
                out.append(None)
                continue
            ids = list(chain.from_iterable(map(cache.__getitem__, words(read))))
            if len(ids) > room:
                del ids[room:]
            out.append(prefix + ids + suffix)
        if others:
            for position, ids in zip(others, self.tokenizer.encode([texts[i] for i in others])):
                out[position] = ids
        self._local.fast = len(texts) - len(others)
        return out  # type: ignore[return-value]

    def last_fast(self) -> int:
        """The texts this thread's last ``encode`` tokenized from the cache."""
        return getattr(self._local, "fast", 0)
