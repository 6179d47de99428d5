"""One ``requests.jsonl`` line from a finished request and back, and the per-request work done as a
request ends (client token count, quality/SLO gates). Used by the single-process bench
(:mod:`servelab.bench.load.runner`) and by every load-generator worker (:mod:`servelab.bench.load.workers`),
so a line is made the same way wherever the request ran."""

from __future__ import annotations

import socket
from dataclasses import asdict
from typing import Any

from servelab.bench.analysis import metrics as M
from servelab.bench.analysis.slo import Objective, apply_gates
from servelab.bench.results import RequestLine
from servelab.wire.types import FailureClass, RequestRecord, RequestSpec, ToolCall, WireError

#: this machine's name, as ``requests.jsonl`` lines and worker reports name the host that sent a request
HOSTNAME = socket.gethostname()


def finish_record(rec: RequestRecord, spec: RequestSpec, counter: Any, objectives: list[Objective]) -> None:
    """What the bench does to a request as it ends, before its line is written: the client token count
    with ``counter`` (a :class:`servelab.modelfile.tokenizer.TokenCounter`, or ``None``) as a
    cross-check of the server's usage, or as the count when the server sent none; then, for a measured
    (non-warmup) request, the quality/SLO gates of :func:`servelab.bench.analysis.slo.apply_gates`."""
    if rec.failure is None:
        if counter is not None:
            rec.client_output_tokens = counter.count(rec.content_text + rec.reasoning_text)
            if rec.output_tokens_source == "chunks":  # no usage came: the tokenizer is the better fallback
                rec.output_tokens = rec.client_output_tokens
                rec.output_tokens_source = "tokenizer"
        if not rec.warmup:
            apply_gates(rec, spec, objectives)


def record_to_json(r: RequestRecord, **extra: Any) -> RequestLine:
    """One ``requests.jsonl`` line (:class:`~servelab.bench.results.RequestLine`; ``extra`` sets
    ``step_index``/``step_workload``/``sample_passed``, and with several load-generator workers ``worker``/``host``/
    ``t0_ns``, :mod:`servelab.bench.load.workers`). Times: derived metrics in seconds plus raw
    monotonic-ns stamps; ``chunk_offsets_ms`` are token-chunk arrival times relative to ``sent``.
    Write it with :meth:`RequestLine.to_json_bytes` (optional fields only when present)."""
    sent = r.sent_ns or 0
    d: dict[str, Any] = {
        "id": r.request_id,
        "step": r.step,
        "workload": r.workload,
        "warmup": r.warmup,
        "status": r.status,
        "failure": r.failure.value if r.failure else None,
        "error": asdict(r.error) if r.error else None,
        "finish_reason": r.finish_reason,
        "finish_reason_raw": r.finish_reason_raw,
        "prompt_tokens": r.prompt_tokens,
        "prompt_tokens_target": r.prompt_tokens_target,
        "output_tokens": r.output_tokens,
        "output_tokens_source": r.output_tokens_source,
        "client_output_tokens": r.client_output_tokens,
        "cached_tokens": r.cached_tokens,
        "max_tokens": r.max_tokens,
        "ttft_s": M.ttft_s(r),
        "ttfat_s": M.ttfat_s(r),
        "e2e_s": M.e2e_s(r),
        "tpot_s": M.tpot_s(r),
        "schedule_lag_s": M.schedule_lag_s(r),
        "gate_failures": r.gate_failures,
        "events": r.events,
        "saw_done": r.saw_done,
        "response_model": r.response_model,
        "conn_retries": r.conn_retries,
        "t_ns": {k: getattr(r, f"{k}_ns") for k in _T_NS},
        "chunk_offsets_ms": [(t - sent) // 1000 / 1000 for t in r.chunk_ns],  # µs resolution
        "text": r.content_text,
    }
    if any(r.chunk_tokens):
        d["chunk_tokens"] = r.chunk_tokens
    if r.reasoning:
        d["reasoning"] = r.reasoning_text
    if r.tool_calls:
        d["tool_calls"] = [asdict(t) for t in r.tool_calls.values()]
    d.update(extra)
    return RequestLine.model_validate(d)


_T_NS = (
    "scheduled",
    "sent",
    "headers",
    "first_byte",
    "first_event",
    "first_token",
    "first_answer",
    "last_token",
    "done",
    "end",
)


def record_from_json(line: RequestLine | dict[str, Any]) -> RequestRecord:
    """The :class:`RequestRecord` a ``requests.jsonl`` line (:func:`record_to_json`) was written from,
    as far as the line holds it: every stamp, count and class the summary uses; chunk arrival times
    at the microsecond resolution they were written with. A parsed dict is validated first (raises
    :class:`pydantic.ValidationError`, a ``ValueError``, on a line that is not such a record)."""
    d = line if isinstance(line, RequestLine) else RequestLine.model_validate(line)
    r = RequestRecord(request_id=d.id, workload=d.workload, step=d.step, warmup=d.warmup)
    for k in (
        "status",
        "finish_reason",
        "finish_reason_raw",
        "prompt_tokens",
        "prompt_tokens_target",
        "output_tokens",
        "output_tokens_source",
        "client_output_tokens",
        "cached_tokens",
        "max_tokens",
        "saw_done",
        "response_model",
        "events",
        "conn_retries",
    ):
        setattr(r, k, getattr(d, k))
    r.failure = FailureClass(d.failure) if d.failure is not None else None
    r.error = WireError(**d.error.model_dump()) if d.error else None
    r.gate_failures = list(d.gate_failures)
    for k in _T_NS:
        setattr(r, f"{k}_ns", getattr(d.t_ns, k))
    r.scheduled_ns = r.scheduled_ns or 0
    sent = r.sent_ns or 0
    r.chunk_ns = [sent + round(float(ms) * 1000) * 1000 for ms in d.chunk_offsets_ms]
    r.chunk_tokens = list(d.chunk_tokens or [0] * len(r.chunk_ns))
    r.content = [d.text] if d.text else []
    r.reasoning = [d.reasoning] if d.reasoning else []
    r.tool_calls = {t.index: ToolCall(**t.model_dump()) for t in d.tool_calls or []}
    return r
