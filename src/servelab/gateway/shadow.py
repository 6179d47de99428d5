"""Shadow traffic judged on answers and latency (seed 003 §15: compatibility -> canary -> replace).

A model's ``shadow`` (config ``models.<name>.shadow``) mirrors a ``sample_rate`` share of its requests
to another target. For every mirrored request the gateway records both answers side by side
(:class:`ShadowSample`): per side the HTTP status, TTFT, E2E and completion tokens, and the similarity of
the two answers' text. :class:`ShadowBook` keeps the last :data:`WINDOW` samples per model and summarises
them (:meth:`ShadowBook.report`, served as ``GET /admin/shadow`` and printed by ``servelab gateway
shadow-report``): TTFT/E2E percentiles of primary ("old") and shadow ("new"), their differences, the
mean completion-token difference, the text agreement rate, all with their sample sizes, so a canary can
be promoted or rolled back on evidence.

How each side is measured:

- Both clocks start when the gateway received the client's request (``t0_ns``); the shadow copy is sent
  at once, beside the primary's first attempt, with the same ``stream`` flag (streamed copies ask for
  ``stream_options.include_usage``), so both sides' TTFT and E2E cover the same span.
- Primary: TTFT is the gateway's own (first token-carrying chunk written to the client; a whole answer:
  the time it was read), E2E the access log's, tokens the engine's usage (else the token chunks
  forwarded). Its text is captured only for mirrored requests, from the bytes forwarded to the client,
  through the wire layer's SSE parser (:class:`servelab.wire.stream.StreamParser`).
- Shadow: the same parser over the shadow's answer; TTFT at its first token-carrying event, E2E at the
  end of its body, tokens from its usage (else its token-carrying events). Its answer is never sent to
  anyone and never charged.
- Text: :func:`text_similarity` of the answers' content (tool calls as ``name(arguments)``), compared
  only when both sides answered 200 completely. Latency and token figures are also only from such pairs;
  errors and timeouts are counted per side.
"""

from __future__ import annotations

import asyncio
import difflib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, Field

from servelab.gateway import pooled
from servelab.gateway.timeline import Timeline
from servelab.wire.stream import StreamParser, apply_event, finalize_tool_calls
from servelab.wire.types import RequestRecord

__all__ = [
    "AGREE_DEFAULT",
    "WINDOW",
    "Capture",
    "LatencySummary",
    "ModelShadowReport",
    "ShadowBook",
    "ShadowRun",
    "ShadowSample",
    "ShadowSide",
    "ShadowReport",
    "SideReport",
    "answer_text",
    "fetch_shadow",
    "sample_of",
    "text_similarity",
]

#: samples kept per public model (the oldest is dropped first)
WINDOW = 10_000
#: a pair "agrees" when its text similarity is at least this (``agree`` query parameter / ``--agree``)
AGREE_DEFAULT = 0.9
#: words compared per answer: :class:`difflib.SequenceMatcher` is quadratic in the worst case
MAX_WORDS = 4_000

_now = time.monotonic_ns


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ShadowSide(_Model):
    """One side of a mirrored request. Times in ms from when the gateway received the request."""

    backend: str | None = Field(description="backend that answered (None: none did)")
    upstream_model: str | None = Field(description="the model name the backend was sent")
    status: int = Field(description="HTTP status (0: no answer: connection failure or timeout)")
    complete: bool = Field(description="a 200 answer that ended normally (not cut off, no error event)")
    ttft_ms: float | None = Field(description="time to the first token-carrying chunk, ms")
    e2e_ms: float = Field(description="time to the end of the answer, ms")
    completion_tokens: int | None = Field(description="completion tokens (usage, else token chunks)")
    error: str | None = Field(None, description="error class when not complete (code or exception name)")


class ShadowSample(_Model):
    """Both answers of one mirrored request and how their text compares."""

    ts: float = Field(description="epoch seconds when the request arrived")
    request_id: str
    model: str = Field(description="the public model")
    endpoint: Literal["chat", "completions", "embeddings", "rerank"]
    stream: bool
    primary: ShadowSide
    shadow: ShadowSide
    text_similarity: float | None = Field(
        description="text_similarity() of the answers, 0-1; None unless both sides are complete (and for embeddings)"
    )
    text_exact: bool | None = Field(description="answers' text identical; None unless both are complete")


class LatencySummary(_Model):
    """Percentiles of one latency over ``n`` samples (ms; numpy's linear interpolation)."""

    n: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float


class SideReport(_Model):
    """One side over a model's samples: latency and tokens from the compared pairs only."""

    targets: list[str] = Field(description="backend/upstream_model seen on this side")
    complete: int = Field(description="samples where this side answered 200 completely")
    errors: int = Field(description="samples where it did not (status, cut off, timeout)")
    ttft_ms: LatencySummary | None
    e2e_ms: LatencySummary | None
    completion_tokens_mean: float | None


class ModelShadowReport(_Model):
    """Old (primary) vs new (shadow) for one public model. Deltas are shadow minus primary over the
    ``compared`` pairs (both sides complete): positive latency = the shadow is slower, positive tokens =
    the shadow writes more."""

    model: str
    samples: int = Field(description="mirrored requests recorded")
    compared: int = Field(description="pairs where both sides answered completely")
    primary: SideReport
    shadow: SideReport
    ttft_p50_delta_ms: float | None
    ttft_p99_delta_ms: float | None
    e2e_p50_delta_ms: float | None
    e2e_p99_delta_ms: float | None
    completion_tokens_delta_mean: float | None
    text_similarity_mean: float | None
    text_agreement_rate: float | None = Field(description="share of compared pairs with similarity >= agree_threshold")
    text_exact_rate: float | None


class ShadowReport(_Model):
    """Every model's old-vs-new summary (``GET /admin/shadow``)."""

    generated_ts: float
    window: int = Field(description="samples kept per model (the last ones)")
    agree_threshold: float
    models: list[ModelShadowReport]


def answer_text(rec: RequestRecord) -> str:
    """The answer's text as compared: content, then each tool call as ``name(arguments)``."""
    finalize_tool_calls(rec)
    calls = "".join(f" {tc.name}({tc.arguments})" for _, tc in sorted(rec.tool_calls.items()))
    return "".join(rec.content) + calls


def text_similarity(a: str, b: str) -> float:
    """Similarity of two answers in [0, 1]: :meth:`difflib.SequenceMatcher.ratio` over their
    whitespace-separated words (2 * matched words / total words; Python docs, difflib,
    https://docs.python.org/3/library/difflib.html#difflib.SequenceMatcher.ratio, read 2026-12-01),
    at most :data:`MAX_WORDS` words each. Two empty answers are identical (1.0). Example: `` tok0 ...
    tok7`` vs `` tok0 ... tok11`` = 2*8/20 = 0.8."""
    wa, wb = a.split()[:MAX_WORDS], b.split()[:MAX_WORDS]
    if not wa and not wb:
        return 1.0
    return difflib.SequenceMatcher(None, wa, wb, autojunk=False).ratio()


class Capture:
    """The primary's answer as forwarded to the client (mirrored requests only): SSE blocks through
    :class:`~servelab.wire.stream.StreamParser`, or one whole JSON body."""

    __slots__ = ("rec", "_parser")

    def __init__(self) -> None:
        self.rec = RequestRecord(request_id=0)
        self._parser = StreamParser(self.rec)

    def feed(self, block: bytes) -> None:
        """One block of complete SSE events as written to the client."""
        self._parser.feed(block, _now())

    def whole(self, raw: bytes) -> None:
        """A whole JSON answer as written to the client."""
        _apply_whole(self.rec, raw)

    def text(self) -> str:
        """What the client was sent, as :func:`answer_text`."""
        return answer_text(self.rec)


def _apply_whole(rec: RequestRecord, raw: bytes) -> None:
    try:
        ev = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    if isinstance(ev, dict):
        apply_event(rec, ev, _now())


@dataclass(slots=True)
class ShadowRun:
    """The pairing of one mirrored request: made when the shadow copy is planned, completed by the
    primary's end (:meth:`primary_done`) and by the shadow task, which records the pair."""

    t0_ns: int
    capture: Capture = field(default_factory=Capture)
    primary: asyncio.Future[tuple[ShadowSide, str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def primary_done(self, side: ShadowSide) -> None:
        """The primary ended (called once from the request's finish; later calls are ignored)."""
        if not self.primary.done():
            self.primary.set_result((side, self.capture.text() if side.complete else ""))


async def fetch_shadow(
    session: aiohttp.ClientSession,
    url: str,
    data: bytes,
    headers: dict[str, str],
    timeout: aiohttp.ClientTimeout,
    stream: bool,
    t0_ns: int,
    backend: str,
    upstream_model: str,
) -> tuple[ShadowSide, str]:
    """Send the shadow copy and measure its answer (times from ``t0_ns``). Returns (side, text); a
    connection failure or timeout is a side with status 0 and ``error`` set, never an exception (only
    :class:`asyncio.CancelledError` propagates)."""
    rec = RequestRecord(request_id=0)
    status = 0
    error: str | None = None
    try:
        # a timeline of its own: the stale-connection test reads it (the shadow's events are not logged)
        resp = await pooled.post(session, url, Timeline(), data=data, headers=headers, timeout=timeout)
        async with resp:
            status = resp.status
            if status >= 300:
                await resp.read()
                error = f"http_{status}"
            elif stream and "text/event-stream" in resp.headers.get("Content-Type", ""):
                parser = StreamParser(rec)
                async for chunk in resp.content.iter_any():
                    parser.feed(chunk, _now())
                parser.close(_now())
            else:
                _apply_whole(rec, await resp.read())  # a whole answer: its tokens arrive when it is read
                rec.end_ns = _now()
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        error = type(e).__name__
    end_ns = rec.end_ns or _now()
    if error is None and rec.failure is not None:
        error = str(rec.failure.value)
    complete = status == 200 and error is None
    usage = rec.usage if isinstance(rec.usage, dict) else {}
    ct = usage.get("completion_tokens")
    tokens = ct if isinstance(ct, int) and not isinstance(ct, bool) else (len(rec.chunk_ns) if complete else None)
    first = rec.first_token_ns
    side = ShadowSide(
        backend=backend,
        upstream_model=upstream_model,
        status=status,
        complete=complete,
        ttft_ms=(first - t0_ns) / 1e6 if first is not None else None,
        e2e_ms=(end_ns - t0_ns) / 1e6,
        completion_tokens=tokens,
        error=error,
    )
    return side, answer_text(rec) if complete else ""


def _latency(values: list[float]) -> LatencySummary | None:
    if not values:
        return None
    import numpy as np

    p50, p90, p99 = (float(x) for x in np.percentile(values, [50, 90, 99]))
    return LatencySummary(
        n=len(values),
        p50_ms=round(p50, 3),
        p90_ms=round(p90, 3),
        p99_ms=round(p99, 3),
        mean_ms=round(float(np.mean(values)), 3),
    )


def _delta(a: LatencySummary | None, b: LatencySummary | None, attr: str) -> float | None:
    if a is None or b is None:
        return None
    return round(getattr(b, attr) - getattr(a, attr), 3)


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _side_report(sides: list[ShadowSide], pairs: list[ShadowSide]) -> SideReport:
    targets = sorted({f"{s.backend}/{s.upstream_model}" for s in sides if s.backend is not None})
    complete = sum(1 for s in sides if s.complete)
    return SideReport(
        targets=targets,
        complete=complete,
        errors=len(sides) - complete,
        ttft_ms=_latency([s.ttft_ms for s in pairs if s.ttft_ms is not None]),
        e2e_ms=_latency([s.e2e_ms for s in pairs]),
        completion_tokens_mean=_mean([float(s.completion_tokens) for s in pairs if s.completion_tokens is not None]),
    )


class ShadowBook:
    """The last ``window`` :class:`ShadowSample` per public model, in memory (per replica: each replica
    reports the requests it mirrored)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._samples: dict[str, deque[ShadowSample]] = {}

    def add(self, sample: ShadowSample) -> None:
        """Keep ``sample`` (the model's oldest is dropped beyond the window)."""
        q = self._samples.get(sample.model)
        if q is None:
            q = self._samples[sample.model] = deque(maxlen=self.window)
        q.append(sample)

    def samples(self, model: str | None = None) -> list[ShadowSample]:
        """The samples kept, oldest first (one model's, or every model's)."""
        if model is not None:
            return list(self._samples.get(model, ()))
        return [s for q in self._samples.values() for s in q]

    def report(self, model: str | None = None, agree: float = AGREE_DEFAULT) -> ShadowReport:
        """Old vs new per model (only ``model`` when given). ``agree`` in [0, 1] is the similarity at
        which a pair counts as agreeing; raises ValueError outside it."""
        if not 0.0 <= agree <= 1.0:
            raise ValueError(
                f"agree {agree} is not in [0, 1]; give the text similarity that counts as the same answer, e.g. 0.9"
            )
        names = [model] if model is not None else sorted(self._samples)
        out = [self._model_report(n, list(self._samples.get(n, ())), agree) for n in names]
        return ShadowReport(
            generated_ts=time.time(), window=self.window, agree_threshold=agree, models=[m for m in out if m.samples]
        )

    @staticmethod
    def _model_report(name: str, samples: list[ShadowSample], agree: float) -> ModelShadowReport:
        pairs = [s for s in samples if s.primary.complete and s.shadow.complete]
        prim = _side_report([s.primary for s in samples], [s.primary for s in pairs])
        shad = _side_report([s.shadow for s in samples], [s.shadow for s in pairs])
        sims = [s.text_similarity for s in pairs if s.text_similarity is not None]
        tok = [
            float(s.shadow.completion_tokens - s.primary.completion_tokens)
            for s in pairs
            if s.shadow.completion_tokens is not None and s.primary.completion_tokens is not None
        ]
        return ModelShadowReport(
            model=name,
            samples=len(samples),
            compared=len(pairs),
            primary=prim,
            shadow=shad,
            ttft_p50_delta_ms=_delta(prim.ttft_ms, shad.ttft_ms, "p50_ms"),
            ttft_p99_delta_ms=_delta(prim.ttft_ms, shad.ttft_ms, "p99_ms"),
            e2e_p50_delta_ms=_delta(prim.e2e_ms, shad.e2e_ms, "p50_ms"),
            e2e_p99_delta_ms=_delta(prim.e2e_ms, shad.e2e_ms, "p99_ms"),
            completion_tokens_delta_mean=_mean(tok),
            text_similarity_mean=_mean(sims),
            text_agreement_rate=_mean([1.0 if x >= agree else 0.0 for x in sims]),
            text_exact_rate=_mean([1.0 if s.text_exact else 0.0 for s in pairs]),
        )


def sample_of(
    run_primary: ShadowSide,
    primary_text: str,
    shadow: ShadowSide,
    shadow_text: str,
    *,
    ts: float,
    request_id: str,
    model: str,
    endpoint: Any,
    stream: bool,
) -> ShadowSample:
    """The :class:`ShadowSample` of one pair (text compared when both sides are complete)."""
    both = run_primary.complete and shadow.complete and endpoint not in ("embeddings", "rerank")
    return ShadowSample(
        ts=ts,
        request_id=request_id,
        model=model,
        endpoint=endpoint,
        stream=stream,
        primary=run_primary,
        shadow=shadow,
        text_similarity=round(text_similarity(primary_text, shadow_text), 4) if both else None,
        text_exact=(primary_text == shadow_text) if both else None,
    )
