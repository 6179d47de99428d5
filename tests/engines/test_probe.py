"""Identity by asking the server: the real llama-server, the mock in every dialect (answering each
engine's documented identity endpoints), and a server that is not there."""

from __future__ import annotations

import socket

import pytest

from servelab.engines.llamacpp import LlamaCppLauncher
from servelab.engines.mock import DIALECTS
from servelab.engines.mock.info import MOCK_VERSION
from servelab.engines.probe import probe_sync, server_root

#: per dialect: the engine's own endpoint the kind must be learned from, and where the version comes from
EXPECTED = {
    "vllm": ("vllm", "GET /version", "GET /v1/models"),
    "sglang": ("sglang", "GET /get_server_info", "GET /get_model_info"),
    "tgi": ("tgi", "GET /info", None),
    "llamacpp": ("llamacpp", None, "GET /props"),
    "ollama": ("ollama", "GET /api/version", None),
}


def test_server_root() -> None:
    assert server_root("http://h:1/v1") == "http://h:1"
    assert server_root("http://h:1/v1/") == "http://h:1"
    assert server_root("http://h:1/api") == "http://h:1/api"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_probe_detects_each_dialect(mock_engine, dialect: str) -> None:
    mp = mock_engine("--dialect", dialect, "--model", "org/Model-7B", "--context-tokens", "2048")
    got = probe_sync(mp.base_url)
    kind, version_src, path_src = EXPECTED[dialect]
    assert got.kind == kind, got
    assert got.value("model_id") == "org/Model-7B"
    if version_src:
        assert got.facts["version"].value == MOCK_VERSION and got.facts["version"].source == version_src
    else:  # llama.cpp states a build string, not a release number; the mock's is not "b<N>-<commit>"
        assert "version" not in got.facts and got.value("build") == MOCK_VERSION
    if path_src:
        assert got.facts["model_path"].value == "org/Model-7B" and got.facts["model_path"].source == path_src
    ctx = got.value("context_tokens") or got.value("train_context_tokens")
    assert ctx == 2048, got.facts
    if dialect == "tgi":
        assert got.facts["max_input_tokens"].value == 2047
    if dialect == "ollama":
        assert "POST /api/show" in got.answered and got.value("quantization") == "F16"


def test_a_plain_openai_server_is_not_guessed(mock_engine) -> None:
    """The gateway-like answer (only /v1/models, owned_by someone else) gives no kind, no version."""
    mp = mock_engine("--dialect", "vllm")
    got = probe_sync(mp.base_url.replace("/v1", "/nothing/v1"))
    assert got.kind is None and "version" not in got.facts and got.answered == []


def test_refused_connection_gives_errors_not_an_exception() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    got = probe_sync(f"http://127.0.0.1:{port}/v1", timeout_s=2)
    assert got.kind is None and got.facts == {} and len(got.errors) == 7


def test_probe_real_llama_server() -> None:
    with LlamaCppLauncher(parallel=2, ctx_size=4096).start() as eng:
        got = probe_sync(eng.base_url)
    assert got.kind == "llamacpp" and got.engine == "llama.cpp"
    assert got.facts["slots"].value == 2 and got.facts["slots"].source == "GET /props"
    assert got.value("context_tokens") == 2048  # per slot: -c 4096 over -np 2
    assert got.value("model_path") == eng.identity["model"]["path"]
    assert got.value("train_context_tokens") == 32768  # Gemma 3 270M's trained context (GGUF metadata)
    assert got.value("parameter_count") == 268098176
    assert got.value("quantization") == "Q4_K - Medium"
