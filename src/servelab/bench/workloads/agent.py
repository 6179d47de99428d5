"""Agent loops: the ``tools`` workload continued through tool results.

A loop starts like a ``tools`` request (the four :data:`servelab.bench.workloads.tools.TOOLS`, a user request of
exact length in the target tokenizer). For each of its ``tool_steps`` (M) steps the request is sent with
``tool_choice: "required"``; the answer's tool calls go through the gate
(:func:`servelab.bench.workloads.tools.tool_call_failures`: offered name, JSON arguments valid against the tool's
schema). After a valid call the conversation gets the assistant message with its ``tool_calls`` and one
``role: tool`` message per call holding a synthetic result (:func:`tool_result`, ``tool_call_id`` set),
and the next step is sent. After the M-th result a final request with ``tool_choice: "auto"`` asks for
the answer. A failed request or a gate failure ends the loop at that step (an agent cannot go on from a
broken call). Message format: https://platform.openai.com/docs/guides/function-calling (assistant
``tool_calls``, then ``role: tool`` with ``tool_call_id``; read 2026-12-01).

Per step index (:class:`servelab.bench.workloads.extras.AgentStepStats`): requests, valid ones, tool calls, the
gate reasons of the invalid ones, median E2E; per run: loops completed (every step valid and the final
answer given).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np

from servelab.bench.load.driven import OnDone
from servelab.bench.load.step import LoadModel, Traceparent, arrival_offsets_s, request_headers, sleep_until_ns
from servelab.bench.workloads.extras import AgentStepStats, AgentSummary
from servelab.bench.workloads.tools import ASKS, TOOLS
from servelab.wire import ConfigError, RequestRecord, RequestSpec
from servelab.wire.client import send

if TYPE_CHECKING:
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = ["AgentWorkload", "summarize_agent", "tool_result"]

MAX_TOOL_STEPS = 64

_RESULTS: dict[str, dict[str, Any]] = {
    "get_weather": {"temperature": 14.5, "unit": "celsius", "conditions": "light rain", "humidity_percent": 81},
    "search_flights": {
        "flights": [
            {
                "flight": "CA933",
                "depart": "2027-03-14T13:40",
                "arrive": "2027-03-14T18:55",
                "price": {"amount": 642.0, "currency": "EUR"},
            }
        ]
    },
    "create_event": {"event_id": "evt_0042", "status": "created", "invited": 1},
    "convert_currency": {"amount": 1957.25, "currency": "CNY", "rate": 7.829},
}


def tool_result(name: str | None, step: int) -> str:
    """The synthetic result (a JSON text) fed back for a call of tool ``name`` at step ``step``: a fixed,
    plausible answer per tool of :data:`TOOLS` (``{"ok": true}`` for any other name), tagged with the step."""
    return json.dumps({**_RESULTS.get(name or "", {"ok": True}), "step": step})


class AgentWorkload:
    """Agent loops as a ``servelab bench`` workload (a :class:`servelab.bench.load.driven.DrivenWorkload`): each
    step of the sweep runs ``loops`` loops (see the module doc) of ``tool_steps`` tool rounds each,
    ``load.concurrency`` loops at once (closed loop) or starting at ``load.rate_rps`` loops/s (open loop).
    ``first_tokens`` is the length of the first user message (exact with ``counter``), ``max_tokens`` the
    output cap per request. Raises :class:`ConfigError` for counts out of range."""

    name = "agent"

    def __init__(
        self,
        loops: int,
        counter: TokenCounter | None,
        *,
        tool_steps: int = 2,
        first_tokens: int = 96,
        max_tokens: int = 192,
        seed: int = 0,
        extra: dict[str, Any] | None = None,
    ) -> None:
        from servelab.bench.workloads.text import TextMaker  # the built-in sets' exact-length text

        if not 1 <= tool_steps <= MAX_TOOL_STEPS:
            raise ConfigError(f"--set agent.tool_steps={tool_steps}: give 1 to {MAX_TOOL_STEPS} tool rounds per loop")
        if loops < 1 or first_tokens < 1 or max_tokens < 1:
            raise ConfigError("agent loops need loops, first_tokens and output_tokens >= 1")
        self.loops, self.tool_steps, self.max_tokens, self.seed = loops, tool_steps, max_tokens, seed
        self.extra = dict(extra or {})
        maker = TextMaker(counter, "en")
        self.first: list[tuple[str, int | None]] = []
        for i in range(loops):
            rng = random.Random(f"servelab:agent:{seed}:{i}")
            tail = f"\n\nUse the tools to handle this request step by step: {ASKS[i % len(ASKS)]}"
            text = maker.fit(rng, first_tokens, "Background notes (may be irrelevant):\n", tail)
            self.first.append((text, first_tokens if counter is not None else None))
        self.max_input_tokens: int | None = None
        self.total = loops * (tool_steps + 1)
        self.where: dict[int, tuple[int, int]] = {}  # request id -> (loop, step)
        self.records: dict[int, RequestRecord] = {}

    def spec(self, messages: list[dict[str, Any]], step: int, target: int | None) -> RequestSpec:
        """The request of step ``step`` (``tool_choice`` required before the last, auto for the final answer)."""
        choice = "required" if step < self.tool_steps else "auto"
        return RequestSpec(
            endpoint="chat",
            max_tokens=self.max_tokens,
            messages=[dict(m) for m in messages],
            extra={**self.extra, "tools": json.loads(json.dumps(TOOLS)), "tool_choice": choice},
            workload="agent",
            prompt_tokens_target=target if step == 0 else None,
        )

    async def _loop(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        model: str,
        i: int,
        ids: itertools.count,
        step_label: str,
        headers: Callable[[int], dict[str, str] | None],
        timeout_s: float,
        on_done: OnDone,
        records: list[RequestRecord],
        scheduled_ns: int | None,
    ) -> None:
        text, target = self.first[i]
        messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
        for k in range(self.tool_steps + 1):
            spec = self.spec(messages, k, target)
            rid = next(ids)
            rec = RequestRecord(
                request_id=rid,
                workload="agent",
                step=step_label,
                scheduled_ns=scheduled_ns if (k == 0 and scheduled_ns) else time.monotonic_ns(),
            )
            self.where[rid] = (i, k)
            records.append(rec)
            try:
                await send(http, base_url, model, spec, rec, timeout_s=timeout_s, headers=headers(rid))
            finally:
                on_done(rec, spec)  # the bench's gates run here: rec.gate_failures holds the tool-call check
            self.records[rid] = rec
            if not rec.ok or rec.gate_failures or k == self.tool_steps or not rec.tool_calls:
                return
            calls = [rec.tool_calls[j] for j in sorted(rec.tool_calls)]
            messages.append(
                {
                    "role": "assistant",
                    "content": rec.content_text or None,
                    "tool_calls": [
                        {
                            "id": c.id or f"call_{i}_{k}_{c.index}",
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for c in calls
                    ],
                }
            )
            for c in calls:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": c.id or f"call_{i}_{k}_{c.index}",
                        "content": tool_result(c.name, k),
                    }
                )

    async def drive(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        model: str,
        load: LoadModel,
        *,
        headers: dict[str, str] | None,
        first_id: int,
        step: str,
        timeout_s: float,
        on_done: OnDone,
        records: list[RequestRecord],
        dispatch_lags_ns: list[int] | None = None,
        traceparent: Traceparent | None = None,
    ) -> None:
        """Run the step's loops (see the class doc)."""
        ids = itertools.count(first_id)

        def hdrs(rid: int) -> dict[str, str] | None:
            return request_headers(headers, traceparent, rid)

        self.where, self.records = {}, {}
        if load.kind == "open":
            assert load.rate_rps is not None
            offs = arrival_offsets_s(self.loops, load.rate_rps, load.arrival, self.seed, load.gamma_shape)
            t0 = time.monotonic_ns() + 2_000_000
            tasks = []
            for i, off in enumerate(offs):
                sched = t0 + int(off * 1e9)
                await sleep_until_ns(sched)
                if dispatch_lags_ns is not None:
                    dispatch_lags_ns.append(time.monotonic_ns() - sched)
                tasks.append(
                    asyncio.ensure_future(
                        self._loop(http, base_url, model, i, ids, step, hdrs, timeout_s, on_done, records, sched)
                    )
                )
            await asyncio.gather(*tasks)
            return
        nxt = itertools.count()

        async def worker() -> None:
            while (i := next(nxt)) < self.loops:
                await self._loop(http, base_url, model, i, ids, step, hdrs, timeout_s, on_done, records, None)

        await asyncio.gather(*(worker() for _ in range(max(1, min(load.concurrency, self.loops)))))

    def step_extra(self, records: list[RequestRecord]) -> dict[str, Any]:
        """``{"agent": AgentSummary}`` of the step just driven (as a JSON-ready dict)."""
        return {"agent": summarize_agent(self, records).model_dump()}


def summarize_agent(wl: AgentWorkload, records: list[RequestRecord]) -> AgentSummary:
    """Per-step validity and latency, and loops completed, of one :meth:`AgentWorkload.drive`."""
    steps: list[AgentStepStats] = []
    done_loops: dict[int, bool] = {}
    for k in range(wl.tool_steps + 1):
        rs = [r for r in records if wl.where.get(r.request_id, (-1, -1))[1] == k]
        if not rs:
            continue
        invalid: dict[str, int] = {}
        valid = 0
        for r in rs:
            reasons = [r.failure.value] if r.failure is not None else list(r.gate_failures)
            if not reasons and k < wl.tool_steps and not r.tool_calls:
                reasons = ["tool_call_missing"]
            for x in reasons:
                invalid[x] = invalid.get(x, 0) + 1
            valid += not reasons
            if k == wl.tool_steps:
                done_loops[wl.where[r.request_id][0]] = not reasons
        e2e = [(r.end_ns - r.sent_ns) / 1e9 for r in rs if r.ok and r.end_ns is not None and r.sent_ns is not None]
        steps.append(
            AgentStepStats(
                step=k,
                n=len(rs),
                valid=valid,
                tool_calls=sum(1 for r in rs if r.tool_calls),
                invalid=invalid,
                e2e_p50_s=float(np.median(e2e)) if e2e else None,
            )
        )
    completed = sum(1 for v in done_loops.values() if v)
    return AgentSummary(
        loops=wl.loops,
        tool_steps=wl.tool_steps,
        loops_completed=completed,
        completion_rate=completed / wl.loops,
        steps=steps,
    )
