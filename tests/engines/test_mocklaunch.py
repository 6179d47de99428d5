"""The mock engine launched like a real engine: ``start_engine("mock", settings=...)`` / ``MockLauncher``."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import servelab
from servelab.engines import ENGINE_KINDS, start_engine
from servelab.engines.exits import EngineStartError
from servelab.engines.mock.launch import MOCK_SETTINGS, MockLauncher, check_mock_settings, mock_argv
from servelab.engines.registry import EngineIdentity
from servelab.engines.running import RunningEngine
from servelab.wire import ConfigError
from servelab.wire.client import make_session, send
from servelab.wire.types import RequestRecord, RequestSpec

pytestmark = pytest.mark.timeout(120)

MSG = [{"role": "user", "content": "hello there"}]


async def _send(base_url: str, n: int = 1, **extra: Any) -> list[RequestRecord]:
    spec = RequestSpec(endpoint="chat", messages=MSG, max_tokens=64, extra=extra)
    out = []
    async with make_session() as session:
        for i in range(n):
            rec = RequestRecord(request_id=i)
            await send(session, base_url, "m", spec, rec, timeout_s=20)
            out.append(rec)
    return out


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_engine_kinds_lists_mock() -> None:
    assert "mock" in ENGINE_KINDS and "llamacpp" in ENGINE_KINDS


def test_start_stop_identity_cold_start_no_orphans(tmp_path: Path) -> None:
    eng = start_engine(
        "mock", settings={"dialect": "sglang", "ttft_ms": 5, "output_tokens": 4, "model": "mm"}, log_dir=str(tmp_path)
    )
    try:
        assert isinstance(eng, RunningEngine) and eng.alive
        ident = eng.identity
        assert EngineIdentity.model_validate(ident).kind == "mock"  # the one identity model of every launcher
        assert ident["engine"] == "servelab-mock" and ident["version"] == servelab.__version__
        assert ident["model"] == {"path": None, "sha256": None}
        assert ident["argv"] == eng.argv
        assert ident["argv"][1:3] == ["-m", "servelab.engines.mock"]
        assert ident["argv"][ident["argv"].index("--dialect") + 1] == "sglang"
        assert ident["argv"][ident["argv"].index("--port") + 1] == str(eng.port)
        s = ident["settings"]
        assert set(s) == (set(MOCK_SETTINGS) - {"ready_timeout_s"}) | {"host"}
        assert s["dialect"] == "sglang" and s["ttft_ms"] == 5.0 and s["output_tokens"] == 4 and s["model"] == "mm"
        assert s["port"] == eng.port and s["host"] == "127.0.0.1" and s["invalid_json"] is False
        json.dumps(ident)  # JSON-serialisable
        assert set(eng.cold_start) == {"port_open_s", "health_s"}
        assert 0 < eng.cold_start["port_open_s"] <= eng.cold_start["health_s"] < 60
        assert eng.base_url == f"http://127.0.0.1:{eng.port}/v1"
        assert eng.model_name == "mm"
        eng.measure_first_token(timeout_s=20)
        assert eng.cold_start["first_token_s"] >= eng.cold_start["health_s"]
        (rec,) = asyncio.run(_send(eng.base_url))
        assert rec.ok and rec.output_tokens == 4
        assert eng.log_path.parent == tmp_path and "listening on" in eng.log_path.read_text()
        pid = eng.pid
        tree = [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    finally:
        rc = eng.stop()
    assert rc is not None and not eng.alive
    assert all(_gone(p) for p in tree)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # no member of its process group is left


def test_crash_after_requests_process_is_gone(tmp_path: Path) -> None:
    with start_engine(
        "mock", settings={"crash_after_requests": 1, "output_tokens": 8, "itl_ms": 2}, log_dir=str(tmp_path)
    ) as eng:
        pid = eng.pid
        recs = asyncio.run(_send(eng.base_url, 2))
        assert recs[0].ok and not recs[1].ok
        deadline = time.monotonic() + 10
        while eng.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert eng.alive is False
        assert eng.process.returncode == 3
        assert _gone(pid) and not psutil.pid_exists(pid)
        assert "injected crash" in eng.log_path.read_text()
    assert eng.returncode == 3


def test_invalid_json_content_fails_json_loads(tmp_path: Path) -> None:
    rf = {
        "type": "json_schema",
        "json_schema": {
            "name": "p",
            "schema": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["name", "n"],
            },
        },
    }
    with start_engine("mock", settings={"invalid_json": True}, log_dir=str(tmp_path)) as eng:
        assert "--invalid-json" in eng.argv
        (rec,) = asyncio.run(_send(eng.base_url, response_format=rf))
        assert rec.ok
        content = "".join(rec.content)
        assert content.startswith("{")
        with pytest.raises(json.JSONDecodeError):
            json.loads(content)


def test_fixed_port_taken_is_a_start_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(EngineStartError) as ei:
            MockLauncher(port=port, log_dir=tmp_path, ready_timeout_s=30).start()
    assert ei.value.returncode == 2 and getattr(ei.value, "bind_failed", False)


# ------------------------------------------------------------------------------------------------
# settings checks (nothing is started)


@pytest.mark.parametrize(
    "settings, needle",
    [
        ({"ttft": 5}, "'ttft'"),
        ({"dialect": "sglang", "bogus_key": 1}, "'bogus_key'"),
        ({"ttft_ms": "5"}, "'ttft_ms'"),
        ({"invalid_json": 1}, "'invalid_json'"),
        ({"crash_after_requests": 1.5}, "'crash_after_requests'"),
        ({"dialect": "openai"}, "mock setting 'dialect': 'openai' is not one of"),
        ({"crash_after_requests": -1}, "mock setting 'crash_after_requests'"),
        ({"cut_rate": 0.6, "hang_rate": 0.6}, "must be <= 1"),
    ],
)
def test_bad_mock_settings_are_one_line_config_errors(settings: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        start_engine("mock", settings=settings)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg


def test_mock_rejects_a_model_file() -> None:
    with pytest.raises(ConfigError, match="no model file"):
        start_engine("mock", model="/tmp/x.gguf")


def test_unknown_kind() -> None:
    with pytest.raises(ConfigError, match="unknown engine 'vllm-cpu'.*llamacpp, vllm, mock"):
        start_engine("vllm-cpu")
    with pytest.raises(ConfigError, match="'url' is not started by servelab"):
        start_engine("url")


def test_mock_argv_flags() -> None:
    s = check_mock_settings(
        {
            "invalid_json": True,
            "crash_after_requests": None,
            "overload_status": 503,
            "itl_ms": 2,
            "port": 1,
            "ready_timeout_s": 5,
        }
    )
    argv = mock_argv(s, "127.0.0.1", 4242, python="py")
    assert argv == [
        "py",
        "-m",
        "servelab.engines.mock",
        "--host",
        "127.0.0.1",
        "--port",
        "4242",
        "--invalid-json",
        "--overload-status",
        "503",
        "--itl-ms",
        "2.0",
    ]
    assert "--invalid-json" not in mock_argv(check_mock_settings({"invalid_json": False}), "h", 1)


def test_llamacpp_settings_override_named_args(monkeypatch: pytest.MonkeyPatch) -> None:
    from servelab.engines.llamacpp import LlamaCppLauncher

    monkeypatch.setattr(LlamaCppLauncher, "start", lambda self: self)
    old_style = start_engine("llamacpp", model="m.gguf", parallel=2, ctx_size=1024, log_dir="/tmp/x")
    assert (old_style.model_path, old_style.parallel, old_style.ctx_size, old_style.log_dir) == (
        "m.gguf",
        2,
        1024,
        "/tmp/x",
    )
    la = start_engine(
        "llamacpp",
        parallel=2,
        threads=1,
        settings={"parallel": 8, "ctx_size": 2048, "threads": 3, "extra_args": ["--foo", "1"]},
    )
    assert (la.parallel, la.ctx_size, la.threads, la.extra_args) == (8, 2048, 3, ("--foo", "1"))


@pytest.mark.parametrize(
    "settings, needle",
    [
        ({"n_parallel": 4}, "'n_parallel'"),
        ({"parallel": "4"}, "'parallel'"),
        ({"extra_args": "--foo"}, "'extra_args'"),
        ({"threads": True}, "'threads'"),
    ],
)
def test_bad_llamacpp_settings(settings: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        start_engine("llamacpp", settings=settings)
    assert needle in str(ei.value) and "\n" not in str(ei.value)
