"""Load generation on several processes (``servelab bench --workers N``) and the worker side shared with
Ray (:mod:`servelab.bench.load.rayrun`).

One process, the *coordinator* (the ``servelab bench`` process), plans each step, splits it among the
workers, agrees the common start and merges what comes back; each *worker* runs its share with its own
event loop (uvloop when installed) and its own HTTP connections, and streams one ``requests.jsonl``
line back per finished request, at once (so a worker that dies leaves every request it finished).

The split is exact and deterministic (:func:`plan_step`):

- closed loop at concurrency ``C`` over ``W`` workers: worker ``k`` keeps ``C // W`` (the first
  ``C % W`` one more) requests in flight; of the step's request list (the same list, same ids, as the
  single-process run), request ``j`` goes to the worker owning loop slot ``j % C``, so each worker's
  share of requests matches its share of the concurrency. A worker with no slot sits the step out.
- open loop: ONE arrival schedule is drawn for the step (:func:`servelab.bench.load.step.arrival_offsets_s`,
  same seed, same intended send times as a single process); arrival ``j`` goes to worker ``j % W``
  with its intended offset, and ``--max-concurrency`` is split like a closed loop's concurrency.

Start: the coordinator sends every worker its share, waits until all are ready, then sends one start
instant ``lead`` ahead, as a monotonic time (used by workers on the coordinator's host: same clock) and
as a wall-clock time (converted by workers on other hosts to their monotonic clock). Every worker then
measures with its own monotonic clock; :mod:`servelab.bench.load.merge` says how stamps of several hosts are
compared. Each worker reports its CPU use and lags (:mod:`servelab.bench.load.saturation`).

A worker that dies mid-step (killed, out of memory, its host lost) is reported as a lost part of the
step (:class:`~servelab.bench.results.LostPart`), its finished requests counted; the other workers
finish the step and the run goes on without it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import multiprocessing
import os
import pickle
import signal
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, overload

import aiohttp

from servelab.bench.analysis import metrics as M
from servelab.bench.analysis.slo import Objective
from servelab.bench.load.lines import HOSTNAME, finish_record, record_to_json
from servelab.bench.load.saturation import CpuMeter, worker_step
from servelab.bench.load.step import LoadModel, run_step, sleep_until_ns
from servelab.bench.results import GeneratorWorker, WorkerStep
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


def split_count(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal counts, the first ``total % parts`` one larger:
    ``split_count(5, 2) == [3, 2]``. Raises ``ValueError`` for ``parts < 1``."""
    if parts < 1:
        raise ValueError(f"cannot split among {parts} workers")
    q, r = divmod(total, parts)
    return [q + (1 if k < r else 0) for k in range(parts)]


@dataclass(frozen=True)
class Share(Sequence[int]):
    """The global request indices ``j < n`` of one worker: those with ``offset <= j % period < offset +
    width``, in increasing order (closed loop: ``period`` = concurrency, the worker's loop slots;
    open loop: ``period`` = workers, ``width`` 1). Indexable without listing them (a step bounded by
    ``--duration`` may hold millions)."""

    n: int
    period: int
    offset: int
    width: int

    def __len__(self) -> int:
        full, rem = divmod(self.n, self.period)
        return full * self.width + max(0, min(rem, self.offset + self.width) - self.offset)

    @overload
    def __getitem__(self, k: int) -> int: ...

    @overload
    def __getitem__(self, k: slice) -> list[int]: ...

    def __getitem__(self, k: int | slice) -> int | list[int]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        size = len(self)
        if k < 0:
            k += size
        if not 0 <= k < size:
            raise IndexError(k)
        q, r = divmod(k, self.width)
        return q * self.period + self.offset + r


class _Picked(Sequence[Any]):
    """For the ``k``-th request of ``share`` (global index ``j = share[k]``): ``base + j`` when ``items`` is
    None (its id); ``items[k]`` when ``own`` (the worker's own specs, in share order); else
    ``items[j % len(items)]`` (the pool of a duration-bounded step, cycled as
    :class:`servelab.bench.load.runner.CyclicSpecs` does)."""

    def __init__(self, share: Share, items: Sequence[Any] | None = None, base: int = 0, own: bool = False) -> None:
        self._share, self._items, self._base, self._own = share, items, base, own

    def __len__(self) -> int:
        return len(self._share)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if self._own and self._items is not None:
            if not -len(self) <= k < len(self):
                raise IndexError(k)
            return self._items[k]
        j = self._share[k]
        return self._base + j if self._items is None else self._items[j % len(self._items)]


@dataclass
class RunContext:
    """What every worker needs for the whole run (sent once): the server, the per-request work
    (``counter``: the client tokenizer or ``None``; ``objectives`` for the per-request gates)."""

    base_url: str
    model: str
    headers: dict[str, str] | None
    timeout_s: float
    objectives: list[Objective]
    counter: Any = None
    drain_s: float = 30.0


@dataclass
class StepTask:
    """One worker's share of one step (or of its warmup): ``load`` is the worker's own load (its
    concurrency, or the rate and its part of ``max_concurrency``); request ``k`` of the share has id
    ``first_id + j`` for ``j = share[k]`` and is ``pool[k]`` when ``own`` (only the worker's own specs are
    sent), else ``pool[j % len(pool)]`` (a cycled pool); ``offsets_ns`` (open loop)
    are the intended send offsets of the share from the common start; ``assigned`` how many it should
    finish (``None``: a closed loop ended by ``--duration``)."""

    worker: int
    step: str
    step_index: int
    step_workload: str
    warmup: bool
    load: LoadModel
    pool: list[RequestSpec]
    share: Share
    first_id: int
    offsets_ns: list[int] | None = None
    assigned: int | None = None
    own: bool = False


def plan_step(
    load: LoadModel,
    pool: list[RequestSpec],
    n: int,
    workers: list[int],
    *,
    first_id: int,
    step: str,
    step_index: int,
    step_workload: str,
    warmup: bool,
    offsets_ns: Sequence[int] | None = None,
    fixed_count: bool = True,
) -> dict[int, StepTask]:
    """Split one step of ``n`` requests (drawn cyclically from ``pool``) among ``workers`` (their
    indices, in order) as the module doc says; returns ``{worker: task}`` (workers with no share of a
    closed loop left out). ``offsets_ns``: the step's global open-loop schedule (``n`` values, ns);
    ``fixed_count`` False: ``n`` is only a bound (a closed loop ended by ``--duration``), so no worker
    has an ``assigned`` count.
    Raises ``ValueError`` for an open loop without its schedule or a cap below the number of workers."""
    out: dict[int, StepTask] = {}
    w = len(workers)
    dur_ns = int(load.duration_s * 1e9) if load.duration_s else None
    if load.kind == "closed":
        slots = split_count(max(1, load.concurrency), w)
        a = 0
        for k, c in zip(workers, slots, strict=True):
            if c:
                share = Share(n, max(1, load.concurrency), a, c)
                assigned = len(share) if fixed_count else None
                specs, own = _specs_for(pool, n, share)
                out[k] = StepTask(
                    k,
                    step,
                    step_index,
                    step_workload,
                    warmup,
                    replace(load, concurrency=c),
                    specs,
                    share,
                    first_id,
                    None,
                    assigned,
                    own,
                )
            a += c
        return out
    if offsets_ns is None or len(offsets_ns) != n:
        raise ValueError("an open-loop step needs its global schedule, one offset per request")
    caps: list[int | None] = [None] * w
    if load.max_concurrency:
        if load.max_concurrency < w:
            raise ValueError(f"--max-concurrency {load.max_concurrency} is below the {w} workers")
        caps = list(split_count(load.max_concurrency, w))
    for pos, (k, cap) in enumerate(zip(workers, caps, strict=True)):
        share = Share(n, w, pos, 1)
        offs = [int(offsets_ns[j]) for j in share]
        assigned = sum(1 for o in offs if dur_ns is None or o < dur_ns)
        specs, own = _specs_for(pool, n, share)
        out[k] = StepTask(
            k,
            step,
            step_index,
            step_workload,
            warmup,
            replace(load, max_concurrency=cap),
            specs,
            share,
            first_id,
            offs,
            assigned,
            own,
        )
    return out


def _specs_for(pool: list[RequestSpec], n: int, share: Share) -> tuple[list[RequestSpec], bool]:
    """What a worker is sent of the step's requests: its own (``own`` True) when the step lists every
    request, else the whole (short, cycled) pool."""
    if len(pool) >= n:
        return [pool[j] for j in share], True
    return pool, False


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
            specs = _Picked(task.share, task.pool, own=task.own)
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
                ids=_Picked(task.share, None, task.first_id),
                dispatch_lags_ns=dispatch,
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


@dataclass
class WorkerOutcome:
    """What one worker's share of a step came to: its report, or why it was lost."""

    report: WorkerStep | None = None
    lost_reason: str | None = None
    lines: int = 0


#: ``on_lines(worker, batch)``: called by a pool with each batch of a worker's finished lines as it arrives
OnLines = Callable[[int, LineBatch], None]


class Pool(Protocol):
    """Workers the coordinator drives (:class:`LocalPool`, :class:`servelab.bench.load.rayrun.RayPool`)."""

    mode: str
    address: str | None
    alive: list[int]

    async def start(self, ctx: RunContext) -> list[GeneratorWorker]:
        """Start the workers, hand them ``ctx``, measure their clocks."""
        ...

    async def run_step(self, tasks: dict[int, StepTask], on_lines: OnLines) -> dict[int, WorkerOutcome]:
        """Run one step's shares from a common start; ``on_lines(worker, batch)`` with each
        :class:`LineBatch` of finished requests as it arrives. Cancelling it cancels the workers' shares
        (their cancelled requests still arrive through ``on_lines`` before it re-raises)."""
        ...

    async def close(self) -> None:
        """Stop every worker."""
        ...


def generator_worker(k: int, samples: list[tuple[int, ClockSample, int]]) -> GeneratorWorker:
    """The :class:`GeneratorWorker` of worker ``k`` from clock samples ``(coordinator wall ns at send,
    worker sample, coordinator wall ns at reply)``: the sample with the smallest round trip gives the
    offset (worker wall - midpoint of the coordinator's send and reply)."""
    t1, s, t2 = min(samples, key=lambda x: x[2] - x[0])
    return GeneratorWorker(
        worker=k,
        host=s.host,
        pid=s.pid,
        node_id=s.node_id,
        same_clock=s.boot_id == BOOT_ID,
        wall_offset_s=(s.wall_ns - (t1 + t2) / 2) / 1e9,
        rtt_s=(t2 - t1) / 1e9,
    )


def _process_main(conn: Any, index: int) -> None:
    """A ``--workers`` process: serve the coordinator's commands over ``conn`` until it says stop or
    goes away (its end of the pipe closes: this process then exits, never an orphan)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the coordinator decides
    core = WorkerCore(index)
    lock = threading.Lock()
    pending = LineBuffer()  # lines not yet sent

    def send(data: bytes) -> None:
        with lock:
            conn.send_bytes(data)

    def flush() -> None:
        batch = pending.take()
        if batch.count:
            send(b"B" + batch.to_bytes())

    def emit(failed: bool, line: bytes) -> None:
        # lines go out in batches at most LINE_BATCH_S old: one pipe message (and one coordinator wake-up)
        # per batch instead of per request, which at hundreds of requests/s was most of the coordinator's CPU
        if pending.add(failed, line):
            core.loop.call_later(LINE_BATCH_S, flush)

    def done(fut: concurrent.futures.Future[WorkerStep]) -> None:
        flush()  # every line before the report (same thread: the loop's)
        try:
            send(b"D" + pickle.dumps(fut.result()))
        except BaseException as e:  # noqa: BLE001 — reported to the coordinator, which names the worker lost
            send(b"E" + f"{type(e).__name__}: {e}".encode())

    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)
        kind = msg[0]
        try:
            if kind == "setup":
                core.setup(msg[1])
                send(b"K")
            elif kind == "clock":
                send(b"C" + pickle.dumps(core.clock()))
            elif kind == "task":
                core.prepare(msg[1])
                send(b"R")
            elif kind == "go":
                core.go(msg[1], emit).add_done_callback(done)
            elif kind == "cancel":
                core.cancel()
            elif kind == "stop":
                core.close()
                return
        except Exception as e:  # noqa: BLE001 — one line back; the coordinator names this worker lost
            send(b"E" + f"{type(e).__name__}: {e}".encode())


def _exit_reason(code: int | None, pid: int | None) -> str:
    if code is None:
        return f"process {pid} stopped answering (its pipe closed)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"process {pid} was killed by {name}"
    return f"process {pid} exited with code {code}"


class LocalPool:
    """``--workers N`` processes on this host (multiprocessing, spawn: fresh interpreters, no state
    copied from the coordinator), one pipe each."""

    mode = "processes"
    address: str | None = None

    def __init__(self, n: int) -> None:
        self.n = n
        self.alive: list[int] = []
        self._procs: dict[int, Any] = {}
        self._conns: dict[int, Any] = {}
        self._queues: dict[int, asyncio.Queue[tuple[bytes, bytes]]] = {}
        self._on_lines: OnLines | None = None
        self._lines: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- plumbing
    def _reader(self, k: int, loop: asyncio.AbstractEventLoop) -> None:
        """Thread: blocking reads of worker ``k``'s messages, handed to the event loop. (Not
        ``loop.add_reader``: uvloop makes a watched descriptor non-blocking, and multiprocessing's
        ``send_bytes``/``recv_bytes`` of a large message, the tokenizer in the setup, then fail half-way.)"""
        conn = self._conns[k]
        while True:
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                data = None
            try:
                loop.call_soon_threadsafe(self._dead if data is None else self._dispatch, k, data)
            except RuntimeError:  # the loop is closed: the run is over
                return
            if data is None:
                return

    def _dispatch(self, k: int, data: bytes) -> None:
        tag = data[:1]
        if tag == b"B":  # b"B" + LineBatch.to_bytes()
            batch = LineBatch.from_bytes(data[1:])
            self._lines[k] = self._lines.get(k, 0) + batch.count
            if self._on_lines is not None:
                self._on_lines(k, batch)
        else:
            self._queues[k].put_nowait((tag, data[1:]))

    def _dead(self, k: int, _data: bytes | None = None) -> None:
        if k in self.alive:
            self.alive.remove(k)
            self._queues[k].put_nowait((b"X", b""))

    def _send(self, k: int, msg: tuple[Any, ...] | bytes) -> None:
        try:
            self._conns[k].send_bytes(msg if isinstance(msg, bytes) else pickle.dumps(msg))
        except (BrokenPipeError, OSError):
            self._dead(k)

    async def _reply(self, k: int, want: bytes, timeout_s: float) -> tuple[bytes, bytes]:
        """The next control message of worker ``k``: ``(tag, payload)``; tag ``X`` when it died, ``E``
        for its error, ``T`` when none came in ``timeout_s``."""
        try:
            tag, payload = await asyncio.wait_for(self._queues[k].get(), timeout_s)
        except TimeoutError:
            return b"T", b""
        if tag not in (want, b"X", b"E"):
            raise RuntimeError(f"worker {k} answered {tag!r}, expected {want!r}")
        return tag, payload

    def _why(self, k: int, tag: bytes, payload: bytes) -> str:
        p = self._procs[k]
        if tag == b"E":
            return f"process {p.pid} failed: {payload.decode(errors='replace')}"
        if tag == b"T":
            return f"process {p.pid} did not answer"
        p.join(2)
        return _exit_reason(p.exitcode, p.pid)

    # -- Pool
    async def start(self, ctx: RunContext) -> list[GeneratorWorker]:
        """Spawn the processes, send ``ctx``, measure clocks. Raises ``RuntimeError`` naming the worker
        when one cannot start."""
        self._loop = asyncio.get_running_loop()
        mp = multiprocessing.get_context("spawn")
        for k in range(self.n):
            parent, child = mp.Pipe(duplex=True)
            p = mp.Process(target=_process_main, args=(child, k), name=f"servelab-bench-worker-{k}", daemon=True)
            p.start()
            child.close()
            self._procs[k], self._conns[k] = p, parent
            self._queues[k] = asyncio.Queue()
            self.alive.append(k)
            threading.Thread(
                target=self._reader, args=(k, self._loop), name=f"servelab-worker-{k}-reader", daemon=True
            ).start()
        blob = pickle.dumps(("setup", ctx))
        for k in list(self.alive):
            self._send(k, blob)
        for k in range(self.n):
            tag, payload = await self._reply(k, b"K", WORKER_START_TIMEOUT_S)
            if tag != b"K":
                raise RuntimeError(f"load-generator worker {k} did not start: {self._why(k, tag, payload)}")
        out = []
        for k in range(self.n):
            samples = []
            for _ in range(5):
                t1 = time.time_ns()
                self._send(k, ("clock",))
                tag, payload = await self._reply(k, b"C", 30)
                if tag != b"C":
                    raise RuntimeError(f"load-generator worker {k} did not start: {self._why(k, tag, payload)}")
                samples.append((t1, pickle.loads(payload), time.time_ns()))
            out.append(generator_worker(k, samples))
        return out

    async def run_step(self, tasks: dict[int, StepTask], on_lines: OnLines) -> dict[int, WorkerOutcome]:
        """See :class:`Pool`."""
        self._on_lines = on_lines
        outcomes = {k: WorkerOutcome() for k in tasks}
        self._lines = {k: 0 for k in tasks}
        try:
            for k, t in tasks.items():
                self._send(k, ("task", t))
            ready = []
            for k in tasks:
                tag, payload = await self._reply(k, b"R", 60)
                if tag == b"R":
                    ready.append(k)
                else:
                    outcomes[k].lost_reason = self._why(k, tag, payload)
            start = StartAt.ahead(START_LEAD_S["processes"])
            for k in ready:
                self._send(k, ("go", start))
            try:
                await self._collect(ready, outcomes, None)
            except asyncio.CancelledError:
                for k in ready:
                    if k in self.alive and outcomes[k].report is None and outcomes[k].lost_reason is None:
                        self._send(k, ("cancel",))
                await self._collect(
                    [k for k in ready if outcomes[k].report is None and not outcomes[k].lost_reason],
                    outcomes,
                    CANCEL_GRACE_S,
                )
                raise
        finally:
            for k in outcomes:
                outcomes[k].lines = self._lines.get(k, 0)
            self._on_lines = None
        return outcomes

    async def _collect(self, ks: list[int], outcomes: dict[int, WorkerOutcome], timeout_s: float | None) -> None:
        async def one(k: int) -> None:
            tag, payload = await self._reply(k, b"D", timeout_s if timeout_s is not None else 10 * 86400)
            if tag == b"D":
                outcomes[k].report = pickle.loads(payload)
            else:
                outcomes[k].lost_reason = self._why(k, tag, payload)

        await asyncio.gather(*(one(k) for k in ks))

    async def close(self) -> None:
        """Ask every process to stop; terminate (then kill) any still running after 5 s."""
        for k in list(self.alive):
            self._send(k, ("stop",))
        loop = asyncio.get_running_loop()
        for k, p in self._procs.items():
            await loop.run_in_executor(None, p.join, 5)
            if p.is_alive():
                p.terminate()
                await loop.run_in_executor(None, p.join, 5)
            if p.is_alive():
                p.kill()
                p.join()
            if k in self.alive:
                self.alive.remove(k)
            self._conns[k].close()


@dataclass
class StepLines:
    """What the coordinator received during one step: every line (JSON bytes, in arrival order) and
    the count per worker."""

    lines: list[bytes] = field(default_factory=list)
    per_worker: dict[int, int] = field(default_factory=dict)
