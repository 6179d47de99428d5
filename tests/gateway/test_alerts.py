"""Issue 24 item 3: the shipped alert rules, checked by the real Prometheus tooling (Debian's ``prometheus``
package brings ``promtool``): ``promtool check rules`` on the file as ``servelab gateway alerts`` prints it,
and ``promtool test rules`` with one case per rule that fires it from the gateway's own series (the alert's
labels and annotations exactly) and a quiet time before its ``for:`` window where nothing fires. The docs
list every rule with its runbook line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from servelab.gateway.alerts import rules_text
from servelab.gateway.cli import gateway_app

DOCS = Path(__file__).resolve().parents[2] / "docs" / "alerts.md"
P = "servelab_gateway_"


def _rules() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in yaml.safe_load(rules_text())["groups"] for r in g["rules"]}


def _hist(name: str, labels: str, fast_le: str, slow_le: str, slow: str) -> list[dict[str, str]]:
    """Bucket series where every observation falls in ``slow_le``'s bucket (``slow``: its values)."""
    return [
        {"series": f'{name}_bucket{{{labels},le="{fast_le}"}}', "values": "0x30"},
        {"series": f'{name}_bucket{{{labels},le="{slow_le}"}}', "values": slow},
        {"series": f'{name}_bucket{{{labels},le="+Inf"}}', "values": slow},
    ]


#: alert -> (interval, input series, eval time when it fires, its own labels, a quiet eval time before)
CASES: dict[str, tuple[str, list[dict[str, str]], str, dict[str, str], str]] = {
    "ServelabTTFTAboveSLO": (
        "1m",
        _hist(P + "ttft_seconds", 'model="m"', "1", "2.5", "0+10x30"),
        "15m",
        {"model": "m"},
        "4m",
    ),
    "ServelabE2EAboveSLO": (
        "1m",
        _hist(P + "request_duration_seconds", 'model="m"', "30", "60", "0+10x30"),
        "20m",
        {"model": "m"},
        "8m",
    ),
    "ServelabTTFTUpVsYesterday": (
        "10m",
        [
            {"series": f'{P}ttft_seconds_bucket{{model="m",le="0.25"}}', "values": "0+10x150 1500+0x50"},
            {"series": f'{P}ttft_seconds_bucket{{model="m",le="2.5"}}', "values": "0+10x200"},
            {"series": f'{P}ttft_seconds_bucket{{model="m",le="+Inf"}}', "values": "0+10x200"},
        ],
        "1900m",
        {"model": "m"},
        "1490m",
    ),
    "ServelabServerErrorRate": (
        "1m",
        [
            {"series": f'{P}requests_total{{model="m",backend="a",status="200"}}', "values": "0+90x20"},
            {"series": f'{P}requests_total{{model="m",backend="a",status="503"}}', "values": "0+10x20"},
        ],
        "15m",
        {"model": "m"},
        "4m",
    ),
    "ServelabRateLimitedRate": (
        "1m",
        [
            {"series": f'{P}requests_total{{model="m",backend="a",status="200"}}', "values": "0+50x30"},
            {"series": f'{P}requests_total{{model="m",backend="none",status="429"}}', "values": "0+50x30"},
        ],
        "25m",
        {"model": "m"},
        "10m",
    ),
    "ServelabStreamsInterrupted": (
        "1m",
        [
            {"series": f'{P}stream_errors_total{{model="m",backend="a"}}', "values": "0+5x20"},
            {"series": f'{P}requests_total{{model="m",backend="a",status="200"}}', "values": "0+100x20"},
        ],
        "15m",
        {"model": "m", "backend": "a"},
        "4m",
    ),
    "ServelabEngineDown": (
        "1m",
        [{"series": f'{P}engine_scrape_up{{backend="a",kind="llamacpp"}}', "values": "0x10"}],
        "5m",
        {"backend": "a", "kind": "llamacpp"},
        "0m",
    ),
    "ServelabEngineRestarting": (
        "1m",
        [{"series": f'{P}engine_scrape_up{{backend="a",kind="llamacpp"}}', "values": "1 1 0 1 0 1 1 1"}],
        "6m",
        {"backend": "a", "kind": "llamacpp"},
        "2m",
    ),
    "ServelabEngineQueueBacklog": (
        "1m",
        [
            {"series": f'{P}engine_requests_waiting{{backend="a",kind="llamacpp"}}', "values": "3x10"},
            {"series": f'{P}engine_requests_running{{backend="a",kind="llamacpp"}}', "values": "1x10"},
        ],
        "8m",
        {"backend": "a", "kind": "llamacpp"},
        "3m",
    ),
    "ServelabKVCacheNearFull": (
        "1m",
        [{"series": f'{P}engine_kv_cache_usage_ratio{{backend="v",kind="vllm"}}', "values": "0.95x10"}],
        "8m",
        {"backend": "v", "kind": "vllm"},
        "3m",
    ),
    "ServelabGPUMemoryNearFull": (
        "1m",
        [
            {"series": 'DCGM_FI_DEV_FB_USED{gpu="0"}', "values": "76000x10"},
            {"series": 'DCGM_FI_DEV_FB_FREE{gpu="0"}', "values": "2000x10"},
        ],
        "8m",
        {"gpu": "0"},
        "3m",
    ),
    "ServelabBreakerOpen": (
        "1m",
        [{"series": f'{P}breaker_state{{backend="a"}}', "values": "2x5"}],
        "3m",
        {"backend": "a"},
        "0m",
    ),
    "ServelabBudgetExhausted": (
        "1m",
        [{"series": f'{P}limit_rejections_total{{limit="budget"}}', "values": "0 0 0 1 1 1"}],
        "4m",
        {"limit": "budget"},
        "2m",
    ),
}


def _promtool() -> str:
    p = shutil.which("promtool")
    if p is None:
        pytest.skip("no promtool (apt-get install -y prometheus)")
    return p


def test_every_rule_has_a_case_an_action_and_a_runbook_in_the_docs() -> None:
    rules = _rules()
    assert set(rules) == set(CASES)
    docs = DOCS.read_text()
    for name, r in rules.items():
        assert r["labels"]["action"] in ("scale", "degrade", "restart", "shift", "rollback"), name
        assert r["annotations"]["runbook"].split(":")[0] == r["labels"]["action"], name
        assert f"`{name}`" in docs and r["annotations"]["runbook"] in docs, name


def test_cli_prints_the_rules() -> None:
    out = CliRunner().invoke(gateway_app, ["alerts"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == rules_text().strip()


def test_promtool_checks_and_unit_tests_every_rule(tmp_path: Path) -> None:
    promtool = _promtool()
    rules = _rules()
    (tmp_path / "rules.yaml").write_text(rules_text())
    check = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0 and f"SUCCESS: {len(rules)} rules found" in check.stdout, check.stdout + check.stderr
    tests = []
    for name, (interval, series, fire_at, labels, quiet_at) in CASES.items():
        r = rules[name]
        tests.append(
            {
                "interval": interval,
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": quiet_at, "alertname": name, "exp_alerts": []},
                    {
                        "eval_time": fire_at,
                        "alertname": name,
                        "exp_alerts": [{"exp_labels": {**r["labels"], **labels}, "exp_annotations": r["annotations"]}],
                    },
                ],
            }
        )
    spec = tmp_path / "alerts_test.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False, width=1000
        )
    )
    res = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout[-4000:] + res.stderr[-4000:]
