"""servelab.gateway.lengths: every dialect's length fields are read, the largest bounds the request, and
exactly one bound (<= the reserved cap) is forwarded in the field each engine reads (issue 9 defect 1)."""

from __future__ import annotations

import pytest

from servelab.gateway import lengths as L
from servelab.gateway.errors import GatewayError

ALL_BOUNDS = {
    "max_tokens": 8,
    "max_completion_tokens": 9,
    "n_predict": 30,
    "max_new_tokens": 7,
    "parameters": {"max_new_tokens": 11, "temperature": 0},
    "sampling_params": {"max_new_tokens": 12},
    "options": {"num_predict": 13, "top_k": 5},
}


def _bounds(body: dict) -> dict[str, int]:
    """Every length field present in a body (dotted name -> value)."""
    out = {}
    for where, name in L.BOUND_FIELDS + L.MIN_FIELDS:
        for c in L._containers(body, where):
            if name in c:
                out[L._name(where, name)] = c[name]
    return out


def test_the_largest_field_of_any_dialect_is_the_bound() -> None:
    r = L.read_lengths(ALL_BOUNDS, 64)
    assert (r.max_tokens, r.field, r.unbounded) == (30, "n_predict", False)
    assert set(r.engine_fields) == {
        "n_predict",
        "max_new_tokens",
        "parameters.max_new_tokens",
        "sampling_params.max_new_tokens",
        "options.num_predict",
    }
    # the two attacks
    assert L.read_lengths({"max_tokens": 1, "max_completion_tokens": 3000}, 4096).max_tokens == 3000
    with pytest.raises(GatewayError) as ei:
        L.read_lengths({"max_tokens": 8, "n_predict": 300, "ignore_eos": True}, 64)
    assert ei.value.status == 400 and ei.value.param == "n_predict" and ei.value.code == "max_tokens_too_large"
    assert L.read_lengths({"sampling_params": [{"max_new_tokens": 5}, {"max_new_tokens": 40}]}, 64).max_tokens == 40


@pytest.mark.parametrize(
    "body, param",
    [
        ({"n_predict": "300"}, "n_predict"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 1.5}, "max_completion_tokens"),
        ({"options": {"num_predict": -3}}, "options.num_predict"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"max_tokens": 5, "min_tokens": 6}, "min_tokens"),
        ({"parameters": {"max_new_tokens": 65}}, "parameters.max_new_tokens"),
    ],
)
def test_bad_values_are_400_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(GatewayError) as ei:
        L.read_lengths(body, 64)
    assert ei.value.status == 400 and ei.value.param == param


def test_no_limit_values_and_refuse_policy() -> None:
    r = L.read_lengths({"n_predict": -1, "max_tokens": 5}, 64)
    assert r.unbounded and r.max_tokens == 5
    assert L.read_lengths({"options": {"num_predict": -2}}, 64).unbounded
    for body in ({"n_predict": 5}, {"options": {"num_predict": 5}}, {"sampling_params": {"min_new_tokens": 1}}):
        with pytest.raises(GatewayError) as ei:
            L.read_lengths(body, 64, "refuse")
        assert ei.value.code == "unsupported_parameter"
    assert L.read_lengths({"max_tokens": 5, "max_completion_tokens": 6, "min_tokens": 2}, 64, "refuse").max_tokens == 6


@pytest.mark.parametrize(
    "kind, endpoint, field",
    [
        ("openai", "chat", "max_completion_tokens"),
        ("openai", "completions", "max_tokens"),
        ("vllm", "chat", "max_completion_tokens"),
        ("vllm", "completions", "max_tokens"),
        ("sglang", "chat", "max_completion_tokens"),
        ("tgi", "chat", "max_tokens"),
        ("llamacpp", "chat", "max_tokens"),
        ("llamacpp", "completions", "max_tokens"),
        ("ollama", "chat", "max_tokens"),
        ("mock", "chat", "max_tokens"),
    ],
)
def test_exactly_one_bound_is_forwarded_in_the_dialects_field(kind: str, endpoint: str, field: str) -> None:
    body = L.canonicalise(dict(ALL_BOUNDS, min_tokens=3), 30, 3)
    assert _bounds(body) == {"max_tokens": 30, "min_tokens": 3}
    assert body["options"] == {"top_k": 5} and body["parameters"] == {"temperature": 0}  # other options kept
    out = L.for_backend(kind, endpoint, body, 30)
    got = _bounds(out)
    assert {k: v for k, v in got.items() if k != "min_tokens"} == {field: 30}
    assert got.get("min_tokens") in (None, 3)
    assert ("min_tokens" in got) == (kind in ("vllm", "sglang", "mock"))
    # a fallback override can only lower it; an operator param above the reserved cap is clamped
    assert _bounds(L.for_backend(kind, endpoint, {**body, "max_tokens": 9}, 30))[field] == 9
    assert _bounds(L.for_backend(kind, endpoint, {**body, "max_tokens": 900, "n_predict": 900}, 30)).get(field) == 30
    assert L.for_backend(kind, "embeddings", {"input": "x"}, 30) == {"input": "x"}


def test_min_tokens_is_clamped_to_a_lowered_bound() -> None:
    out = L.for_backend("vllm", "chat", {"max_tokens": 4, "min_tokens": 10}, 30)
    assert out["max_completion_tokens"] == 4 and out["min_tokens"] == 4


def test_every_backend_kind_has_a_dialect_and_unknown_kinds_get_max_tokens() -> None:
    from servelab.gateway.config import BACKEND_KINDS

    assert set(BACKEND_KINDS) <= set(L.DIALECT_OF_KIND)
    assert _bounds(L.for_backend("some-new-kind", "chat", {"n_predict": 99, "min_tokens": 2}, 30)) == {"max_tokens": 30}
