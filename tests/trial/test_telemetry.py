"""Server-side telemetry (issue 11 item 3, servelab.trial.telemetry): NVML present or absent with its
reason, CUDA_VISIBLE_DEVICES parsing, process-tree CPU seconds of real processes, and a trial of the
real llama-server (``--metrics``) whose per-step records hold CPU %, RSS, the queue/running gauges and
server vs client output tokens that agree within 2 % on a steady step."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servelab.trial.telemetry import Nvml, host_gpus, parse_visible_devices, tree_cpu_seconds


def _nvml_works() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_nvml_present_or_absent_with_the_reason() -> None:
    nv = Nvml(None)
    try:
        if _nvml_works():  # a host with an NVIDIA driver: every device listed and sampled
            assert nv.info.present and nv.info.devices and nv.info.selected_by == "all"
            s = nv.sample()
            assert [g.index for g in s] == [d.index for d in nv.info.devices]
            assert all(g.memory_used_bytes is not None and g.memory_used_bytes >= 0 for g in s)
        else:  # this CI box: no driver — recorded as absent, with why, and sampling yields nothing
            assert not nv.info.present and nv.info.devices == []
            assert nv.info.reason is not None and "libnvidia-ml.so.1 not found" in nv.info.reason
            assert nv.sample() == []
        hg = host_gpus()  # the record's environment.gpu: the devices, or None without any
        assert (hg is None) == (not nv.info.present)
        if hg is not None:
            assert [d["index"] for d in hg["devices"]] == [d.index for d in nv.info.devices]
    finally:
        nv.close()


def test_nvml_restricted_to_no_device() -> None:
    nv = Nvml("")
    try:
        assert not nv.info.present and nv.info.reason
    finally:
        nv.close()


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, (None, None)),
        ("", ([], [])),
        ("-1", ([], [])),
        ("0,2", ([0, 2], [])),
        ("1,-1,0", ([1], [])),
        ("GPU-8f2c1d9e-aaaa-bbbb-cccc-0123456789ab", ([], ["GPU-8f2c1d9e-aaaa-bbbb-cccc-0123456789ab"])),
        ("0,bogus,1", ([0], [])),
    ],
)
def test_parse_visible_devices(value: str | None, want: tuple[list[int] | None, list[str] | None]) -> None:
    assert parse_visible_devices(value) == want


def test_tree_cpu_seconds_counts_children() -> None:
    # a parent that starts a busy child and waits: the child's CPU time is part of the tree's
    spin = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.6: pass\ntime.sleep(30)"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess,sys,time\np=subprocess.Popen([sys.executable,'-c',{spin!r}])\ntime.sleep(30)",
        ]
    )
    try:
        before = tree_cpu_seconds(parent.pid)
        assert before is not None
        deadline = time.monotonic() + 20
        got = before
        while time.monotonic() < deadline:
            got = tree_cpu_seconds(parent.pid) or 0.0
            if got - before >= 0.5:
                break
            time.sleep(0.2)
        assert got - before >= 0.5, (before, got)  # the child's spin, seen through the parent's tree
    finally:
        import psutil

        for c in psutil.Process(parent.pid).children(recursive=True):
            c.kill()
        parent.kill()
        parent.wait()
    assert tree_cpu_seconds(parent.pid) is None


def test_llama_server_telemetry_and_token_agreement(tmp_path: Path) -> None:
    from servelab.engines.llamacpp import find_llama_server
    from servelab.trial.flow import TrialRunner
    from servelab.trial.spec import Experiment

    if find_llama_server() is None:
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail("llama-server is not built: run 'servelab engine build llamacpp'")
        pytest.skip("llama-server not built")
    exp = Experiment.model_validate(
        {
            "goal": {
                "slo": "ttft_p95<=60s",
                "quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]},
                "mix": "short-qa:1",
            },
            "candidates": [{"name": "np2", "engine": "llamacpp", "settings": {"parallel": 2, "ctx_size": 2048}}],
            "workloads": [{"name": "short-qa", "set": {"input_tokens": 24, "output_tokens": 24}}],
            "steps": {"concurrency": [1, 2]},
            "requests_per_step": 6,
            "warmup": 1,
            "ignore_eos": True,
            "mix_sweep": False,
            "arrival_test": {"enabled": False},
            "capacity": {"enabled": False},
            "timeout_s": 120,
            "lifecycle": {"warm_start": False},
        }
    )
    rec = TrialRunner(exp, tmp_path / "run", progress=lambda *_: None).run()
    r = rec.results.candidates["np2"]
    assert r.status == "ranked", r.reason
    tel = r.telemetry
    assert tel is not None and tel.process_tree and tel.cpu_cores and tel.cpu_cores >= 1
    assert not tel.gpu.present or tel.gpu.devices
    if not tel.gpu.present:
        assert tel.gpu.reason and r.peak_gpu_memory_bytes is None
    assert set(tel.steps) == {"short-qa/c1", "short-qa/c2"}
    for label, st in tel.steps.items():
        assert st.samples >= 2 and st.span_s and st.span_s > 0
        assert st.cpu_percent is not None and st.cpu_percent > 5, (label, st.cpu_percent)  # it decoded
        assert st.rss_max_bytes and st.rss_max_bytes > 50 * 2**20
        assert st.running is not None and st.running.max is not None and st.running.max >= 1
        assert st.waiting is not None
        t = st.tokens
        assert t is not None and t.counter == "llamacpp:tokens_predicted_total"
        assert t.client_output_tokens > 0 and t.client_failed == 0
        assert t.diff_pct is not None and abs(t.diff_pct) <= 2.0, (label, t)  # client and server agree
        assert t.server_output_tokens_per_s and t.client_output_tokens_per_s
    assert tel.peak_rss_bytes and r.peak_rss_bytes
    lines = (tmp_path / "run" / "candidates" / "np2" / "server_metrics.jsonl").read_text().splitlines()
    assert lines and '"cpu_s"' in lines[-1]
    from servelab.trial.report import write_report

    html = write_report(tmp_path / "run").read_text()  # the panel shows each step's agreement, marked ok
    start = html.index('<div id="server-panel">')
    panel = html[start : html.index("</div>", start)]
    assert panel.count('<span class="ok">') == 2, panel[:3000]  # both steps within 2 %


def test_url_candidate_metrics_sampled_without_process_or_gpu(mock_engine, tmp_path: Path) -> None:
    """A server servelab did not start: its /metrics gauges are sampled per step (the mock speaking vLLM's
    names), no process tree is read and the GPU is absent with the reason."""
    from servelab.trial.flow import TrialRunner
    from servelab.trial.spec import Experiment

    mp = mock_engine("--dialect", "vllm", "--ttft-ms", "20", "--itl-ms", "50", "--output-tokens", "16")  # ~3 s step
    exp = Experiment.model_validate(
        {
            "goal": {
                "slo": "ttft_p95<=5s",
                "quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]},
                "mix": "short-qa:1",
            },
            "candidates": [{"name": "remote", "engine": "url", "url": mp.base_url}],
            "workloads": [{"name": "short-qa", "set": {"output_tokens": 16}}],
            "steps": {"concurrency": [2]},
            "requests_per_step": 8,
            "warmup": 0,
            "mix_sweep": False,
            "arrival_test": {"enabled": False},
            "capacity": {"enabled": False},
            "timeout_s": 30,
        }
    )
    rec = TrialRunner(exp, tmp_path / "run", progress=lambda *_: None).run()
    r = rec.results.candidates["remote"]
    assert r.status == "ranked", r.reason
    tel = r.telemetry
    assert tel is not None and not tel.process_tree and not tel.gpu.present
    assert tel.gpu.reason is not None and "not launched by servelab" in tel.gpu.reason
    st = tel.steps["short-qa/c2"]
    assert st.running is not None and st.running.max is not None and st.running.max >= 1  # vllm:num_requests_running
    assert st.cpu_percent is None and st.rss_max_bytes is None
    assert r.lifecycle is None  # nothing to restart: servelab did not start it


def test_generation_counters_come_from_the_registry() -> None:
    """The server-vs-client token check reads each registered kind's ``generation_tokens`` (the url
    kind's merged table carries SGLang's), so a third-party kind declares its own."""
    from servelab.engines import registry
    from servelab.trial.telemetry import generation_counters

    got = generation_counters()
    assert {"llamacpp:tokens_predicted_total", "vllm:generation_tokens_total", "sglang:generation_tokens_total"} <= set(
        got
    )
    assert registry.get("llamacpp").metrics.generation_tokens == ("llamacpp:tokens_predicted_total",)
    assert "sglang:generation_tokens_total" in registry.get("url").metrics.names()
