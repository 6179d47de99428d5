"""SLO parsing, evaluation and per-request gates."""

from __future__ import annotations

import pytest

from servelab.bench.analysis.slo import Objective, apply_gates, evaluate, load_slo_file, parse_slo
from servelab.wire.client import ConfigError
from servelab.wire.types import FailureClass, RequestRecord, RequestSpec


def test_parse_units_and_defaults():
    objs = parse_slo("ttft_p95<=500ms, itl_p99<=0.05s,e2e<=10,error_rate<=1%")
    assert objs == [
        Objective("ttft", "p95", 0.5),
        Objective("itl", "p99", 0.05),
        Objective("e2e", "p95", 10.0),
        Objective("error_rate", "rate", 0.01),
    ]


@pytest.mark.parametrize("bad", ["ttft_p95=500ms", "latency_p95<=1s", "ttft_p95<=5%", "error_rate<=3s", "ttft<=abc"])
def test_parse_errors_are_one_clear_line(bad):
    with pytest.raises(ConfigError) as e:
        parse_slo(bad)
    msg = str(e.value)
    assert "\n" not in msg and "invalid SLO" in msg and "--slo" in msg


def test_slo_file(tmp_path):
    p = tmp_path / "slo.yaml"
    p.write_text("ttft_p95: 300ms\nerror_rate: 2%\n")
    assert load_slo_file(str(p)) == [Objective("ttft", "p95", 0.3), Objective("error_rate", "rate", 0.02)]
    with pytest.raises(ConfigError, match="does not exist"):
        load_slo_file(str(tmp_path / "nope.yaml"))


def test_evaluate():
    summary = {"counts": {"submitted": 100, "failed_total": 2}, "ttft_s": {"p95": 0.4}, "itl_s": {"p95": None}}
    res = evaluate(parse_slo("ttft_p95<=500ms,itl_p95<=50ms,error_rate<=1%"), summary)
    assert [r["met"] for r in res] == [True, False, False]


def test_gates_structured_truncation_latency():
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}
    spec = RequestSpec(endpoint="chat", json_schema=schema)
    good = RequestRecord(
        request_id=0,
        sent_ns=0,
        first_token_ns=100_000_000,
        end_ns=200_000_000,
        content=['{"a": ', "1}"],
        finish_reason="stop",
        output_tokens=2,
    )
    apply_gates(good, spec, parse_slo("ttft_p95<=500ms"))
    assert good.gate_failures == []
    wrong = RequestRecord(request_id=1, content=['{"a": "x"}'], finish_reason="length")
    apply_gates(wrong, spec, [])
    assert wrong.gate_failures == ["truncated", "json_schema_mismatch"]
    broken = RequestRecord(request_id=2, content=['{"a": 1'], finish_reason="stop")
    apply_gates(broken, spec, [])
    assert broken.gate_failures == ["json_invalid"]
    slow = RequestRecord(request_id=3, sent_ns=0, first_token_ns=900_000_000, end_ns=10**9, finish_reason="stop")
    apply_gates(slow, RequestSpec(endpoint="chat"), parse_slo("ttft_p95<=500ms"))
    assert slow.gate_failures == ["ttft>0.5s"]
    failed = RequestRecord(request_id=4, failure=FailureClass.TIMEOUT)
    apply_gates(failed, spec, [])
    assert failed.gate_failures == []


def test_gate_accepts_rfc8259_numbers_out_of_float_range():
    # produced by real llama-server + Gemma under a JSON-schema grammar: valid JSON, huge exponent
    schema = {"type": "object", "properties": {"confidence": {"type": "number"}}}
    r = RequestRecord(request_id=0, content=['{"confidence": 0.0156e4407400000000000 }'], finish_reason="stop")
    apply_gates(r, RequestSpec(endpoint="chat", json_schema=schema), [])
    assert r.gate_failures == []
