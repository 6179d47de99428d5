"""The report's server-side panel (servelab.trial.report_server) from a real trial of a launched mock
engine: per-step queue/running gauges, CPU % and RSS of the engine's process tree, the GPU line (absent
with its reason here), cold vs warm start, reliability and identity facts with sources — in the HTML
and in the DOM headless Chromium renders."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser_check import _assert_rendered, _chromium_run

from servelab.trial.flow import TrialRunner
from servelab.trial.report import write_report
from servelab.trial.spec import Experiment


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exp = Experiment.model_validate(
        {
            "goal": {
                "slo": "ttft_p95<=5s",
                "quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]},
                "mix": "short-qa:1",
            },
            "candidates": [
                {
                    "name": "m",
                    "engine": "mock",
                    "settings": {"ttft_ms": 20.0, "itl_ms": 20.0, "output_tokens": 24, "dialect": "llamacpp"},
                }
            ],
            "workloads": [{"name": "short-qa", "set": {"output_tokens": 24}}],
            "steps": {"concurrency": [1, 2]},
            "requests_per_step": 6,
            "warmup": 0,
            "mix_sweep": False,
            "repeats": 1,
            "arrival_test": {"enabled": False},
            "capacity": {"enabled": False},
            "timeout_s": 30,
        }
    )
    out = tmp_path_factory.mktemp("panel") / "run"
    rec = TrialRunner(exp, out, progress=lambda *_: None).run()
    assert rec.results.candidates["m"].status == "ranked", rec.results.candidates["m"].reason
    return out


def _panel(text: str) -> str:
    m = re.search(r'<div id="server-panel">(.*?)</div>', text, re.S)
    assert m is not None, "no server panel"
    return m.group(1)


def test_panel_holds_the_server_side_figures(run: Path) -> None:
    from servelab.trial.results import read_record

    rec = read_record(run / "record.json")
    tel = rec.results.candidates["m"].telemetry
    assert tel is not None and set(tel.steps) == {"short-qa/c1", "short-qa/c2"}
    assert all(
        s.running is not None and s.running.max is not None and s.running.max >= 1 for s in tel.steps.values()
    )  # the mock's llama.cpp dialect gauge, found without a kind table
    panel = _panel(write_report(run).read_text())
    table = re.search(r'<table class="server-panel">(.*?)</table>', panel, re.S)
    assert table is not None
    rows = re.findall(r"<tr><td><code>short-qa/c(\d)</code></td>(.*?)</tr>", table.group(1), re.S)
    assert [r[0] for r in rows] == ["1", "2"]
    cpu_percent = []
    for _, cells in rows:
        vals = re.findall(r"<td>(.*?)</td>", cells)
        assert vals[1] != "—" and vals[4].endswith("MiB")  # running, RSS
        cpu_percent.append(float(vals[3]))  # a measured figure, never the "—" of none
    # CPU seconds come from /proc in clock ticks (10 ms): a step of the lightly loaded mock can use less than
    # one tick between its samples, so 0 is a true reading of one step; the trial as a whole used CPU
    assert min(cpu_percent) >= 0 and sum(cpu_percent) > 0, cpu_percent
    if not tel.gpu.present:
        assert "GPU: not measured — NVML:" in panel
    assert "Cold vs warm start" in panel and "warm (second launch)" in panel and "none: the mock" in panel
    assert "Identity facts" in panel and "<th>source</th>" in panel
    assert "Served-behaviour checks" in panel and "chat template: unknown" in panel  # default [template]


def test_panel_renders_in_chromium(run: Path, tmp_path: Path) -> None:
    page = write_report(run)
    text = page.read_text()
    res = _chromium_run(page, tmp_path / "profile", "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    _assert_rendered(res.stdout, int(re.search(r'data-charts="(\d+)"', text).group(1)))
    dom = _panel(res.stdout)
    assert dom.count('<table class="server-panel">') == 1 and "short-qa/c2" in dom
