"""``engine: command``: any engine started by its own command line. Settings refused with one line,
argv placeholders, a fixed port that is taken, the stop signal and its grace reaching the whole
process group (children included), ``first_token`` readiness, ``after_ready`` commands, and the real
llama-server started through a plain command line holding the same identity facts as the built-in
launcher."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from servelab.engines import registry
from servelab.engines.command_identity import comparable_facts
from servelab.engines.command_settings import CommandSettings
from servelab.wire import ConfigError

KIND = registry.get("command")

#: a tiny OpenAI-shaped server: /health, /v1/models; it starts a child (`sleep`), writes both pids and,
#: on a signal, the signal's name, then exits after ``GRACE`` seconds (or at once when GRACE is 0)
SERVER = textwrap.dedent("""
    import http.server, json, os, signal, subprocess, sys, time
    port, out, grace = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    child = subprocess.Popen(["sleep", "300"])
    open(out + ".pids", "w").write(f"{os.getpid()} {child.pid}")
    def on(sig, _):
        open(out + ".sig", "a").write(signal.Signals(sig).name + "\\n")
        time.sleep(grace)
        sys.exit(0)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "tiny"}]}).encode() if self.path == "/v1/models" else b"ok"
            self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def _gone(*pids: int) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_settings_refused_with_one_line() -> None:
    with pytest.raises(ConfigError, match=r"command settings: argv has no \{port\}"):
        KIND.parse({"argv": ["llama-server", "--port", "8000"]})
    with pytest.raises(ConfigError, match=r"command setting 'argv'"):
        KIND.parse({"argv": "llama-server --port {port}"})
    with pytest.raises(ConfigError, match=r"'stop_signl'.*stop_signal"):
        KIND.parse({"argv": ["x", "{port}"], "stop_signl": "SIGINT"})
    with pytest.raises(ConfigError, match=r"command setting 'env': value of 'A'"):
        KIND.parse({"argv": ["x", "{port}"], "env": {"A": [1]}})
    with pytest.raises(ConfigError, match="takes no model"):
        KIND.launcher({"argv": ["x", "{port}"]}, model="/m.gguf")
    ok = KIND.parse({"argv": ["x"], "port": 8123, "ready": "first_token", "env": {"N": 2}})
    assert ok.env == {"N": "2"} and ok.ready == "first_token"


def test_argv_placeholders_replaced_nothing_started() -> None:
    lr = KIND.launcher({"argv": ["srv", "--host", "{host}", "--port={port}", "-x"], "host": "127.0.0.2"})
    assert lr.argv(4242) == ["srv", "--host", "127.0.0.2", "--port=4242", "-x"]
    assert lr.port is None and lr.ready_timeout_s == 600.0


def test_taken_port_refused_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError) as e:
            KIND.launch({"argv": [sys.executable, "-c", "pass"], "port": port}, log_dir=str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and f"port {port}" in msg and "already taken" in msg and "{port}" in msg
    assert "pid" in msg  # the owner is named (psutil)
    assert not list(tmp_path.glob("*.log"))  # nothing was started


def test_unknown_binary_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not an executable file or on PATH"):
        KIND.launch({"argv": ["no-such-engine-xyz", "--port", "{port}"]}, log_dir=str(tmp_path))


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_stop_signal_reaches_the_group_and_no_process_is_left(tmp_path: Path, sig: str) -> None:
    script = tmp_path / "srv.py"
    script.write_text(SERVER)
    out = tmp_path / "o"
    eng = KIND.launch(
        {"argv": [sys.executable, str(script), "{port}", str(out), "0"], "stop_signal": sig, "stop_grace_s": 5.0},
        log_dir=str(tmp_path / "logs"),
    )
    cs = eng.cold_start
    assert 0 < cs["port_open_s"] <= cs["health_s"]
    assert eng.model_name == "tiny" and eng.base_url.endswith("/v1")
    assert Path(eng.log_path).parent == tmp_path / "logs" and "starting" in Path(eng.log_path).read_text()
    leader, child = map(int, Path(str(out) + ".pids").read_text().split())
    eng.stop()
    assert Path(str(out) + ".sig").read_text().split()[0] == sig
    assert _gone(leader, child)


def test_grace_then_sigkill(tmp_path: Path) -> None:
    """A server that takes 30 s after the signal is killed once ``stop_grace_s`` has passed."""
    script = tmp_path / "srv.py"
    script.write_text(SERVER)
    out = tmp_path / "o"
    eng = KIND.launch(
        {"argv": [sys.executable, str(script), "{port}", str(out), "30"], "stop_grace_s": 0.5}, log_dir=str(tmp_path)
    )
    leader, child = map(int, Path(str(out) + ".pids").read_text().split())
    t0 = time.monotonic()
    rc = eng.stop()
    took = time.monotonic() - t0
    assert rc == -9 and took < 10, (rc, took)
    assert _gone(leader, child)


def test_first_token_readiness_and_after_ready(tmp_path: Path) -> None:
    mark = tmp_path / "pulled"
    eng = KIND.launch(
        {
            "argv": [
                sys.executable,
                "-m",
                "servelab.engines.mock",
                "--host",
                "{host}",
                "--port",
                "{port}",
                "--ttft-ms",
                "5",
                "--itl-ms",
                "1",
            ],
            "ready": "first_token",
            "guard": True,
            "after_ready": [[sys.executable, "-c", f"open({str(mark)!r}, 'w').write('{{port}}')"]],
        },
        log_dir=str(tmp_path),
    )
    try:
        cs = eng.cold_start
        assert cs["port_open_s"] <= cs["first_token_s"] == cs["health_s"]
        assert mark.read_text() == str(eng.port)
        ident = eng.identity
        assert ident["kind"] == "command" and ident["facts"]["python"]["source"] == "launcher"
        assert ident["facts"]["package"]["value"] == "servelab"
        tree = [eng.pid] + [p.pid for p in psutil.Process(eng.pid).children(recursive=True)]
        assert len(tree) >= 2  # the guard and the engine behind it
    finally:
        eng.stop()
    assert _gone(*tree)


def test_llama_server_by_command_line_has_the_built_in_identity(tmp_path: Path) -> None:
    from servelab.engines.llamacpp import LlamaCppLauncher, default_model_path, find_llama_server

    found = find_llama_server()  # the cached build for this host (the cache has a folder per build variant)
    if found is None:
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail("llama-server is not built: run 'servelab engine build llamacpp'")
        pytest.skip("llama-server not built ('servelab engine build llamacpp')")
    binary, model = str(found), str(default_model_path())
    s = CommandSettings(
        argv=[binary, "-m", model, "--host", "{host}", "--port", "{port}", "-c", "2048", "-np", "1", "--metrics"]
    )
    eng = KIND.launch(s, log_dir=str(tmp_path))
    try:
        eng.measure_first_token(timeout_s=60)
        cs = eng.cold_start
        assert 0 < cs["port_open_s"] <= cs["health_s"] <= cs["first_token_s"]
        ident = eng.identity
        assert eng.read_metrics()  # --metrics on the plain command line
        tree = [eng.pid] + [p.pid for p in psutil.Process(eng.pid).children(recursive=True)]
    finally:
        eng.stop()
    assert _gone(*tree)
    with LlamaCppLauncher(ctx_size=2048, parallel=1, binary=binary, log_dir=tmp_path).start() as built_in:
        expected = built_in.identity
    assert comparable_facts(ident) == comparable_facts(expected)
    assert ident["detected_kind"] == "llamacpp" and ident["engine"] == "llama.cpp"
    facts = ident["facts"]
    assert facts["binary_sha256"] == {"value": expected["binary_sha256"], "source": "launcher"}
    assert facts["slots"] == {"value": 1, "source": "GET /props"}
    assert facts["context_tokens"] == {"value": 2048, "source": "GET /props"}
    assert facts["model_path"]["value"] == model


def test_port_placeholder_in_env(tmp_path: Path) -> None:
    """An engine that takes its port from the environment only (Ollama's OLLAMA_HOST): ``{port}`` in an
    ``env`` value is replaced, and the server answers there."""
    code = (
        "import os, sys; host, port = os.environ['SRV_HOST'].split(':'); os.execv(sys.executable, "
        "[sys.executable, '-m', 'servelab.engines.mock', '--host', host, '--port', port])"
    )
    eng = KIND.launch(
        {"argv": [sys.executable, "-c", code], "env": {"SRV_HOST": "{host}:{port}"}}, log_dir=str(tmp_path)
    )
    try:
        assert eng.base_url == f"http://127.0.0.1:{eng.port}/v1"
        assert eng.identity["launcher"]["env"] == {"SRV_HOST": f"127.0.0.1:{eng.port}"}
        assert eng.get("/health")[0] == 200
    finally:
        eng.stop()


@pytest.mark.parametrize("name", ["command-cpu.yaml", "command-gpu-engines.yaml"])
def test_worked_examples_validate(name: str) -> None:
    """The experiment files of docs/command-candidates.md load (every candidate an ``engine: command``)."""
    from servelab.trial.spec import load_experiment

    exp = load_experiment(Path(__file__).parents[2] / "examples" / name)
    assert exp.candidates and all(c.engine == "command" for c in exp.candidates)
    for c in exp.candidates:
        plan = KIND.launcher(c.settings).plan(8123)
        assert any("8123" in a for a in plan["argv"]) or "8123" in str(plan["env"]), c.name
