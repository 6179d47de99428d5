"""The local embedding backend (servelab.engines.embedder): all-MiniLM-L6-v2 converted with llama.cpp's
own script and served by the REAL llama-server, checked against reference vectors computed with
transformers (tests/gateway/make_embedding_reference.py -> data/embedding_reference.json).

Engine tests skip when no llama-server is cached, unless ``SERVELAB_REQUIRE_ENGINE`` is set (CI).
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servelab.engines import embedder
from servelab.engines.embedder import EMBEDDING_DIM, MAX_INPUT_TOKENS, MODEL_ID, EmbeddingLauncher
from servelab.engines.llamacpp import find_llama_server
from servelab.wire import ConfigError

REFERENCE = json.loads((Path(__file__).parent / "data" / "embedding_reference.json").read_text(encoding="utf-8"))
#: cosine(served, reference) must reach this for every text. f32 GGUF vs torch f32 differ only by
#: summation order and llama.cpp's GELU approximation: measured >= 0.999998 for every text here (2026-11-30).
MIN_COSINE = 0.99999


# ---------------------------------------------------------------------------------------------------
# no engine needed


def test_weights_package_is_complete() -> None:
    d = embedder.weights_dir()
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["hidden_size"] == EMBEDDING_DIM
    assert cfg["max_position_embeddings"] == MAX_INPUT_TOKENS
    # the reference was computed from these very weights
    assert embedder.file_sha256(d / "model.safetensors") == REFERENCE["weights_sha256"]


def test_bad_converter_python_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVELAB_CONVERT_PYTHON", "/bin/false")
    with pytest.raises(ConfigError, match="SERVELAB_CONVERT_PYTHON=/bin/false cannot import torch"):
        embedder.converter_python(create=False)


def test_launcher_command_line() -> None:
    la = EmbeddingLauncher(parallel=3, threads=1)
    argv = la.argv(Path("/bin/llama-server"), Path("/m.gguf"), 1234)
    assert argv[argv.index("-c") + 1] == str(3 * MAX_INPUT_TOKENS)
    assert argv[argv.index("-np") + 1] == "3"
    assert argv[argv.index("--pooling") + 1] == "mean"
    assert argv[argv.index("-ub") + 1] == str(MAX_INPUT_TOKENS)
    assert "--embeddings" in argv and argv[argv.index("--alias") + 1] == MODEL_ID
    with pytest.raises(ConfigError, match="--parallel must be >= 1"):
        EmbeddingLauncher(parallel=0)


# ---------------------------------------------------------------------------------------------------
# the real llama-server


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    if find_llama_server() is None:
        msg = "no cached llama-server (run `servelab engine build llamacpp`)"
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail(msg + "; SERVELAB_REQUIRE_ENGINE is set")
        pytest.skip(msg)
    eng = EmbeddingLauncher(parallel=2, log_dir=tmp_path_factory.mktemp("embed")).start()
    with eng:
        yield eng


def _post(eng: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        eng.base_url + "/embeddings", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _cos(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_vectors_match_reference_in_one_batch(engine: Any) -> None:
    items = REFERENCE["items"]
    status, body = _post(engine, {"model": MODEL_ID, "input": [it["text"] for it in items]})
    assert status == 200, body
    assert [d["index"] for d in body["data"]] == list(range(len(items)))
    for it, d in zip(items, body["data"], strict=True):
        v = np.asarray(d["embedding"])
        assert v.shape == (EMBEDDING_DIM,)
        assert abs(np.linalg.norm(v) - 1.0) < 1e-4, it["text"]  # L2-normalised like the Normalize module
        assert _cos(v, it["embedding"]) >= MIN_COSINE, (it["text"], _cos(v, it["embedding"]))
    # usage counts [CLS] + WordPiece tokens + [SEP], exactly as the HF tokenizer does
    assert body["usage"]["prompt_tokens"] == sum(it["prompt_tokens"] for it in items)


def test_single_inputs_token_ids_and_base64(engine: Any) -> None:
    ref = REFERENCE["items"][5]  # accents: the WordPiece normaliser must strip them like HF's
    status, body = _post(engine, {"model": MODEL_ID, "input": ref["text"], "encoding_format": "base64"})
    assert status == 200, body
    v = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert v.shape == (EMBEDDING_DIM,) and _cos(v, ref["embedding"]) >= MIN_COSINE
    assert body["usage"]["prompt_tokens"] == ref["prompt_tokens"]
    # "hello world" as BERT token ids: [CLS]=101 hello=7592 world=2088 [SEP]=102
    status, body = _post(engine, {"model": MODEL_ID, "input": [[101, 7592, 2088, 102]]})
    assert status == 200 and _cos(body["data"][0]["embedding"], REFERENCE["items"][0]["embedding"]) >= MIN_COSINE


def test_meaning_orders_similarity(engine: Any) -> None:
    texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The quick brown fox jumps over the lazy dog.",
    ]
    _, body = _post(engine, {"model": MODEL_ID, "input": texts})
    a, b, c = (d["embedding"] for d in body["data"])
    assert _cos(a, b) > 0.6 > _cos(a, c)


def test_openai_sdk_and_limits(engine: Any) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=engine.base_url, api_key="unused", max_retries=0)
    assert MODEL_ID in [m.id for m in client.models.list().data]
    ref = REFERENCE["items"][1]
    r = client.embeddings.create(model=MODEL_ID, input=[ref["text"]])  # the SDK asks for base64 and decodes
    assert len(r.data[0].embedding) == EMBEDDING_DIM and _cos(r.data[0].embedding, ref["embedding"]) >= MIN_COSINE
    assert r.usage.prompt_tokens == ref["prompt_tokens"]
    # longer than BERT's 512 positions: llama-server refuses (no silent truncation); the gateway's
    # capability check (context_tokens: 512) is what turns this into a 400 for clients
    status, body = _post(engine, {"model": MODEL_ID, "input": "word " * (MAX_INPUT_TOKENS + 10)})
    assert status >= 400 and "too large" in body["error"]["message"]
    status, body = _post(engine, {"model": MODEL_ID, "input": []})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
