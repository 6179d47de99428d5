"""The worker side of multi-process and Ray load generation: :class:`WorkerCore` runs its share of a step
on its own event loop and HTTP session from a common start instant (:class:`StartAt`), and sends its
finished requests' ``requests.jsonl`` lines back in :class:`LineBatch` messages; plus the constants both
pools use (start lead, timeouts, the batch age) and this kernel's boot id (a shared monotonic clock)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from servelab.bench.analysis import metrics as M
from servelab.bench.load.lines import HOSTNAME, finish_record, record_to_json
from servelab.bench.load.saturation import CpuMeter, worker_step
from servelab.bench.load.shares import Picked, RunContext, StepTask
from servelab.bench.load.step import run_step, sleep_until_ns
from servelab.bench.results import WorkerStep
from servelab.wire.client import make_session
from servelab.wire.types import RequestSpec


def _boot_id() -> str:
    """This kernel's boot id: two processes with the same one share CLOCK_MONOTONIC."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return f"{HOSTNAME}-no-boot-id"


BOOT_ID = _boot_id()
#: how far ahead of "all workers ready" the common start is set, seconds: local processes, Ray actors
START_LEAD_S = {"processes": 0.05, "ray": 0.25}
#: how long a worker may take to start (import servelab, load the tokenizer), seconds
WORKER_START_TIMEOUT_S = 180.0
#: after a stop (Ctrl-C), how long workers get to report their cancelled requests, seconds
CANCEL_GRACE_S = 10.0
#: a ``--workers`` process sends its finished requests' lines in batches at most this old (s): one pipe
#: message per batch; a process killed outright loses at most its last batch (the lines of the requests
#: that finished in its last 20 ms), which the summary counts as missing like any lost part
LINE_BATCH_S = 0.02


@dataclass
class ClockSample:
    """A worker's clocks read at one moment, with where it runs."""

    wall_ns: int
    mono_ns: int
    boot_id: str
    host: str
    pid: int
    node_id: str | None = None


@dataclass
class StartAt:
    """The common start instant of a step on the coordinator's clocks (the same instant read on both),
    and the coordinator's boot id (a worker with the same one uses ``mono_ns`` directly)."""

    mono_ns: int
    wall_ns: int
    boot_id: str = BOOT_ID

    @classmethod
    def ahead(cls, lead_s: float) -> StartAt:
        """The instant ``lead_s`` seconds from now."""
        lead = int(lead_s * 1e9)
        return cls(time.monotonic_ns() + lead, time.time_ns() + lead)

    def local_ns(self) -> int:
        """The instant on this process's ``time.monotonic_ns()`` clock."""
        if self.boot_id == BOOT_ID:
            return self.mono_ns
        return time.monotonic_ns() + (self.wall_ns - time.time_ns())


Emit = Callable[[bool, bytes], object]  # its result is ignored


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class WorkerCore:
    """A load-generator worker: its own event loop (uvloop when installed) on a thread of its own, one
    HTTP session for the whole run, and the steps it is given. Used by the worker processes of
    ``--workers`` and by the Ray actors of ``--ray``; every method may be called from another thread."""

    def __init__(self, index: int, node_id: str | None = None) -> None:
        self.index = index
        self.node_id = node_id
        self.ctx: RunContext | None = None
        self._task: StepTask | None = None
        self._running: asyncio.Task[Any] | None = None
        self._session: Any = None
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"servelab-worker-{index}", daemon=True)
        self._thread.start()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def setup(self, ctx: RunContext) -> None:
        """Take the run's context and open the HTTP session."""
        self.ctx = ctx

        async def _open() -> None:
            self._session = make_session(max_connections=0)
            try:  # warm the connection pool, DNS and the HTTP code paths before the first measured request
                async with self._session.get(
                    ctx.base_url + "/models", headers=ctx.headers, timeout=aiohttp.ClientTimeout(total=15)
                ) as resp:
                    await resp.read()
            except (aiohttp.ClientError, TimeoutError):
                pass  # the coordinator's preflight already checked the server; a worker's own failures show per request

        self._call(_open())
        gc.collect()
        gc.freeze()  # the run's long-lived objects (tokenizer, context) out of the collector's way

    def clock(self) -> ClockSample:
        """This worker's clocks now."""
        return ClockSample(time.time_ns(), time.monotonic_ns(), BOOT_ID, HOSTNAME, os.getpid(), self.node_id)

    def prepare(self, task: StepTask) -> None:
        """Take the next step's share (started by :meth:`go`)."""
        self._task = task

    def go(self, start: StartAt, emit: Emit) -> concurrent.futures.Future[WorkerStep]:
        """Run the prepared share from the common ``start``; ``emit(failed, line)`` is called from the
        worker's loop thread with each finished request's ``requests.jsonl`` line (JSON bytes). The
        future resolves to the worker's :class:`WorkerStep` (also after :meth:`cancel`)."""
        task, self._task = self._task, None
        if task is None or self.ctx is None:
            raise RuntimeError("go() before setup() and prepare()")
        return asyncio.run_coroutine_threadsafe(self._run(task, start.local_ns(), emit), self.loop)

    def cancel(self) -> None:
        """Cancel the running share: its requests in flight end as ``cancelled`` (and are emitted)."""

        def _cancel() -> None:
            if self._running is not None:
                self._running.cancel()

        self.loop.call_soon_threadsafe(_cancel)

    def close(self) -> None:
        """Close the session and stop the loop thread."""

        async def _close() -> None:
            if self._session is not None:
                await self._session.close()

        try:
            self._call(_close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)

    async def _run(self, task: StepTask, t0: int, emit: Emit) -> WorkerStep:
        assert self.ctx is not None
        ctx = self.ctx
        self._running = asyncio.current_task()
        sched_lags: list[float] = []
        dispatch: list[int] | None = [] if task.load.kind == "open" else None

        def on_done(rec: Any, spec: RequestSpec) -> None:
            finish_record(rec, spec, ctx.counter, ctx.objectives)
            lag = M.schedule_lag_s(rec)
            if lag is not None:
                sched_lags.append(lag)
            line = record_to_json(
                rec,
                step_index=task.step_index,
                step_workload=task.step_workload,
                worker=self.index,
                host=HOSTNAME,
                t0_ns=t0,
            )
            emit(rec.failure is not None, line.to_json_bytes())

        finished: list[Any] = []
        meter = CpuMeter()
        try:
            await sleep_until_ns(t0)
            late = max(0, time.monotonic_ns() - t0) / 1e9
            meter.start()
            specs = Picked(task.share, task.pool, own=task.own)
            await run_step(
                self._session,
                ctx.base_url,
                ctx.model,
                specs,
                task.load,
                step=task.step,
                warmup=task.warmup,
                timeout_s=ctx.timeout_s,
                drain_s=ctx.drain_s,
                headers=ctx.headers,
                on_done=on_done,
                records=finished,
                start_ns=t0,
                offsets_ns=task.offsets_ns,
                ids=Picked(task.share, None, task.first_id),
                dispatch_lags_ns=dispatch,
                traceparent=ctx.trace_ids.header if ctx.trace_ids is not None else None,
            )
        except asyncio.CancelledError:
            late = None  # stopped: the report still goes back with what finished
        finally:
            self._running = None
        return worker_step(
            self.index,
            HOSTNAME,
            meter,
            concurrency=task.load.concurrency if task.load.kind == "closed" else task.load.max_concurrency,
            assigned=task.assigned,
            finished=sum(1 for r in finished if r.end_ns is not None),
            schedule_lags_s=sched_lags,
            dispatch_lags_ns=dispatch,
            start_late_s=late,
        )


# ------------------------------------------------------------------------------------------------
# the coordinator's view of a pool of workers


@dataclass(frozen=True)
class LineBatch:
    """Finished requests' ``requests.jsonl`` lines as one worker sent them: ``lines`` is ``count`` JSON
    lines joined by ``b"\\n"`` (no trailing newline), ``failed`` of them failed requests. One message,
    one file write and one progress update per batch instead of per request."""

    lines: bytes
    count: int
    failed: int = 0

    @classmethod
    def of(cls, lines: Sequence[bytes], failed: int) -> LineBatch:
        """The batch of ``lines`` (each one JSON line, no newline)."""
        return cls(b"\n".join(lines), len(lines), failed)

    def split(self) -> list[bytes]:
        """The lines, one bytes object each."""
        return self.lines.split(b"\n") if self.count else []

    def to_bytes(self) -> bytes:
        """``count`` and ``failed`` (little-endian uint32 each), then ``lines``: :meth:`from_bytes` reads it."""
        return struct.pack("<II", self.count, self.failed) + self.lines

    @classmethod
    def from_bytes(cls, data: bytes) -> LineBatch:
        """The batch :meth:`to_bytes` wrote. Raises ``struct.error`` for fewer than 8 bytes."""
        count, failed = struct.unpack_from("<II", data)
        return cls(data[8:], count, failed)


class LineBuffer:
    """A worker's finished lines not yet handed on: :meth:`add` from the worker's loop thread, :meth:`take`
    from any thread (a Ray actor drains it from its own), under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: list[bytes] = []
        self._failed = 0

    def add(self, failed: bool, line: bytes) -> bool:
        """Keep ``line``; True when the buffer was empty before it (the caller may schedule a send)."""
        with self._lock:
            self._lines.append(line)
            self._failed += failed
            return len(self._lines) == 1

    def take(self) -> LineBatch:
        """Everything kept so far, as one batch (empty when nothing was)."""
        with self._lock:
            lines, failed = self._lines, self._failed
            self._lines, self._failed = [], 0
        return LineBatch.of(lines, failed)
