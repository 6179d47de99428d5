"""Smoke checks beyond the basics (seed 000 §5: the tool protocol, reasoning, stream end and cancellation
checked per exact engine + model combination; seed 003 §11): ``tools``, ``reasoning`` and
``cancellation`` in ``goal.quality.smoke``. Not in the default list: a base model (the default Gemma 270M
GGUF) makes no tool calls, so ``tools`` would exclude every default candidate; ask for them by name.

- ``tools``: one streamed request offering the four tools of the ``tools`` workload
  (:data:`servelab.bench.workloads.tools.TOOLS`) with ``tool_choice: "required"``; passes when the answer holds a
  tool call that names an offered tool and whose arguments (joined from the stream's fragments)
  validate against that tool's JSON Schema (:func:`servelab.bench.workloads.tools.tool_call_failures`); up to 3
  tries (greedy, then sampled), like the ``json_schema`` check.
- ``reasoning``: one request asking for step-by-step work; fails when the answer's ``content`` carries
  a reasoning block inline (``<think>`` ... ``</think>``: the engine did not separate it into the
  delta's ``reasoning_content``/``reasoning`` field, so clients show the model's scratch work as its
  answer); passes with the reasoning separated, and passes saying so when the model gave no reasoning
  at all (a model without reasoning has nothing to separate: the check is then informational).
- ``cancellation``: one stream of 256 tokens is dropped after its first token; passes when the engine's
  running-requests gauge (its ``/metrics``, the ``running`` name of every registered engine kind)
  comes back to its value before the request within :data:`CANCEL_SETTLE_S`, and a request sent after
  it succeeds. With no running gauge on the server only the second part is checked, and the detail says
  so.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable

import aiohttp

from servelab.bench.workloads.tools import TOOLS, tool_call_failures
from servelab.engines import registry
from servelab.trial.results import SmokeCheck
from servelab.wire.client import send
from servelab.wire.types import RequestRecord, RequestSpec

__all__ = ["CANCEL_SETTLE_S", "MORE_CHECKS", "cancellation_check", "reasoning_check", "reasoning_leak", "tools_check"]

#: the checks of this module, in the order they run
MORE_CHECKS = ("tools", "reasoning", "cancellation")
#: how long the running gauge may take to come back after the client left, seconds
CANCEL_SETTLE_S = 10.0
_THINK = re.compile(r"<think>|</think>|<\|channel\|>analysis|<reasoning>", re.IGNORECASE)

One = Callable[[RequestSpec, int], Awaitable[RequestRecord]]


def _fail(r: RequestRecord) -> str:
    return f"{r.failure}" + (f": {str(r.error)[:80]}" if r.error is not None else "")


def reasoning_leak(content: str) -> str | None:
    """The reasoning marker found inline in an answer's ``content`` (``<think>``, ``</think>``,
    ``<reasoning>``, gpt-oss's ``<|channel|>analysis``), or ``None``."""
    m = _THINK.search(content)
    return m.group(0) if m else None


async def tools_check(one: One) -> SmokeCheck:
    """The ``tools`` check (module doc); ``one(spec, request_id)`` sends one gate request."""
    detail = ""
    for attempt in range(3):
        spec = RequestSpec(
            endpoint="chat",
            max_tokens=160,
            extra={
                "temperature": 0 if attempt == 0 else 0.7,
                "seed": attempt,
                "tools": TOOLS,
                "tool_choice": "required",
            },
            messages=[{"role": "user", "content": "What is the weather in Paris, France, in celsius? Use a tool."}],
        )
        r = await one(spec, 30 + attempt)
        if r.failure is not None:
            detail = _fail(r)
            continue
        bad = tool_call_failures(r, spec)
        if not bad:
            names = ", ".join(c.name or "?" for c in r.tool_calls.values())
            return SmokeCheck(ok=True, detail=f"valid tool call on try {attempt + 1}: {names}")
        detail = f"{', '.join(bad)} (answer: {r.content_text[:50]!r})"
    return SmokeCheck(ok=False, detail=detail)


async def reasoning_check(one: One) -> SmokeCheck:
    """The ``reasoning`` check (module doc)."""
    spec = RequestSpec(
        endpoint="chat",
        max_tokens=256,
        extra={"temperature": 0},
        messages=[{"role": "user", "content": "Think step by step: what is 17 * 23?"}],
    )
    r = await one(spec, 40)
    if r.failure is not None:
        return SmokeCheck(ok=False, detail=_fail(r))
    leak = reasoning_leak(r.content_text)
    if leak is not None:
        return SmokeCheck(
            ok=False,
            detail=f"reasoning inline in the answer ({leak!r} in content): not separated "
            "into reasoning_content/reasoning",
        )
    if r.reasoning_text:
        return SmokeCheck(
            ok=True,
            detail=f"reasoning separated: {len(r.reasoning_text)} characters in the "
            "reasoning field, none inline in content",
        )
    return SmokeCheck(ok=True, detail="informational: the model gave no reasoning (nothing to separate)")


async def _running(session: aiohttp.ClientSession, base_url: str, names: tuple[str, ...]) -> float | None:
    """The sum of the running-requests gauges the server exposes at ``{root}/metrics`` (``None``: none)."""
    from prometheus_client.parser import text_string_to_metric_families

    root = base_url.removesuffix("/v1")
    try:
        async with session.get(root + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
        found = [s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name in names]
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return float(sum(found)) if found else None


async def cancellation_check(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    one: One,
    headers: dict[str, str] | None,
    timeout_s: float,
) -> SmokeCheck:
    """The ``cancellation`` check (module doc)."""
    names = tuple({k.metrics.running for k in registry.kinds() if k.metrics.running})
    before = await _running(session, base_url, names)
    rec = RequestRecord(request_id=50, workload="smoke")
    first = asyncio.Event()

    def on_chunk(r: RequestRecord) -> None:
        if r.first_token_ns is not None:
            first.set()

    spec = RequestSpec(
        endpoint="chat",
        max_tokens=256,
        extra={"ignore_eos": True},
        messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
    )
    task = asyncio.create_task(
        send(session, base_url, model, spec, rec, timeout_s=timeout_s, headers=headers, on_chunk=on_chunk)
    )
    try:
        await asyncio.wait_for(first.wait(), timeout=timeout_s)
    except TimeoutError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return SmokeCheck(ok=False, detail=f"no first token within {timeout_s:g} s")
    during = await _running(session, base_url, names)
    task.cancel()
    t0 = time.monotonic()
    await asyncio.gather(task, return_exceptions=True)
    back_s: float | None = None
    if before is not None:
        while time.monotonic() - t0 < CANCEL_SETTLE_S:
            g = await _running(session, base_url, names)
            if g is not None and g <= before:
                back_s = time.monotonic() - t0
                break
            await asyncio.sleep(0.1)
    after = await one(
        RequestSpec(
            endpoint="chat",
            max_tokens=8,
            extra={"temperature": 0},
            messages=[{"role": "user", "content": "Say hello."}],
        ),
        51,
    )
    if after.failure is not None:
        return SmokeCheck(ok=False, detail=f"the request after the disconnect failed: {after.failure}")
    if before is None:
        return SmokeCheck(
            ok=True,
            detail="the server serves on after a client left mid-stream (no running-requests "
            "gauge on /metrics: whether it stopped decoding is not known)",
        )
    if back_s is None:
        return SmokeCheck(
            ok=False,
            detail=f"running requests {during:g} -> not back to {before:g} within "
            f"{CANCEL_SETTLE_S:g} s after the client left: the engine kept decoding",
        )
    return SmokeCheck(
        ok=True,
        detail=f"running requests {during if during is not None else '?'} -> back to "
        f"{before:g} {back_s:.2f} s after the client left",
    )


async def more_checks(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    checks: tuple[str, ...],
    one: One,
    headers: dict[str, str] | None,
    timeout_s: float,
) -> dict[str, SmokeCheck]:
    """The checks of :data:`MORE_CHECKS` that ``checks`` names, by name."""
    out: dict[str, SmokeCheck] = {}
    if "tools" in checks:
        out["tools"] = await tools_check(one)
    if "reasoning" in checks:
        out["reasoning"] = await reasoning_check(one)
    if "cancellation" in checks:
        out["cancellation"] = await cancellation_check(session, base_url, model, one, headers, timeout_s)
    return out
