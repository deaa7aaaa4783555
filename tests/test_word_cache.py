"""The word cache (helpers.workloads.embedding.word_cache): the tokenizer's own ids on every text,
from the cache where its rules vouch for the text and from the tokenizer where they do not."""
import json

import pytest

from helpers.workloads.embedding.rust_tokenizer import RustTokenizer
from helpers.workloads.embedding.word_cache import WordCache, why_not

HOSTILE = [
    "Crème brûlée, naïve café",  # accents (the normalizer strips or keeps them)
    "東京は日本の首都です and English",  # CJK (each character a word of its own)
    "emoji 😀 and a flag 🇫🇷 between words",
    "control\x00char\x07s and \x0bvertical tab \x0cform feed",  # removed or split by Rust
    "tabs\tand\nnewlines\r\nand  double  spaces",
    "a" * 150 + " word " + "b" * 99 + " " + "c" * 101,  # longer than a word may be: [UNK]
    "unbelievably antidisestablishmentarianism's hyphen-ated e-mail@example.com",
    "punctuation!!! ??? ... (brackets) [square] {curly} <angle> ~tilde~ `back` ^caret^ |pipe|",
    "the special [MASK] token and [cls] in lower case, [SEP]",
    "numbers 3.14159 1,000,000 -42 +7 1e-9 0x1F",
    "MiXeD CaSe WoRdS AND SHOUTING",
    "   leading and trailing spaces   ",
    "\u00a0non-breaking\u2009thin\u200bzero-width spaces",
    "a",
    "$ % & * # @ ! ; : ' \" , . / \\ = + - _",
]


@pytest.fixture(scope="module")
def rust():
    from helpers.workloads.embedding import default_model_path
    from helpers.workloads.embedding.model import read_model

    return read_model(default_model_path())[1]


@pytest.fixture(scope="module")
def texts():
    from helpers.study.paths import sample_texts

    return sample_texts()


def test_the_cache_gives_the_tokenizer_s_ids_on_the_whole_sample(rust, texts):
    cache = WordCache(rust)
    assert cache.encode(texts) == rust.encode(texts)
    assert len(texts) * 0.98 < cache.last_fast() < len(texts)  # most from the cache, not all
    assert cache.encode(texts) == rust.encode(texts)  # (again, every word a hit)


def test_hostile_texts_get_the_tokenizer_s_ids_and_those_it_cannot_vouch_for_go_to_it(rust):
    cache = WordCache(rust)
    assert cache.encode(HOSTILE) == rust.encode(HOSTILE)
    vouched = [text for text in HOSTILE if cache.vouches(text)]
    assert not any(ord(c) > 126 or (ord(c) < 32 and c not in "\t\n\r")
                   for text in vouched for c in text)  # printable ASCII only
    assert "the special [MASK] token and [cls] in lower case, [SEP]" not in vouched  # (added)
    assert HOSTILE[5] in vouched and HOSTILE[7] in vouched  # long words, punctuation: the rules


@pytest.mark.parametrize("length", [3, 4, 16, 17, 128])
def test_truncation_cuts_where_the_tokenizer_cuts(rust, texts, length):
    from tokenizers import Tokenizer

    short = RustTokenizer(Tokenizer.from_str(rust.rust.to_str()), rust.pad_id, length)
    cache = WordCache(short)
    chosen = texts[:200] + HOSTILE
    assert cache.encode(chosen) == short.encode(chosen)
    assert max(map(len, cache.encode(chosen))) == length


def test_a_full_cache_is_emptied_and_still_right(rust, texts):
    cache = WordCache(rust, max_words=50)
    for start in range(0, 400, 100):
        assert cache.encode(texts[start:start + 100]) == rust.encode(texts[start:start + 100])
        assert len(cache._cache) < 50 + 5000  # emptied before each call once over the bound


def _edited(rust, change):
    from tokenizers import Tokenizer

    config = json.loads(rust.rust.to_str())
    change(config)
    return RustTokenizer(Tokenizer.from_str(json.dumps(config)), rust.pad_id, rust.max_length)


def test_a_cased_bert_tokenizer_keeps_its_case(rust, texts):
    cased = _edited(rust, lambda c: c["normalizer"].update(lowercase=False))
    assert why_not(cased.rust) is None
    chosen = texts[:500] + HOSTILE
    assert WordCache(cased).encode(chosen) == cased.encode(chosen)
    assert cased.encode(["Word"]) != rust.encode(["Word"])  # (the edit took)


@pytest.mark.parametrize("change, reason", [
    (lambda c: c.update(pre_tokenizer={"type": "Whitespace"}), "pre-tokenizer is Whitespace"),
    (lambda c: c["normalizer"].update(clean_text=False), "clean_text=False"),
    (lambda c: c.update(normalizer={"type": "NFC"}), "normalizer is ['NFC']"),
    (lambda c: c.update(truncation={"direction": "Left", "max_length": 8, "stride": 0,
                                    "strategy": "LongestFirst"}), "from the left"),
])
def test_a_tokenizer_whose_rules_are_not_bert_s_is_not_stood_in_for(rust, change, reason):
    from tokenizers import Tokenizer

    config = json.loads(rust.rust.to_str())
    change(config)
    assert reason in why_not(Tokenizer.from_str(json.dumps(config)))


def test_a_model_that_truncates_from_the_left_is_tokenized_so_and_not_from_the_cache(rust):
    """transformers' ``truncation_side="left"`` (a model's tokenizer_config): the feeder's
    tokenizer keeps the end of a long text, as the model's own tokenizer does, and the cache,
    which cuts the end, stands aside."""
    from tokenizers import Tokenizer

    left = RustTokenizer(Tokenizer.from_str(rust.rust.to_str()), rust.pad_id, 8, "left")
    text = "one two three four five six seven eight nine ten"
    assert left.encode([text])[0][1:-1] == rust.encode([text])[0][-9:-1][-6:]  # the last six
    assert "from the left" in why_not(left.rust)
    with pytest.raises(ValueError, match="cannot stand in"):
        WordCache(left)


def test_the_cache_costs_a_fraction_of_the_tokenizer_s_cpu(rust, texts):
    """Not a timed goal (benchmarks say those: python -m helpers.bench feed), a guard against a
    change that loses the point of the cache: it must cost less than the tokenizer it skips."""
    import time

    cache = WordCache(rust)
    cache.encode(texts)  # (the cache filled)
    spent = {}
    for _ in range(3):
        for name, encode in (("rust", rust.encode), ("cache", cache.encode)):
            started = time.process_time()
            encode(texts)
            spent.setdefault(name, []).append(time.process_time() - started)
    assert min(spent["cache"]) < 0.7 * min(spent["rust"]), spent


def test_an_added_token_with_a_space_is_matched_after_whitespace_is_normalized(rust):
    """A normalized added token "foo bar": the tokenizer finds it in "foo\tbar" too (its tab
    becomes a space first); the cache stands aside for such a text."""
    from tokenizers import AddedToken, Tokenizer

    with_added = RustTokenizer(Tokenizer.from_str(rust.rust.to_str()), rust.pad_id, 128)
    with_added.rust.add_tokens([AddedToken("foo bar", normalized=True)])
    cache = WordCache(with_added)
    chosen = ["foo\tbar baz", "foo bar", "foo\nbar", "food bar"]
    assert not cache.vouches("foo\tbar baz") and cache.vouches("food bar")
    assert cache.encode(chosen) == with_added.encode(chosen)
