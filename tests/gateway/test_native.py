"""Native pass-through decisions in-process (servelab.gateway.apis.native): which backends get a Messages body
unchanged, and what of admission's decisions that body carries. The end-to-end proof against the real
llama-server is tests/gateway/test_apis_llama.py."""

from __future__ import annotations

import pytest

from servelab.gateway.apis.messages import CountTokensApi, MessagesApi
from servelab.gateway.apis.native import native_body, serves_natively
from servelab.gateway.apis.responses import ResponsesApi
from servelab.gateway.config import Backend


def _backend(kind: str, native: list[str] | None = None) -> Backend:
    return Backend(name="b", kind=kind, base_url="http://127.0.0.1:9", models=["m"], native_apis=native)


@pytest.mark.parametrize(("kind", "native", "api", "expected"), [
    ("llamacpp", None, "messages", True),
    ("vllm", None, "messages", True),
    ("sglang", None, "messages", False),
    ("mock", None, "messages", False),
    ("ollama", None, "messages", False),
    ("llamacpp", [], "messages", False),       # the operator's "always translate"
    ("openai", ["messages"], "messages", True),  # the operator's "this one serves it"
    ("vllm", None, None, False),               # an API that is always translated
])
def test_serves_natively_by_kind_and_override(kind: str, native: list[str] | None, api: str | None,
                                              expected: bool) -> None:
    assert serves_natively(_backend(kind, native), api) is expected


def test_only_messages_requests_are_passed_through() -> None:
    assert MessagesApi.native == "messages"
    assert CountTokensApi.native is None and ResponsesApi.native is None


def test_native_body_carries_admissions_decisions() -> None:
    source = {"model": "public", "max_tokens": 500, "messages": [{"role": "user", "content": "hi"}],
              "temperature": 1.7, "top_k": 5, "metadata": {"user_id": "u1"}, "stream": True,
              "stop_sequences": ["x"]}
    # the chat translation after policy: temperature clamped, top_k left, a stop list, top_p defaulted
    chat = {"temperature": 1.0, "top_k": 5, "top_p": 0.9, "stop": ["x", "END"]}
    up = native_body(source, chat, "engine-model", 128)
    assert up["model"] == "engine-model" and up["max_tokens"] == 128
    assert (up["temperature"], up["top_k"], up["top_p"]) == (1.0, 5, 0.9)
    assert up["stop_sequences"] == ["x", "END"]
    assert "metadata" not in up and up["stream"] is True and up["messages"] == source["messages"]
    assert source["max_tokens"] == 500  # the client's body is not changed
    assert native_body(source, {}, "e", 1000)["max_tokens"] == 500  # never above what the client asked
    bare = native_body(source, {}, "e", 0)  # no policy decision: the client's own sampling is not kept either
    assert "temperature" not in bare and "stop_sequences" not in bare
