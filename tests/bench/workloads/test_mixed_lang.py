"""The mixed Chinese/English set from Debian's zh_CN message catalogs: exact lengths in two real tokenizers
(Gemma's SentencePiece and MiniLM's lossy WordPiece), the text kept as the catalogs spell it, tokens/char."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.bench.workloads.mixed_lang import load_corpus, mixed_lang_workload
from servelab.modelfile.tokenizer import TokenCounter, load_tokenizer
from servelab.wire import ConfigError


@pytest.fixture(scope="module")
def gemma() -> TokenCounter:
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def minilm() -> TokenCounter:
    from servelab.engines.embedder import weights_dir

    return load_tokenizer(weights_dir() / "tokenizer.json")  # the checkpoint's fixed padding is off


def test_corpus_is_real_bilingual_text() -> None:
    c = load_corpus()
    assert c.files > 10 and len(c.lines) > 1000 and len(c.sha256) == 64
    assert all(line.endswith(")") and " (" in line for line in c.lines[:100])
    assert load_corpus() is c  # read once per process


@pytest.mark.parametrize("which", ["gemma", "minilm"])
def test_exact_lengths_and_tokens_per_char(request: pytest.FixtureRequest, which: str) -> None:
    counter: TokenCounter = request.getfixturevalue(which)
    wl = mixed_lang_workload(counter, seed=3, input_tokens="16-1200")
    specs = wl.requests(24)
    texts = [s.messages[0]["content"] for s in specs]
    assert [counter.count(t) for t in texts] == [s.prompt_tokens_target for s in specs]
    corpus = set(load_corpus().lines)
    for t in texts:  # whole catalog lines as written, apart from the one cut at the end
        body = [x for x in t.split("\n") if x.endswith(")") and " (" in x][:-1]
        assert all(x in corpus for x in body), t[:200]
    lang = wl.summary_extra()["language"]
    assert lang["tokens"] == sum(s.prompt_tokens_target for s in specs)
    assert lang["characters"] == sum(map(len, texts))
    assert lang["tokens_per_char"] == pytest.approx(lang["tokens"] / lang["characters"])
    assert 0.15 < lang["han_share"] < 0.4 and lang["tokenizer"] == counter.name
    assert mixed_lang_workload(counter, seed=3, input_tokens="16-1200").requests(24) == specs


def test_tokenizers_differ_on_the_same_text(gemma: TokenCounter, minilm: TokenCounter) -> None:
    """Same seed, same targets: the two tokenizers need different amounts of text for them."""
    a = mixed_lang_workload(gemma, seed=1)
    b = mixed_lang_workload(minilm, seed=1)
    a.requests(16), b.requests(16)
    ta, tb = a.summary_extra()["language"], b.summary_extra()["language"]
    assert ta["tokens"] == tb["tokens"] and ta["tokens_per_char"] != tb["tokens_per_char"]
    print(f"\ntokens/char: {gemma.name} {ta['tokens_per_char']:.4f}; {minilm.name} {tb['tokens_per_char']:.4f}")


def test_no_catalogs_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="found none: install"):
        load_corpus(tmp_path)
