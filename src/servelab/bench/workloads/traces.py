"""Timestamped trace replay: production arrival times and lengths from the published trace formats.

Formats (each cited; none can be downloaded here, so tests write small files in each):

- ``mooncake`` — JSONL, one request per line: ``timestamp`` (ms since the trace's first request),
  ``input_length``, ``output_length`` (tokens), ``hash_ids`` (one id per block of
  :data:`MOONCAKE_BLOCK_TOKENS` prompt tokens; equal ids = equal blocks, so shared prefixes are the
  leading ids two requests have in common). https://github.com/kvcache-ai/Mooncake (FAST25-release/traces,
  read 2026-12-01); the same format is AIPerf's ``mooncake_trace`` replay.
- ``azure`` — CSV with the header ``TIMESTAMP,ContextTokens,GeneratedTokens``; ``TIMESTAMP`` is a wall
  time such as ``2023-11-16 18:15:46.6805900`` (up to 7 fractional digits). Azure LLM inference traces
  2023/2024, https://github.com/Azure/AzurePublicDataset (AzureLLMInferenceDataset2023.md, read 2026-12-01).
- ``burstgpt`` — CSV with the header ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``;
  ``Timestamp`` in seconds from the trace's start. https://github.com/HPMLL/BurstGPT (read 2026-12-01).
  Rows with 0 response tokens are failed requests in the original service and are skipped (counted).

:func:`read_trace` parses a file into a :class:`Trace` (offsets from the first kept request, after the
time window and speed factor); :func:`trace_requests` turns it into :class:`RequestSpec` of the exact
lengths in the target tokenizer (``ignore_eos`` with ``max_tokens`` = the trace's output length, so the
engine generates what the trace says); a Mooncake block is the same text wherever its id appears, so an
engine's prefix cache sees the trace's sharing. :func:`replay_offsets_ns` gives the send offsets that
:func:`servelab.bench.load.step.run_step` replays (``offsets_ns``).
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
import numpy as np
from pydantic import BaseModel, Field

from servelab.bench.load.step import LoadModel, Traceparent, run_step
from servelab.bench.workloads.extras import ReplayInfo
from servelab.wire import ConfigError, RequestRecord, RequestSpec

if TYPE_CHECKING:
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "Trace",
    "TraceEntry",
    "TraceWorkload",
    "parse_window",
    "read_trace",
    "replay_offsets_ns",
    "shared_prefix_tokens",
    "trace_requests",
]

TraceFormat = Literal["mooncake", "azure", "burstgpt"]
#: prompt tokens per Mooncake hash block (the released traces' block size)
MOONCAKE_BLOCK_TOKENS = 512
_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURST = ("Timestamp", "Request tokens", "Response tokens")


class TraceEntry(BaseModel):
    """One request of a trace: ``t_s`` (replay offset in seconds from the first kept request, after the
    speed factor), ``input_tokens``, ``output_tokens``, ``hash_ids`` (Mooncake), ``model`` (BurstGPT)."""

    t_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: list[int] | None = None
    model: str | None = None


class Trace(BaseModel):
    """A parsed trace: ``format``, ``path``, ``speed`` (replay speed factor: 2 = twice as fast),
    ``window_s`` (``(start, duration)`` in trace seconds, or ``None``), ``entries`` in send order,
    ``skipped`` (rows left out, by reason), ``duration_s`` (last offset)."""

    format: TraceFormat
    path: str
    speed: float = 1.0
    window_s: tuple[float, float | None] | None = None
    entries: list[TraceEntry] = Field(default_factory=list)
    skipped: dict[str, int] = Field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        """Offset of the last request, seconds (0 for fewer than two requests)."""
        return self.entries[-1].t_s if self.entries else 0.0

    @property
    def rate_rps(self) -> float:
        """Mean arrival rate of the replay, requests/s (``n / duration``; 0 when it has no duration)."""
        return len(self.entries) / self.duration_s if self.duration_s > 0 else 0.0


def _bad(path: Path, where: str, problem: str) -> ConfigError:
    return ConfigError(f"trace {path}{where}: {problem}")


def _int(path: Path, where: str, value: object, name: str) -> int:
    try:
        v = int(float(str(value).strip()))
    except ValueError:
        raise _bad(path, where, f"{name} {value!r} is not a number") from None
    if v < 0:
        raise _bad(path, where, f"{name} {v} is negative")
    return v


def _rows_mooncake(path: Path) -> list[tuple[float, int, int, list[int] | None, str | None]]:
    out: list[tuple[float, int, int, list[int] | None, str | None]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f" line {n}"
        try:
            obj = json.loads(line)
        except ValueError:
            raise _bad(path, where, "not JSON; a Mooncake trace has one JSON object per line") from None
        if not isinstance(obj, dict) or "timestamp" not in obj or "input_length" not in obj:
            raise _bad(path, where, "needs timestamp (ms) and input_length (tokens)")
        ids = obj.get("hash_ids")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
            raise _bad(path, where, "hash_ids must be a list of integers")
        out.append(
            (
                float(obj["timestamp"]) / 1000.0,
                _int(path, where, obj["input_length"], "input_length"),
                _int(path, where, obj.get("output_length", 1), "output_length"),
                ids,
                None,
            )
        )
    return out


def _azure_time(path: Path, where: str, text: str) -> float:
    t = text.strip()
    if "." in t:  # Python parses at most 6 fractional digits; the traces write 7
        head, frac = t.split(".", 1)
        t = f"{head}.{frac[:6]}"
    try:
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        raise _bad(path, where, f"TIMESTAMP {text!r} is not a date-time like 2023-11-16 18:15:46.6805900") from None


_Row = tuple[float, int, int, list[int] | None, str | None]


def _rows_csv(path: Path, fmt: TraceFormat, skipped: dict[str, int]) -> list[_Row]:
    out: list[_Row] = []
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        need = _AZURE if fmt == "azure" else _BURST
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise _bad(path, "", f"a {fmt} trace needs the columns {', '.join(need)}; missing {', '.join(missing)}")
        for n, row in enumerate(reader, 2):
            where = f" line {n}"
            if fmt == "azure":
                out.append(
                    (
                        _azure_time(path, where, row["TIMESTAMP"]),
                        _int(path, where, row["ContextTokens"], "ContextTokens"),
                        _int(path, where, row["GeneratedTokens"], "GeneratedTokens"),
                        None,
                        None,
                    )
                )
                continue
            resp = _int(path, where, row["Response tokens"], "Response tokens")
            if resp == 0:
                skipped["failed in the original service (0 response tokens)"] = (
                    skipped.get("failed in the original service (0 response tokens)", 0) + 1
                )
                continue
            try:
                t = float(row["Timestamp"])
            except ValueError:
                raise _bad(path, where, f"Timestamp {row['Timestamp']!r} is not seconds") from None
            out.append(
                (t, _int(path, where, row["Request tokens"], "Request tokens"), resp, None, (row.get("Model") or None))
            )
    return out


def _detect(path: Path) -> TraceFormat:
    head = path.open(encoding="utf-8").readline().strip()
    if head.startswith("{"):
        return "mooncake"
    if head.startswith("TIMESTAMP"):
        return "azure"
    if head.startswith("Timestamp"):
        return "burstgpt"
    raise ConfigError(
        f"trace {path}: cannot tell its format from the first line; give --trace-format mooncake|azure|burstgpt"
    )


def read_trace(
    path: str | Path,
    fmt: TraceFormat | Literal["auto"] = "auto",
    *,
    speed: float = 1.0,
    start_s: float = 0.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
) -> Trace:
    """Parse the trace at ``path`` (``fmt`` ``auto`` tells by the first line). ``speed`` > 0 divides every
    gap (2 = twice the rate); the window keeps requests whose trace time (seconds from the first row) is
    in ``[start_s, start_s + duration_s)``; ``max_requests`` keeps the first that many of it. Entries are
    sorted by time (stable: rows with the same time keep their order).

    Raises :class:`ConfigError` (one line naming the file, the line and the fix) for a missing file,
    an unknown format, a missing column, or a value that is not a count or a time.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"trace {p}: no such file")
    if not speed > 0:
        raise ConfigError(f"trace speed {speed:g}: give a factor > 0 (2 = twice as fast)")
    form: TraceFormat = _detect(p) if fmt == "auto" else fmt
    skipped: dict[str, int] = {}
    rows = _rows_mooncake(p) if form == "mooncake" else _rows_csv(p, form, skipped)
    if not rows:
        raise ConfigError(f"trace {p}: no requests in it")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    kept = [r for r in rows if start_s <= r[0] - t0 and (duration_s is None or r[0] - t0 < start_s + duration_s)]
    if len(kept) < len(rows):
        skipped["outside the time window"] = len(rows) - len(kept)
    if max_requests is not None and len(kept) > max_requests:
        skipped["beyond max_requests"] = len(kept) - max_requests
        kept = kept[:max_requests]
    if not kept:
        raise ConfigError(f"trace {p}: no request in the window start {start_s:g} s, duration {duration_s} s")
    first = kept[0][0]
    entries = [
        TraceEntry(t_s=(t - first) / speed, input_tokens=i, output_tokens=o, hash_ids=h, model=m)
        for t, i, o, h, m in kept
    ]
    return Trace(
        format=form,
        path=str(p),
        speed=speed,
        skipped=skipped,
        entries=entries,
        window_s=None if start_s == 0 and duration_s is None else (start_s, duration_s),
    )


def replay_offsets_ns(trace: Trace) -> list[int]:
    """The intended send offsets of ``trace``'s entries, ns from the step's start (for ``run_step``)."""
    return [round(e.t_s * 1e9) for e in trace.entries]


def _single_token_words(counter: TokenCounter | None) -> list[str]:
    from servelab.bench.workloads.text import EN_WORDS  # the built-in sets' vocabulary

    words = sorted(set(EN_WORDS))
    if counter is None:
        return words
    return [w for w, n in zip(words, map(len, counter.encode_batch([" " + w for w in words])), strict=True) if n == 1]


def trace_requests(
    trace: Trace, counter: TokenCounter | None, endpoint: str = "completions", block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> list[RequestSpec]:
    """One request per entry of ``trace``: a prompt of exactly ``input_tokens`` tokens in ``counter``'s
    tokenizer (words without one: approximate), ``max_tokens`` = ``output_tokens`` with ``ignore_eos``.

    Prompts are single-token words (``" w"``, so lengths add up when texts are joined). A Mooncake entry's
    prompt is its blocks in order — block ``h`` is the same ``block_tokens`` words wherever ``h`` appears —
    cut or padded to ``input_tokens``; other formats get a text of their own per request. ``endpoint``
    ``completions`` (the prompt as is, so block boundaries stay token boundaries) or ``chat``.
    """
    if endpoint not in ("chat", "completions"):
        raise ConfigError(f"bad endpoint {endpoint!r}: use chat or completions")
    vocab = _single_token_words(counter)
    blocks: dict[int, list[str]] = {}

    def block(h: int) -> list[str]:
        if h not in blocks:
            rng = random.Random(f"servelab:trace-block:{h}")
            blocks[h] = [rng.choice(vocab) for _ in range(block_tokens)]
        return blocks[h]

    out = []
    for i, e in enumerate(trace.entries):
        words: list[str] = []
        for h in e.hash_ids or []:
            if len(words) >= e.input_tokens:
                break
            words += block(h)
        rng = random.Random(f"servelab:trace-tail:{trace.path}:{i}")
        while len(words) < e.input_tokens:
            words.append(rng.choice(vocab))
        text = "".join(" " + w for w in words[: e.input_tokens])
        target = e.input_tokens if counter is not None else None
        extra: dict[str, Any] = {"ignore_eos": True}
        chat = endpoint == "chat"
        out.append(
            RequestSpec(
                endpoint=endpoint,
                max_tokens=max(1, e.output_tokens),
                messages=[{"role": "user", "content": text}] if chat else None,
                prompt=None if chat else text,
                extra=extra,
                workload=f"trace-{trace.format}",
                prompt_tokens_target=target,
                allow_truncation=True,
            )
        )
    return out


def parse_window(text: str | None) -> tuple[float, float | None]:
    """``--trace-window START:END`` in trace seconds (from the trace's first request) as ``(start_s,
    duration_s)``; ``END`` may be left out (``600:`` = from 600 s to the end), ``None`` gives the whole
    trace. Raises :class:`ConfigError` (one line) for anything else, or an ``END`` not after ``START``."""
    if text is None:
        return 0.0, None
    bad = ConfigError(
        f"--trace-window {text!r}: give START:END in trace seconds, e.g. --trace-window 0:600 "
        "(END may be left out: 600: is from 600 s to the end)"
    )
    head, sep, tail = text.partition(":")
    if not sep:
        raise bad
    try:
        start = float(head) if head.strip() else 0.0
        end = float(tail) if tail.strip() else None
    except ValueError:
        raise bad from None
    if not np.isfinite(start) or start < 0 or (end is not None and (not np.isfinite(end) or end <= start)):
        raise bad
    return start, None if end is None else end - start


def shared_prefix_tokens(trace: Trace, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> int | None:
    """Prompt tokens of a Mooncake trace that a prefix cache could serve: per request, the leading blocks
    whose whole prefix (ids up to and including that block) an earlier request already sent, capped at
    its ``input_tokens``. ``None`` for a trace without ``hash_ids``."""
    if not any(e.hash_ids for e in trace.entries):
        return None
    nodes: dict[tuple[int, int], int] = {}  # (parent node, block id) -> node: the prefixes seen so far
    total = 0
    for e in trace.entries:
        node, shared, still = 0, 0, True
        for j, h in enumerate(e.hash_ids or []):
            key = (node, h)
            if key in nodes and still:
                shared = min(e.input_tokens, (j + 1) * block_tokens)
            else:
                still = False
                if key not in nodes:
                    nodes[key] = len(nodes) + 1
            node = nodes[key]
        total += shared
    return total


class TraceWorkload:
    """Trace replay as a ``servelab bench`` workload (a :class:`servelab.bench.load.driven.DrivenWorkload`): one
    open-loop step (``fixed_load``, the trace's own mean rate) sending request ``i`` at the trace's offset
    ``i`` (:func:`replay_offsets_ns`) with :func:`servelab.bench.load.step.run_step`, which records each
    request's schedule lag and the loop's dispatch lag. ``step_extra``: :class:`ReplayInfo` under
    ``replay``. ``max_concurrency`` caps requests in flight (waits show as schedule lag)."""

    name = "trace"

    def __init__(
        self,
        trace: Trace,
        counter: TokenCounter | None,
        endpoint: str = "completions",
        max_concurrency: int | None = None,
    ) -> None:
        self.trace = trace
        self.specs = trace_requests(trace, counter, endpoint)
        self.offsets_ns = replay_offsets_ns(trace)
        self.total = len(self.specs)
        self.max_input_tokens = max(e.input_tokens for e in trace.entries)
        rate = trace.rate_rps or float(len(self.specs))
        self.fixed_load = LoadModel(kind="open", rate_rps=rate, arrival="trace", max_concurrency=max_concurrency)

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
        on_done: Callable[[RequestRecord, RequestSpec], None],
        records: list[RequestRecord],
        dispatch_lags_ns: list[int] | None = None,
        traceparent: Traceparent | None = None,
    ) -> None:
        """Replay the trace (see the class doc)."""
        await run_step(
            http,
            base_url,
            model,
            self.specs,
            load,
            step=step,
            first_id=first_id,
            timeout_s=timeout_s,
            headers=headers,
            on_done=on_done,
            records=records,
            offsets_ns=self.offsets_ns,
            dispatch_lags_ns=dispatch_lags_ns,
            traceparent=traceparent,
        )

    def step_extra(self, records: list[RequestRecord]) -> dict[str, Any]:
        """``{"replay": ReplayInfo}`` of the replay just run (as a JSON-ready dict)."""
        t = self.trace
        lags = [(r.sent_ns - r.scheduled_ns) / 1e9 for r in records if r.sent_ns is not None]
        cached = [r.cached_tokens for r in records if r.cached_tokens is not None]
        window = (
            None
            if t.window_s is None
            else [t.window_s[0], None if t.window_s[1] is None else t.window_s[0] + t.window_s[1]]
        )
        info = ReplayInfo(
            format=t.format,
            path=t.path,
            speed=t.speed,
            window_s=window,
            requests=len(records),
            skipped=t.skipped,
            duration_s=t.duration_s,
            rate_rps=t.rate_rps,
            schedule_lag_p99_s=float(np.percentile(lags, 99)) if lags else None,
            within_1ms=sum(1 for x in lags if x <= 1e-3) / len(lags) if lags else None,
            shared_prefix_tokens=shared_prefix_tokens(t),
            cached_tokens=sum(cached) if cached else None,
        )
        return {"replay": info.model_dump()}
