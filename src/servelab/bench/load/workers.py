"""Load generation on several processes (``servelab bench --workers N``): the pool of worker processes on
this host (:class:`LocalPool`) and the :class:`Pool` protocol it shares with Ray
(:mod:`servelab.bench.load.rayrun`). The split of a step is :mod:`servelab.bench.load.shares`; what each
worker runs is :mod:`servelab.bench.load.worker`.

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
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from servelab.bench.load.shares import RunContext, StepTask
from servelab.bench.load.worker import (
    BOOT_ID,
    CANCEL_GRACE_S,
    LINE_BATCH_S,
    START_LEAD_S,
    WORKER_START_TIMEOUT_S,
    ClockSample,
    LineBatch,
    LineBuffer,
    StartAt,
    WorkerCore,
)
from servelab.bench.results import GeneratorWorker, WorkerStep


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
