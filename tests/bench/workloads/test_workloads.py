"""Built-in workloads: exact prompt lengths with the real Gemma tokenizer, determinism, the mix ratio,
structured specs, and user datasets."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from servelab.bench.workloads.builtin import SCHEMAS
from servelab.bench.workloads.datasets import load_dataset
from servelab.bench.workloads.lengths import parse_length
from servelab.bench.workloads.registry import WORKLOADS, make_workload
from servelab.modelfile.tokenizer import TokenCounter, load_tokenizer
from servelab.wire import ConfigError, RequestSpec


@pytest.fixture(scope="module")
def counter(tmp_path_factory) -> TokenCounter:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVELAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        return load_tokenizer(None)


def _text(r: RequestSpec) -> str:
    return r.messages[0]["content"] if r.endpoint == "chat" else r.prompt


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_exact_prompt_lengths(counter: TokenCounter, name: str) -> None:
    for seed in (0, 1, 7):
        n = 12 if name in ("rag", "shared-prefix") else 40
        for r in make_workload(name, counter, seed=seed).requests(n):
            assert r.prompt_tokens_target is not None
            assert counter.count(_text(r)) == r.prompt_tokens_target, (name, seed, _text(r)[:80])
            assert r.max_tokens and r.max_tokens >= 1


def test_default_distributions(counter: TokenCounter) -> None:
    rs = make_workload("short-qa", counter).requests(200)
    assert all(16 <= r.prompt_tokens_target <= 160 and 32 <= r.max_tokens <= 128 for r in rs)
    assert 55 <= sum(r.prompt_tokens_target for r in rs) / len(rs) <= 73
    assert all(
        1000 <= r.prompt_tokens_target <= 3000 and 64 <= r.max_tokens <= 128
        for r in make_workload("rag", counter).requests(10)
    )
    assert all(512 <= r.max_tokens <= 1024 for r in make_workload("long-gen", counter).requests(50))
    rag = _text(make_workload("rag", counter).request(0))
    assert "Context:\n[1] " in rag and "\n[2] " in rag and "\n\nQuestion: " in rag


def test_overrides_fix_lengths(counter: TokenCounter) -> None:
    for name in ("short-qa", "rag", "long-gen", "structured", "mix"):
        for r in make_workload(name, counter, input_tokens=128, output_tokens=64).requests(20):
            assert r.prompt_tokens_target == 128 == counter.count(_text(r)) and r.max_tokens == 64
    for r in make_workload("short-qa", counter, input_tokens="3-5").requests(20):  # tiny: template dropped
        assert counter.count(_text(r)) == r.prompt_tokens_target
    with pytest.raises(ConfigError, match="unknown workload parameter"):
        make_workload("short-qa", counter, input_tokenz=5)
    with pytest.raises(ConfigError, match="bad input_tokens"):
        make_workload("short-qa", counter, input_tokens="many")
    with pytest.raises(ConfigError, match="unknown workload"):
        make_workload("nope", counter)
    assert make_workload("short-qa", counter, prefix_tokens=64).requests(1)  # another set's key is ignored
    assert parse_length("normal:64,16,10,20", "k")(__import__("random").Random(1)) in range(10, 21)


def test_reproducible(counter: TokenCounter) -> None:
    for name in WORKLOADS:
        a = make_workload(name, counter, seed=3).requests(8)
        b = make_workload(name, counter, seed=3).requests(8)
        c = make_workload(name, counter, seed=4).requests(8)
        assert a == b
        assert a != c
        assert make_workload(name, counter, seed=3).requests(3) == a[:3]


def test_mix_ratio(counter: TokenCounter) -> None:
    t = time.monotonic()
    rs = make_workload(
        "mix", counter, ratio="short-qa:5,rag:1,long-gen:1,structured:3", input_tokens="normal:64,16"
    ).requests(1000)
    assert time.monotonic() - t < 30
    got = Counter(r.workload for r in rs)
    assert got == {"short-qa": 500, "rag": 100, "long-gen": 100, "structured": 300}
    default = Counter(r.workload for r in make_workload("mix", None).requests(1000))
    for name, w in (("short-qa", 5), ("rag", 2), ("long-gen", 1), ("structured", 2)):
        assert abs(default[name] / 1000 - w / 10) < 0.02
    with pytest.raises(ConfigError, match="bad ratio"):
        make_workload("mix", counter, ratio="short-qa:5,chat:1")


def test_short_qa_speed(counter: TokenCounter) -> None:
    w = make_workload("short-qa", counter, seed=11)
    w.request(0)
    t = time.monotonic()
    w.requests(100)
    assert time.monotonic() - t < 2.0  # well under 1 s on an idle core; slack for a shared CI machine


def test_structured_specs(counter: TokenCounter) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    names = set()
    for r in make_workload("structured", counter, ignore_eos=True).requests(40):
        rf = r.extra["response_format"]
        assert rf["type"] == "json_schema" and rf["json_schema"]["strict"] is True
        assert rf["json_schema"]["schema"] == r.json_schema
        jsonschema.Draft202012Validator.check_schema(r.json_schema)
        assert "ignore_eos" not in r.extra  # a JSON answer must be able to stop
        names.add(rf["json_schema"]["name"])
    assert len(names) >= 4
    sample = {
        "person": {"name": "Ada", "age": 36, "city": "London"},
        "sentiment": {"sentiment": "neutral", "confidence": 0.5},
    }
    for s in SCHEMAS:
        if s["name"] in sample:
            jsonschema.validate(sample[s["name"]], s["schema"])


def test_ignore_eos_endpoint_and_extra(counter: TokenCounter) -> None:
    r = make_workload("long-gen", counter, ignore_eos=True, endpoint="completions", extra={"temperature": 0}).request(0)
    assert r.endpoint == "completions" and r.messages is None and isinstance(r.prompt, str)
    assert r.extra == {"ignore_eos": True, "temperature": 0}
    assert counter.count(r.prompt) == r.prompt_tokens_target
    r = make_workload("long-gen", counter).request(0)
    assert r.messages[0]["role"] == "user" and "ignore_eos" not in r.extra


def test_shared_prefix(counter: TokenCounter) -> None:
    w = make_workload("shared-prefix", counter, prefix_tokens=256, num_prefixes=3, suffix_tokens=16)
    rs = w.requests(9)
    assert all(r.prompt_tokens_target == 272 == counter.count(_text(r)) for r in rs)
    for p in range(3):
        group = [_text(r) for r in rs[p::3]]
        pre = group[0].split("\n\nQuestion: ")[0]
        assert len(counter.encode(pre)) == 256
        for t in group:
            assert t.startswith(pre + "\n\nQuestion: ")
            assert counter.encode(t)[:256] == counter.encode(pre)  # identical prefix tokens
        assert len(set(group)) == 3  # distinct suffixes
    assert _text(rs[0]).split("\n\n")[0] != _text(rs[1]).split("\n\n")[0]


def test_without_tokenizer() -> None:
    for name in WORKLOADS:
        rs = (
            make_workload(name, None, input_tokens=100).requests(5)
            if name != "shared-prefix"
            else make_workload(name, None).requests(5)
        )
        assert all(r.prompt_tokens_target is None and _text(r) for r in rs)
    words = len(_text(make_workload("long-gen", None, input_tokens=400).request(0)).split())
    assert 250 <= words <= 350


def test_chinese_prompts_exact(counter: TokenCounter) -> None:
    for lang in ("zh", "mixed"):
        for r in make_workload("short-qa", counter, lang=lang).requests(30):
            assert counter.count(_text(r)) == r.prompt_tokens_target


def test_dataset_jsonl(counter: TokenCounter, tmp_path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(
        '{"prompt": "hello there", "max_tokens": 10}\n\n'
        '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}\n'
        '{"prompt": "third", "output_tokens": 7}\n'
    )
    w = load_dataset(str(f), counter)
    rs = w.requests(7)
    assert w.name == "dataset:d.jsonl"
    assert rs[0].messages == [{"role": "user", "content": "hello there"}] and rs[0].max_tokens == 10
    assert rs[1].messages[0]["role"] == "system" and rs[1].max_tokens == 256
    assert rs[2].max_tokens == 7 and rs[0].prompt_tokens_target is None
    assert sorted(_text(r) for r in rs[3:6]) == sorted(_text(r) for r in rs[:3])  # a second pass
    assert load_dataset(str(f), counter, seed=0).requests(7) == rs
    c = load_dataset(str(f), counter, endpoint="completions").requests(2)
    assert c[0].prompt == "hello there" and c[1].prompt == "be brief\nhi"


def test_dataset_sharegpt(counter: TokenCounter, tmp_path) -> None:
    f = tmp_path / "sg.json"
    reply = "The capital of France is Paris."
    f.write_text(
        json.dumps(
            [
                {
                    "id": "a",
                    "conversations": [
                        {"from": "human", "value": "Capital of France?"},
                        {"from": "gpt", "value": reply},
                    ],
                },
                {"id": "b", "conversations": [{"from": "gpt", "value": "orphan reply"}]},
                {"id": "c", "conversations": [{"from": "human", "value": "No answer yet"}]},
            ]
        )
    )
    w = load_dataset(str(f), counter, max_tokens_default=99)
    assert w.skipped == 1 and "1 skipped" in w.description
    a, c = w.requests(2)
    assert a.messages[0]["content"] == "Capital of France?" and a.max_tokens == counter.count(reply)
    assert c.max_tokens == 99


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"prompt": "ok"}\n{"prompt": "broken"\n', r"invalid JSON at line 2"),
        ('{"prompt": "ok"}\n{"text": "no prompt"}\n', r"line 2 has no prompt"),
        ('{"prompt": "ok", "max_tokens": 0}\n', r"line 1: max_tokens"),
        ('[{"conversations": "x"}]', r"entry 0: 'conversations' must be a list"),
        ('[{"conversations": [{"from": "human"}]', r"invalid JSON at line 1"),
        ('["just a string"]', r"entry 0 is not a JSON object"),
        ("   \n", r"is empty"),
    ],
)
def test_dataset_errors(tmp_path, content: str, match: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(ConfigError, match=match) as ei:
        load_dataset(str(f), None)
    assert str(f) in str(ei.value) and "\n" not in str(ei.value)


def test_dataset_missing(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_dataset(str(tmp_path / "none.jsonl"), None)
