"""Reliability of a candidate during its load steps (seed 003 §19): timeouts, streams
cut off mid-answer, engine crashes and OOMs, restarts — per step — and ``restart: once``.

- :func:`step_counters`: per load step, from the bench's failure classes
  (:class:`servelab.wire.types.FailureClass`): ``timeouts``, ``stream_interruptions`` (``cut_off``:
  the body ended without ``[DONE]`` or a finish reason, plus ``stream_error``: an error object inside a
  2xx stream), ``connect_errors`` (no HTTP answer: the engine was down), and the crashes/restarts the
  :class:`EngineWatch` saw while the step ran.
- :func:`classify_exit`: why an engine process ended — its exit status (a negative status is the
  signal; SIGKILL with an OOM line in the kernel's words is the OOM killer) and its log's last lines
  matched against each engine's own out-of-memory messages (:data:`OOM_PATTERNS`).
- :class:`EngineWatch`: a thread that notices the engine process exit within ``poll_s`` while the load
  steps run, classifies it and, with ``restart: once``, starts it again once on the same port (the load
  generator keeps its URL; requests meanwhile fail as ``connect``) and records the recovery time: from
  the exit being seen to the restarted engine's first streamed token.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import Field

from servelab.bench.results import ResultModel, StepSummary
from servelab.engines.exits import tail_lines

__all__ = [
    "OOM_PATTERNS",
    "Crash",
    "EngineWatch",
    "Reliability",
    "StepReliability",
    "classify_exit",
    "current_engine",
    "end_watch",
    "step_counters",
    "watch_engine",
]

#: out-of-memory messages per engine (case-insensitive): PyTorch's CUDA allocator (vLLM, SGLang,
#: TensorRT-LLM's PyTorch backend, LMDeploy's PyTorch engine: ``torch.OutOfMemoryError: CUDA out of
#: memory``), C++ allocation failure (llama.cpp, TurboMind: ``std::bad_alloc``, ggml's ``failed to
#: allocate``), TGI's router report (``OutOfMemory``), Ollama's runner (``out of memory``), and the
#: kernel's OOM killer as a process sees it (``Killed``).
OOM_PATTERNS: dict[str, tuple[str, ...]] = {
    "any": (
        r"out of memory",
        r"OutOfMemoryError",
        r"std::bad_alloc",
        r"cannot allocate memory",
        r"failed to allocate",
        r"\bOOM\b",
        r"CUDA error: out of memory",
    ),
    "llamacpp": (r"ggml_backend_.*failed to allocate", r"failed to allocate .* buffer"),
    "vllm": (r"torch\.OutOfMemoryError", r"No available memory for the cache blocks"),
    "tgi": (r"OutOfMemory", r"Not enough memory to handle"),
}
_OOM = {k: re.compile("|".join(v), re.IGNORECASE) for k, v in OOM_PATTERNS.items()}


class Crash(ResultModel):
    """One engine exit during the load steps: ``at_s`` (seconds since the candidate's launch), the step
    it happened in (``workload/step``; ``None`` between steps), ``returncode`` (negative: the signal),
    ``signal`` name, ``oom`` (an out-of-memory line in the log, or SIGKILL with one), the matching
    ``log_line``, ``restarted``, ``recovered`` and ``recovery_s`` (exit seen -> first token again)."""

    at_s: float
    at_unix_s: float | None = None
    step: str | None = None
    returncode: int | None = None
    signal: str | None = None
    oom: bool = False
    log_line: str | None = None
    restarted: bool = False
    recovered: bool = False
    recovery_s: float | None = None
    restart_error: str | None = None


class StepReliability(ResultModel):
    """Reliability counters of one load step (requests are the measured ones of the step)."""

    timeouts: int = 0
    stream_interruptions: int = 0
    connect_errors: int = 0
    http_errors: int = 0
    crashes: int = 0
    ooms: int = 0
    restarts: int = 0


class Reliability(ResultModel):
    """``results.candidates.<name>.reliability``: ``restart`` policy, per-step counters by
    ``workload/step``, the crashes in order and their totals."""

    restart: str = "never"
    steps: dict[str, StepReliability] = Field(default_factory=dict)
    crashes: list[Crash] = Field(default_factory=list)
    crash_count: int = 0
    oom_count: int = 0
    restart_count: int = 0


def classify_exit(
    returncode: int | None, log_path: Any, kind: str | None = None
) -> tuple[bool, str | None, str | None]:
    """(``oom``, signal name, the log line that says so) for an engine that exited with ``returncode``,
    from the last 60 lines of its log (``log_path``) and :data:`OOM_PATTERNS` (``any`` + ``kind``'s)."""
    sig = None
    if returncode is not None and returncode < 0:
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"signal {-returncode}"
    pats = [_OOM["any"]] + ([_OOM[kind]] if kind in _OOM else [])
    for line in reversed(tail_lines(log_path, 60) if log_path else []):
        if any(p.search(line) for p in pats):
            return True, sig, line.strip()[:300]
    return False, sig, None


def step_counters(step: StepSummary) -> StepReliability:
    """The request-side counters of ``step`` (from ``counts.failed``; the watch adds crashes)."""
    f = step.counts.failed
    return StepReliability(
        timeouts=f.get("timeout", 0),
        stream_interruptions=f.get("cut_off", 0) + f.get("stream_error", 0),
        connect_errors=f.get("connect", 0),
        http_errors=f.get("http_status", 0),
    )


class EngineWatch(threading.Thread):
    """Watches a running engine while the load steps run (see the module doc).

    ``engine``: the :class:`~servelab.engines.running.RunningEngine`; ``relaunch(port)``: starts the same
    engine on ``port`` and returns the new ready ``RunningEngine`` (``None`` = no restart); ``restart``:
    ``"never"`` or ``"once"``; ``step_of()``: the load step running now; ``on_swap(new)``: told when a
    restarted engine replaces the old one (the metrics sampler follows it); ``kind``: the engine kind,
    for its OOM messages. After :meth:`stop`, :attr:`engine` is the engine that runs (or ran) last."""

    def __init__(
        self,
        engine: Any,
        *,
        relaunch: Callable[[int], Any] | None,
        restart: str = "never",
        step_of: Callable[[], str | None] = lambda: None,
        on_swap: Callable[[Any], None] | None = None,
        kind: str | None = None,
        poll_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(daemon=True)
        self.engine = engine
        self.relaunch, self.restart, self.step_of, self.on_swap, self.kind = relaunch, restart, step_of, on_swap, kind
        self.poll_s, self.clock = poll_s, clock
        self.t0 = clock()
        self.crashes: list[Crash] = []
        self._stop_evt = threading.Event()
        self._restarting = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._stop_evt.wait(self.poll_s):
            eng = self.engine
            if eng.alive or getattr(eng, "_stopped", False):
                continue
            rc = eng.process.poll()
            seen = self.clock()
            oom, sig, line = classify_exit(rc, eng.log_path, self.kind)
            crash = Crash(
                at_s=round(seen - self.t0, 3),
                at_unix_s=time.time(),
                step=self.step_of(),
                returncode=rc,
                signal=sig,
                oom=oom,
                log_line=line,
            )
            with self._lock:
                self.crashes.append(crash)
            if self.restart != "once" or self.relaunch is None or sum(c.restarted for c in self.crashes) >= 1:
                return  # not restarted: the flow reports the engine as died
            crash.restarted = True
            self._restarting.set()
            try:
                new = self.relaunch(eng.port)
                new.measure_first_token(timeout_s=300)
            except Exception as e:  # noqa: BLE001 — recorded; the candidate then fails as crashed
                crash.restart_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                return
            finally:
                self._restarting.clear()
            crash.recovered, crash.recovery_s = True, round(self.clock() - seen, 3)
            self.engine = new
            if self.on_swap is not None:
                self.on_swap(new)

    def settle(self, timeout_s: float = 600.0) -> Any:
        """Wait (up to ``timeout_s``) for a crash just seen to be handled — a restart in progress to end —
        and return the engine that runs now."""
        deadline = self.clock() + timeout_s
        time.sleep(2 * self.poll_s)  # an exit in the last poll interval is seen
        while self._restarting.is_set() and self.clock() < deadline:
            time.sleep(self.poll_s)
        return self.engine

    def stop(self) -> None:
        """Stop watching (the engines are stopped by their owner)."""
        self._stop_evt.set()
        self.join(timeout=600)

    @property
    def down(self) -> bool:
        """True when the engine exited and was not brought back."""
        return not self.engine.alive

    def report(self, steps: Iterable[StepSummary]) -> Reliability:
        """The :class:`Reliability` of ``steps`` with the crashes seen."""
        out = Reliability(
            restart=self.restart,
            crashes=list(self.crashes),
            crash_count=len(self.crashes),
            oom_count=sum(c.oom for c in self.crashes),
            restart_count=sum(c.recovered for c in self.crashes),
        )
        per: dict[str, StepReliability] = {}
        for st in steps:
            if st.skipped:
                continue
            r = step_counters(st)
            for c in self.crashes:
                if c.step == st.label or (c.step is None and _during(c, st)):
                    r.crashes += 1
                    r.ooms += int(c.oom)
                    r.restarts += int(c.recovered)
            per[st.label] = r
        out.steps = per  # assigned, not filled in place: record.json is written with exclude_unset
        return out


def watch_engine(cand: Any, running: Any, sampler: Any, log_dir: str) -> EngineWatch:
    """Start an :class:`EngineWatch` on a trial candidate's ``running`` engine: its ``restart`` policy,
    a relaunch of the same kind and settings on the same port (logs into ``log_dir``), the step from
    the metrics ``sampler``, which follows a restarted engine."""

    def relaunch(port: int) -> Any:
        settings = cand.settings.model_copy(update={"port": port})
        return cand.kind.launch(settings, model=cand.model, log_dir=log_dir)

    def swap(new: Any) -> None:
        if sampler is not None:
            sampler.engine = new

    w = EngineWatch(
        running,
        relaunch=relaunch,
        restart=getattr(cand, "restart", "never"),
        step_of=lambda: getattr(sampler, "step", None),
        on_swap=swap,
        kind=cand.engine,
    )
    w.start()
    return w


def _during(c: Crash, st: StepSummary) -> bool:
    """Whether crash ``c`` happened inside step ``st``'s window (wall clock; 1 s slack for the drain)."""
    if c.at_unix_s is None or st.started_unix_s is None:
        return False
    return st.started_unix_s <= c.at_unix_s <= st.started_unix_s + (st.window_s or 0.0) + 1.0


def current_engine(watch: EngineWatch | None, running: Any) -> Any:
    """The engine that runs now: the watch's (a restarted one after a crash, once its restart ended:
    :meth:`EngineWatch.settle`) or ``running``."""
    return watch.settle() if watch is not None else running


def end_watch(watch: EngineWatch | None, running: Any, result: Any) -> Any:
    """Stop ``watch`` (when there is one), put its :class:`Reliability` of ``result.steps`` into
    ``result.reliability``, stop a crashed engine it replaced, and return the engine left to stop."""
    if watch is None:
        return running
    watch.stop()
    result.reliability = watch.report(result.steps)
    if running is not None and watch.engine is not running:
        running.stop()  # the crashed one (reaped); the restarted one is the caller's to stop
    return watch.engine
