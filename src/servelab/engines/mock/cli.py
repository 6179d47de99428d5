"""``servelab mock-engine`` (and ``python -m servelab.engines.mock``): the mock engine's command line, and
:func:`serve`, which runs a mock until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import typing
from typing import Any

import typer

from servelab.engines.mock.config import Dialect, MockConfig, validate_config
from servelab.engines.mock.server import start_mock
from servelab.wire.files import install_uvloop

__all__ = ["mock_engine_command", "serve"]


def serve(config: MockConfig, announce: bool = True) -> None:
    """Run the mock until SIGINT/SIGTERM (uvloop if importable); blocking. Prints
    ``mock-engine (<dialect>) listening on http://HOST:PORT/v1`` once bound when ``announce``.
    Raises :class:`ValueError` for a bad config and :class:`OSError` if the address cannot be bound."""
    validate_config(config)
    install_uvloop()

    async def main() -> None:
        server = await start_mock(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # non-Unix
                loop.add_signal_handler(sig, stop.set)
        if announce:
            print(f"mock-engine ({config.dialect}) listening on {server.base_url}", flush=True)
        try:
            await stop.wait()
        finally:
            await server.close()

    asyncio.run(main())


def mock_engine_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (IP or host name)."),
    port: int = typer.Option(0, "--port", help="TCP port to bind; 0 picks a free port."),
    ttft_ms: float = typer.Option(
        0.0, "--ttft-ms", help="Time to first token, in milliseconds after the request arrives."
    ),
    itl_ms: float = typer.Option(0.0, "--itl-ms", help="Time between token chunks, in milliseconds."),
    output_tokens: int = typer.Option(
        16, "--output-tokens", help="Answer tokens per request (count; capped by max_tokens)."
    ),
    tokens_per_chunk: int = typer.Option(1, "--tokens-per-chunk", help="Tokens per streamed chunk (count)."),
    dialect: str = typer.Option("vllm", "--dialect", help="Wire dialect: vllm, sglang, tgi, llamacpp or ollama."),
    reasoning_tokens: int = typer.Option(
        0, "--reasoning-tokens", help="Reasoning tokens streamed before the answer (count)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the failure-injection RNG (integer)."),
    fail_http_rate: float = typer.Option(
        0.0, "--fail-http-rate", help="Probability (0-1) of answering with --fail-http-status."
    ),
    fail_http_status: int = typer.Option(500, "--fail-http-status", help="HTTP status code of injected HTTP failures."),
    stream_error_rate: float = typer.Option(
        0.0, "--stream-error-rate", help="Probability (0-1) of an error event inside a 200 stream."
    ),
    cut_rate: float = typer.Option(0.0, "--cut-rate", help="Probability (0-1) of closing the connection mid-stream."),
    hang_rate: float = typer.Option(0.0, "--hang-rate", help="Probability (0-1) of stalling after the first chunk."),
    hang_s: float = typer.Option(30.0, "--hang-s", help="How long a hung request stalls, in seconds."),
    max_inflight: int = typer.Option(0, "--max-inflight", help="Running-request cap (count); 0 = no cap."),
    overload_status: int | None = typer.Option(
        None,
        "--overload-status",
        help="HTTP status beyond --max-inflight (default: 429 on tgi, 503 elsewhere, queueing on llamacpp).",
    ),
    model: str = typer.Option(
        "mock", "--model", help="Model name listed by /v1/models (any requested name is echoed)."
    ),
    invalid_json: bool = typer.Option(
        False,
        "--invalid-json",
        help="Answer response_format json_schema/json_object requests with JSON cut short (not parseable).",
    ),
    bad_tool_call: str = typer.Option(
        "none",
        "--bad-tool-call",
        help="Tool calls that a gate must catch: json (arguments cut short), schema (arguments missing the "
        "required fields), name (a function that was not offered); none = valid calls.",
    ),
    crash_after_requests: int | None = typer.Option(
        None,
        "--crash-after-requests",
        help="After this many completion requests (count), exit with status 3 in the middle of answering the next "
        "one; unset = never.",
    ),
    error_message: str | None = typer.Option(
        None,
        "--error-message",
        help="Text of injected HTTP errors and in-stream error events (e.g. a CUDA out-of-memory message); "
        "unset = a plain mock text.",
    ),
    context_tokens: int = typer.Option(
        0,
        "--context-tokens",
        help="Context window (prompt words + max_tokens, count): larger requests get the dialect's "
        "context-overflow error; 0 = unlimited.",
    ),
    prefill_tokens_per_s: float = typer.Option(
        0.0,
        "--prefill-tokens-per-s",
        help="Continuous-batching timing: the first token comes --ttft-ms + prompt words / this rate (tokens/s) "
        "after service starts; 0 = off.",
    ),
    itl_ms_per_running: float = typer.Option(
        0.0,
        "--itl-ms-per-running",
        help="Continuous-batching timing: each later chunk comes --itl-ms + this many ms per other answer "
        "decoding at once; 0 = off. Slots: --max-inflight with --dialect llamacpp.",
    ),
    prefix_cache_blocks: int = typer.Option(
        0,
        "--prefix-cache-blocks",
        help="Prefix cache of this many 16-word blocks (LRU): cached prompt words skip prefill and are "
        "reported as usage.prompt_tokens_details.cached_tokens and vllm:prefix_cache_hits_total; 0 = off.",
    ),
) -> None:
    """Run a mock OpenAI-compatible engine that streams deterministic tokens on a fixed schedule."""
    cfg = MockConfig(
        host=host,
        port=port,
        ttft_ms=ttft_ms,
        itl_ms=itl_ms,
        output_tokens=output_tokens,
        tokens_per_chunk=tokens_per_chunk,
        dialect=typing.cast(Dialect, dialect),  # MockConfig checks it
        reasoning_tokens=reasoning_tokens,
        seed=seed,
        fail_http_rate=fail_http_rate,
        fail_http_status=fail_http_status,
        stream_error_rate=stream_error_rate,
        cut_rate=cut_rate,
        hang_rate=hang_rate,
        hang_s=hang_s,
        max_inflight=max_inflight,
        overload_status=overload_status,
        model=model,
        invalid_json=invalid_json,
        bad_tool_call=typing.cast(Any, bad_tool_call),
        crash_after_requests=crash_after_requests,
        error_message=error_message,
        context_tokens=context_tokens,
        prefill_tokens_per_s=prefill_tokens_per_s,
        itl_ms_per_running=itl_ms_per_running,
        prefix_cache_blocks=prefix_cache_blocks,
    )
    try:
        validate_config(cfg)
        serve(cfg)
    except (ValueError, OSError) as e:
        print(f"servelab mock-engine: error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None
