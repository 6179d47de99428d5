"""The report's capacity-model section: a record whose candidate carries ``capacity_model`` (fitted by
servelab.capacity.trialmodel on the recorded llama-server run of tests/capacity/fixtures) renders the
fitted law with its intervals, one held-out row per step with predicted vs measured and the error,
the capacity-search check, and a predicted-vs-measured chart; a record without one renders no such
section. In-process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from servelab.bench.analysis.slo import parse_slo
from servelab.capacity.trialmodel import candidate_model
from servelab.trial.report import render_report

RUN1 = Path(__file__).parent / "fixtures" / "run1"
REAL = Path(__file__).parents[1] / "capacity" / "fixtures" / "llamacpp-slots"


def test_capacity_model_section_renders(tmp_path: Path) -> None:
    search = json.loads((REAL / "search.json").read_text())["candidates"]["np4"]
    probes = [(p["rate_rps"], p["held"], p["step"]) for p in search["capacity"]["probes"]]
    got = candidate_model(
        REAL, "np4", slots=4, probes=probes, slo=parse_slo("ttft_p95<=3s,itl_p95<=400ms"), burstiness=0.5, bootstrap=4
    )
    assert got is not None
    cc, _ = got
    run = tmp_path / "run"
    shutil.copytree(RUN1, run)
    plain = render_report(run)
    assert 'id="capacity-model"' not in plain
    rec = json.loads((run / "record.json").read_text())
    rec["results"]["candidates"]["llama-4slot"]["capacity_model"] = json.loads(cc.model_dump_json())
    (run / "record.json").write_text(json.dumps(rec))
    html = render_report(run)
    assert 'id="capacity-model"' in html and "<h3>llama-4slot</h3>" in html
    assert cc.validation is not None
    section = html.split('id="capacity-model"', 1)[1].split("</section>", 1)[0]
    assert section.count("held-out step") >= 1
    for c in cc.validation.steps:
        assert f"<td>{c.step}</td>" in section, c.step
    assert "prefill serial" in section and "capacity search held" in section
    assert "Capacity model: every load step held out" in html  # the chart's title
    charts = int(html.split('data-charts="', 1)[1].split('"', 1)[0])
    assert charts == int(plain.split('data-charts="', 1)[1].split('"', 1)[0]) + 1
