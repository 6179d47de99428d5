"""The embeddings bench (``servelab bench --endpoint embeddings``; seed 000 §10.2: vector throughput with
the input length and the unit stated).

Each request is an OpenAI ``POST /v1/embeddings`` with ``batch_size`` inputs (``input``: a list of strings,
``encoding_format: float``; https://platform.openai.com/docs/api-reference/embeddings/create, read
2026-12-01). Inputs are the built-in English text (:class:`servelab.bench.workloads.text.TextMaker`) fitted to
exact lengths in the given tokenizer — the embedding model's own (all-MiniLM-L6-v2: its
``tokenizer.json``, :func:`servelab.engines.embedder.weights_dir`) — from the ``input_tokens`` distribution
(default uniform 16-256; the server adds its special tokens, [CLS]/[SEP] for BERT, in
``usage.prompt_tokens``). Steps are the bench's usual closed loop (``--concurrency``: requests in flight)
or open loop (``--rate``: requests/s).

Per step (:class:`servelab.bench.workloads.extras.EmbeddingsSummary`): inputs/s (vectors/s), server tokens/s
(``usage.prompt_tokens``), the batch size, the per-input length distribution, per-request latency
percentiles with their sample size, and the vector dimension. Each request is one ``requests.jsonl`` line
(``prompt_tokens`` = the server's count, ``prompt_tokens_target`` = the client's count of the batch,
``e2e_s`` = its latency).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
import orjson

from servelab.bench.load.driven import OnDone
from servelab.bench.load.step import LoadModel, Traceparent, arrival_offsets_s, request_headers, sleep_until_ns
from servelab.bench.options import MAX_PROMPT_TOKENS
from servelab.bench.workloads.extras import EmbeddingsSummary, LatencyPercentiles
from servelab.wire import ConfigError, RequestRecord, RequestSpec
from servelab.wire.types import FailureClass, WireError

if TYPE_CHECKING:
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = ["EmbeddingsWorkload", "embedding_inputs", "summarize_embeddings"]

#: the default input-length distribution, tokens of the embedding model's tokenizer (without its specials)
DEFAULT_INPUT_TOKENS = "16-256"
MAX_BATCH = 2048


def embedding_inputs(
    n: int, counter: TokenCounter | None, *, input_tokens: Any = DEFAULT_INPUT_TOKENS, seed: int = 0
) -> list[tuple[str, int | None]]:
    """``n`` inputs ``(text, tokens)``: lengths drawn from ``input_tokens`` (a length distribution as
    ``--set input_tokens=``: ``128``, ``16-256``, ``normal:128,32``), texts exact in ``counter``'s tokenizer
    (``tokens`` ``None`` and the length approximate without one). Deterministic for ``seed``. Raises
    :class:`ConfigError` for a bad distribution."""
    from servelab.bench.workloads.lengths import parse_length
    from servelab.bench.workloads.text import TextMaker  # the built-in sets' exact-length text

    dist = parse_length(input_tokens, "input_tokens", MAX_PROMPT_TOKENS)
    maker = TextMaker(counter, "en")
    out: list[tuple[str, int | None]] = []
    for i in range(n):
        rng = random.Random(f"servelab:embeddings:{seed}:{i}")
        k = dist(rng)
        out.append((maker.fit(rng, k), k if counter is not None else None))
    return out


class EmbeddingsWorkload:
    """The embeddings step driver (a :class:`servelab.bench.load.driven.DrivenWorkload`): ``requests`` requests of
    ``batch_size`` inputs each (``inputs``: ``(text, tokens)`` cycled), sent closed-loop at
    ``load.concurrency`` or open-loop at ``load.rate_rps`` requests/s. Raises :class:`ConfigError` for a
    batch size outside 1 to :data:`MAX_BATCH` or no inputs."""

    name = "embeddings"
    #: the request path under the API root, and the endpoint its records carry
    path = "/embeddings"
    endpoint = "embeddings"
    #: what the summary's ``unit`` calls the items of a request and their rate
    items = "input(s) per request"
    rate = "vectors/s"

    def __init__(
        self,
        inputs: list[tuple[str, int | None]],
        *,
        batch_size: int = 1,
        requests: int = 32,
        tokenizer: str | None = None,
        seed: int = 0,
    ) -> None:
        if not 1 <= batch_size <= MAX_BATCH:
            raise ConfigError(f"--batch-size {batch_size}: give 1 to {MAX_BATCH} inputs per request")
        if not inputs or requests < 1:
            raise ConfigError("an embeddings step needs inputs and at least one request")
        self.inputs, self.batch_size, self.n, self.tokenizer, self.seed = inputs, batch_size, requests, tokenizer, seed
        self.total = requests
        self.max_input_tokens = max((t or 0) for _, t in inputs) or None
        self._dims: int | None = None
        self._window_s: float | None = None

    def batch(self, i: int) -> list[tuple[str, int | None]]:
        """The inputs of request ``i`` (the input list cycled)."""
        return [self.inputs[(i * self.batch_size + j) % len(self.inputs)] for j in range(self.batch_size)]

    async def _one(
        self,
        http: aiohttp.ClientSession,
        url: str,
        model: str,
        i: int,
        rec: RequestRecord,
        headers: dict[str, str] | None,
        timeout_s: float,
    ) -> RequestSpec:
        items = self.batch(i)
        known = [t for _, t in items if t is not None]
        spec = RequestSpec(
            endpoint=self.endpoint,
            workload=self.name,
            extra=self.request_fields(i, [t for t, _ in items]),
            prompt_tokens_target=sum(known) if len(known) == len(items) else None,
        )
        rec.prompt_tokens_target = spec.prompt_tokens_target
        body = orjson.dumps({"model": model, **spec.extra})
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        for attempt in range(2):  # a keep-alive connection the server closed: nothing was answered, resend once
            rec.sent_ns = time.monotonic_ns()
            try:
                async with http.post(url, data=body, headers=hdrs, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                    rec.headers_ns = rec.first_byte_ns = time.monotonic_ns()
                    rec.status = r.status
                    raw = await r.read()
                rec.end_ns = time.monotonic_ns()
                self._read(rec, raw, len(items))
                break
            except aiohttp.ServerDisconnectedError as e:
                if attempt == 0:
                    rec.conn_retries += 1
                    continue
                self._fail(rec, FailureClass.CONNECT, str(e) or type(e).__name__)
            except (aiohttp.ClientConnectorError, aiohttp.ClientOSError) as e:
                self._fail(rec, FailureClass.CONNECT, str(e) or type(e).__name__)
                break
            except TimeoutError:
                self._fail(rec, FailureClass.TIMEOUT, f"no answer within {timeout_s:g} s")
                break
            except asyncio.CancelledError:
                self._fail(rec, FailureClass.CANCELLED, "run stopped")
                raise
        return spec

    def request_fields(self, i: int, texts: list[str]) -> dict[str, Any]:
        """The body fields (besides ``model``) of request ``i`` of ``texts`` (its batch's inputs)."""
        return {"input": texts, "encoding_format": "float"}

    def answer_error(self, doc: Any, n_inputs: int) -> str | None:
        """What is wrong with a decoded 200 answer ``doc`` to ``n_inputs`` inputs (None: nothing); records
        the vector dimension."""
        data = doc.get("data") if isinstance(doc, dict) else None
        if (
            not isinstance(data, list)
            or len(data) != n_inputs
            or not all(isinstance(d, dict) and isinstance(d.get("embedding"), list) for d in data)
        ):
            return f"expected {n_inputs} 'data' entries with an 'embedding' each"
        self._dims = len(data[0]["embedding"])
        return None

    @staticmethod
    def _fail(rec: RequestRecord, cls: FailureClass, message: str) -> None:
        rec.end_ns = rec.end_ns or time.monotonic_ns()
        rec.failure, rec.error = cls, WireError(status=rec.status, message=message)

    def _read(self, rec: RequestRecord, raw: bytes, n_inputs: int) -> None:
        if rec.status is None or rec.status >= 300:
            self._fail(rec, FailureClass.HTTP_STATUS, raw[:200].decode("utf-8", "replace"))
            return
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self._fail(rec, FailureClass.PROTOCOL, f"not JSON: {raw[:60]!r}")
            return
        wrong = self.answer_error(doc, n_inputs)
        if wrong is not None:
            self._fail(rec, FailureClass.PROTOCOL, wrong)
            return
        usage = doc.get("usage") or {}
        if isinstance(usage.get("prompt_tokens"), int):
            rec.prompt_tokens = usage["prompt_tokens"]
        rec.response_model = doc.get("model") if isinstance(doc.get("model"), str) else None
        rec.finish_reason = "stop"

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
        """Send the step's requests (see the class doc)."""
        url = base_url.rstrip("/") + self.path
        t0 = time.monotonic_ns() + 2_000_000

        async def one(i: int, scheduled_ns: int) -> None:
            rec = RequestRecord(request_id=first_id + i, workload=self.name, step=step, scheduled_ns=scheduled_ns)
            records.append(rec)
            spec = RequestSpec(endpoint=self.endpoint, workload=self.name)
            try:
                hdrs = request_headers(headers, traceparent, rec.request_id)
                spec = await self._one(http, url, model, i, rec, hdrs, timeout_s)
            finally:
                on_done(rec, spec)

        if load.kind == "open":
            assert load.rate_rps is not None
            offs = arrival_offsets_s(self.n, load.rate_rps, load.arrival, self.seed, load.gamma_shape)
            sem = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
            tasks = []

            async def capped(i: int, sched: int) -> None:
                if sem is None:
                    await one(i, sched)
                    return
                async with sem:
                    await one(i, sched)

            for i, off in enumerate(offs):
                sched = t0 + int(off * 1e9)
                await sleep_until_ns(sched)
                if dispatch_lags_ns is not None:
                    dispatch_lags_ns.append(time.monotonic_ns() - sched)
                tasks.append(asyncio.ensure_future(capped(i, sched)))
            await asyncio.gather(*tasks)
        else:
            it = itertools.count()

            async def worker() -> None:
                while (i := next(it)) < self.n:
                    await one(i, time.monotonic_ns())

            await asyncio.gather(*(worker() for _ in range(max(1, min(load.concurrency, self.n)))))
        ends = [r.end_ns for r in records if r.end_ns is not None]
        starts = [r.sent_ns for r in records if r.sent_ns is not None]
        self._window_s = (max(ends) - min(starts)) / 1e9 if ends and starts else None
        records.sort(key=lambda r: r.request_id)

    def step_extra(self, records: list[RequestRecord]) -> dict[str, Any]:
        """``{"embeddings": EmbeddingsSummary}`` of the step just driven (as a JSON-ready dict; the key is
        :attr:`name`)."""
        return {self.name: summarize_embeddings(self, records, self._window_s).model_dump()}


def summarize_embeddings(
    wl: EmbeddingsWorkload, records: list[RequestRecord], window_s: float | None
) -> EmbeddingsSummary:
    """The :class:`EmbeddingsSummary` of ``records`` (one per request of ``wl``) over ``window_s`` seconds
    (first send to last end)."""
    ok = [r for r in records if r.ok and r.sent_ns is not None and r.end_ns is not None]
    lat = np.asarray([(r.end_ns - r.sent_ns) / 1e9 for r in ok if r.end_ns is not None and r.sent_ns is not None])
    lengths = (
        [t for r in ok for _, t in wl.batch(r.request_id - records[0].request_id) if t is not None] if records else []
    )
    server_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    n_inputs = len(ok) * wl.batch_size
    pct = LatencyPercentiles(n=len(lat))
    if len(lat):
        pct = LatencyPercentiles(
            n=len(lat),
            p50_s=float(np.percentile(lat, 50)),
            p90_s=float(np.percentile(lat, 90)),
            p95_s=float(np.percentile(lat, 95)),
            p99_s=float(np.percentile(lat, 99)),
            max_s=float(lat.max()),
        )
    a = np.asarray(lengths, dtype=float)
    dist = (
        {
            "min": float(a.min()),
            "mean": float(a.mean()),
            "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)),
            "max": float(a.max()),
        }
        if len(a)
        else {}
    )
    per_s = (lambda x: x / window_s) if window_s else (lambda x: None)
    unit = (
        f"{wl.batch_size} {wl.items}; input length {dist.get('mean', float('nan')):.0f} tokens mean "
        f"({dist.get('min', float('nan')):.0f}-{dist.get('max', float('nan')):.0f}) in {wl.tokenizer or 'words'}"
        f"; {wl.rate} and server usage.prompt_tokens/s over the step window (first send to last end)"
    )
    return EmbeddingsSummary(
        batch_size=wl.batch_size,
        requests=len(ok),
        inputs=n_inputs,
        failed_requests=len(records) - len(ok),
        window_s=window_s,
        inputs_per_s=per_s(n_inputs),
        tokens_per_s=per_s(sum(server_tokens)) if server_tokens else None,
        input_tokens=dist,
        server_tokens_per_input=sum(server_tokens) / n_inputs if server_tokens and n_inputs else None,
        tokenizer=wl.tokenizer,
        latency=pct,
        dimensions=wl._dims,
        unit=unit,
    )
