"""Issue 14 item 1: sampling defaults and bounds per model and task, through a real ``servelab gateway``;
what reached the engine is read from the mock engine's records (``sampling``), what changed from the
access log's ``policy`` field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from conftest import gateway_key
from gateway.test_degrade import _rec, _records
from gateway.test_server import post

pytestmark = pytest.mark.timeout(120)


def test_sampling_defaults_and_bounds_per_model_and_task(gateway: Any, mock_engine: Any) -> None:
    eng = mock_engine("--dialect", "vllm", "--output-tokens", "50")
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "backends": [{"name": "b", "kind": "vllm", "base_url": eng.root, "models": ["up"]}],
            "models": {
                # structured extraction: conservative, out-of-range values refused
                "extract": {
                    "targets": [{"backend": "b"}],
                    "sampling": {
                        "on_violation": "refuse",
                        "temperature": {"default": 0, "max": 0.3},
                        "top_p": {"default": 1, "max": 1},
                        "max_tokens": {"default": 20, "max": 40},
                        "stop": {"max_items": 2},
                    },
                },
                # creative writing: open, clamped
                "write": {
                    "targets": [{"backend": "b"}],
                    "sampling": {
                        "temperature": {"default": 0.9, "min": 0.2, "max": 1.5},
                        "stop": {"default": ["THE END"]},
                    },
                },
            },
            "routing": {"task_sampling": {"poem": {"temperature": {"default": 1.2, "max": 2.0}, "top_k": {"max": 50}}}},
            "tenants": {"t": {}},
            "keys": [entry],
            "health": {"enabled": False},
        }
    )
    url = gw.url + "/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]

    def ask(body: dict[str, Any], **headers: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
        st, h, raw = post(url, {"messages": msgs, **body}, key, headers=headers)
        return st, orjson.loads(raw), _rec(gw, h["X-Request-ID"])

    # absent -> defaults sent, shown in the access log
    st, _, rec = ask({"model": "extract"})
    assert st == 200
    sent = _records(eng)[-1]["sampling"]
    out = sent.get("max_tokens", sent.get("max_completion_tokens"))
    assert sent["temperature"] == 0 and sent["top_p"] == 1 and out == 20, sent
    assert rec["policy"] == {"defaults": {"temperature": 0, "top_p": 1, "max_tokens": 20}, "clamped": {}}
    assert rec["completion_tokens"] == 20
    # outside with on_violation refuse -> 400 naming the parameter and the range
    for body, param in (
        ({"temperature": 0.7}, "temperature"),
        ({"max_tokens": 100}, "max_tokens"),
        ({"stop": ["a", "b", "c"]}, "stop"),
        ({"n_predict": 100}, "max_tokens"),
    ):
        n = len(_records(eng))
        st, err, rec = ask({"model": "extract", **body})
        assert st == 400 and err["error"]["code"] == "parameter_out_of_range" and err["error"]["param"] == param, err
        assert len(_records(eng)) == n and rec["error_code"] == "parameter_out_of_range"
    assert "[-inf, 0.3]" in ask({"model": "extract", "temperature": 0.7})[1]["error"]["message"]
    # inside: kept as sent
    st, _, rec = ask({"model": "extract", "temperature": 0.1, "max_tokens": 30})
    assert st == 200 and _records(eng)[-1]["sampling"]["temperature"] == 0.1 and rec["completion_tokens"] == 30
    # clamp (the default mode): 1.9 -> 1.5, 0.0 -> 0.2; stop default added
    st, _, rec = ask({"model": "write", "temperature": 1.9})
    sent = _records(eng)[-1]["sampling"]
    assert st == 200 and sent["temperature"] == 1.5 and sent["stop"] == ["THE END"], sent
    assert rec["policy"] == {"defaults": {"stop": ["THE END"]}, "clamped": {"temperature": [1.9, 1.5]}}
    ask({"model": "write", "temperature": 0.0})
    assert _records(eng)[-1]["sampling"]["temperature"] == 0.2
    # a task narrows the model, never widens it: default 1.2 from the task; max stays the model's 1.5
    ask({"model": "write", "top_k": 200}, **{"X-Servelab-Task": "poem"})
    sent = _records(eng)[-1]["sampling"]
    assert sent["temperature"] == 1.2 and sent["top_k"] == 50, sent
    ask({"model": "write", "temperature": 1.9}, **{"X-Servelab-Task": "poem"})
    assert _records(eng)[-1]["sampling"]["temperature"] == 1.5
    # a model without a policy: the request goes as sent, no policy field
    st, _, rec = ask({"model": "write", "temperature": 1.0, "stop": ["x"]})
    assert "policy" not in rec
