"""The mock engine: a small, fast OpenAI-compatible streaming server for tests and calibration.

It speaks the wire dialect of one real engine (vLLM, SGLang, TGI, llama-server or Ollama, as the
dialect table :mod:`servelab.wire.dialects` and docs/engine-wire.md describe them), streams deterministic
tokens (`` tok0``, `` tok1`` ...) on an absolute time schedule (first token at ``recv + ttft_ms``, then
one chunk every ``itl_ms``), injects failures reproducibly (one ``random.Random(seed)`` draw per
completion request, in arrival order) and records, per request, the ``time.monotonic_ns()`` at which it
wrote every token-carrying chunk, so a client's measurements can be checked against what the server
really did (``GET /mock/records``).

Modules: :mod:`~servelab.engines.mock.config` (:class:`MockConfig`, its checks),
:mod:`~servelab.engines.mock.plan` (what a request gets), :mod:`~servelab.engines.mock.encoders` (the
dialects' wire shapes), :mod:`~servelab.engines.mock.server` (the HTTP server: routes, lifecycle, counters,
``/metrics``, ``/mock/*``), :mod:`~servelab.engines.mock.record` (what the mock did per request),
:mod:`~servelab.engines.mock.admission` (which chat/completions requests are served, and from when),
:mod:`~servelab.engines.mock.respond` (their answers written on schedule), :mod:`~servelab.engines.mock.apis`
(native ``/v1/messages`` and ``/v1/responses``), :mod:`~servelab.engines.mock.batch` (continuous-batching
timing), :mod:`~servelab.engines.mock.cache` (prefix cache), :mod:`~servelab.engines.mock.rerank`
(``/v1/rerank``), :mod:`~servelab.engines.mock.info` (identity endpoints), :mod:`~servelab.engines.mock.cli`
(``servelab mock-engine``) and :mod:`~servelab.engines.mock.launch` (the ``mock`` engine kind: the mock
as a child process). The package re-exports what callers use of config, encoders, record, server and cli.
"""

from __future__ import annotations

from servelab.engines.mock.cli import mock_engine_command, serve
from servelab.engines.mock.config import (
    DIALECTS,
    FAILURE_RATES,
    Dialect,
    MockConfig,
    check_failure_rates,
    validate_config,
)
from servelab.engines.mock.encoders import HOLD_HEADERS, REASONING_FIELD, context_overflow, error_body
from servelab.engines.mock.record import INJECTED_KINDS, SAMPLING_FIELDS, MockRecord
from servelab.engines.mock.server import MockServer, start_mock

__all__ = [
    "DIALECTS",
    "FAILURE_RATES",
    "HOLD_HEADERS",
    "INJECTED_KINDS",
    "REASONING_FIELD",
    "SAMPLING_FIELDS",
    "Dialect",
    "MockConfig",
    "MockRecord",
    "MockServer",
    "check_failure_rates",
    "context_overflow",
    "error_body",
    "mock_engine_command",
    "serve",
    "start_mock",
    "validate_config",
]
