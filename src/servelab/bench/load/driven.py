"""Workloads that send their own requests, one step at a time: multi-turn sessions
(:class:`servelab.bench.workloads.sessions.SessionsWorkload`), agent loops
(:class:`servelab.bench.workloads.agent.AgentWorkload`), trace replay
(:class:`servelab.bench.workloads.traces.TraceWorkload`) and embeddings
(:class:`servelab.bench.workloads.embeddings.EmbeddingsWorkload`). Their requests depend on earlier answers (the
history, the tool call), follow a schedule of their own (a trace) or go to another endpoint
(``/v1/embeddings``), so they are not a list of request specs for :func:`servelab.bench.load.step.run_step`.

:class:`servelab.bench.load.runner.Bench` runs one through :class:`DrivenWorkload`: ``drive`` sends the step's
requests, every one ending through ``on_done`` (its ``requests.jsonl`` line, the gates), the step is
summarised like any other (:func:`servelab.bench.analysis.summarize.step_summary`) and ``step_extra(records)`` adds the
workload's own typed figures (:mod:`servelab.bench.workloads.extras`). They run in one process (not through
``--workers``/``--ray``) and without warmup requests. With ``--otlp-endpoint`` each request carries the
``traceparent`` of its client span, as the plain path's do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import aiohttp

from servelab.bench.load.step import LoadModel, Traceparent
from servelab.wire.types import RequestRecord, RequestSpec

__all__ = ["DrivenWorkload", "OnDone"]

#: called as each request ends, with its record and the spec it was sent from
OnDone = Callable[[RequestRecord, RequestSpec], None]


@runtime_checkable
class DrivenWorkload(Protocol):
    """What :meth:`servelab.bench.load.runner.Bench._run_driven` needs of a workload that sends its own requests.

    ``name``; ``total`` (requests the step will send, for the progress bar; ``None``: unknown);
    ``max_input_tokens`` (longest prompt, tokens; ``None``: unknown), checked against the server's context.
    A workload with its own schedule also has ``fixed_load`` (a :class:`LoadModel` used instead of the
    sweep's step)."""

    name: str
    total: int | None
    max_input_tokens: int | None

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
        """Send one step's requests under ``load`` to the OpenAI API root ``base_url``: record ids from
        ``first_id`` up, each record appended to ``records`` as it starts, ``on_done`` called as it ends.
        ``traceparent`` (``--otlp-endpoint``), when given: each request is sent with
        :func:`~servelab.bench.load.step.request_headers` of its id, as :func:`~servelab.bench.load.step.run_step`
        sends its own."""

    def step_extra(self, records: list[RequestRecord]) -> dict[str, Any]:
        """The workload's own figures for the step just driven, ``{field: JSON-ready dict}``."""
