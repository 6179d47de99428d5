"""Load generation on a Ray cluster (``servelab bench --ray ADDRESS``): one Ray actor per worker, each a
:class:`servelab.bench.load.worker.WorkerCore` (its own uvloop event loop and HTTP session) in its own
process, placed over the cluster's nodes.

Placement: ``--workers N`` actors in total, spread over the nodes (Ray's ``SPREAD`` strategy), or
``--workers-per-node N`` actors on every alive node (node affinity). Each actor reserves
:data:`ACTOR_CPUS` CPU of its node, so Ray never packs more load generators on a node than it has
CPUs for; a cluster without room is refused with one line after :data:`PLACE_TIMEOUT_S`.

Lines: an actor keeps each finished request's line in a buffer that the coordinator drains every
:data:`DRAIN_EVERY_S` seconds (and once more when the actor's share ends), so ``requests.jsonl`` grows
during the step. An actor that dies (its process killed, its node lost) is reported as a lost part of
the step with every line drained before it died; lines of its last :data:`DRAIN_EVERY_S` seconds
can be lost with it and count as missing. Every node needs servelab (and ``ray``, the same version as
the head) installed for the same Python version: see docs/distributed-bench.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from servelab.bench.load.shares import RunContext, StepTask
from servelab.bench.load.worker import START_LEAD_S, LineBatch, LineBuffer, StartAt, WorkerCore
from servelab.bench.load.workers import OnLines, WorkerOutcome, generator_worker
from servelab.bench.results import GeneratorWorker
from servelab.wire.client import ConfigError

#: CPUs each actor reserves on its node
ACTOR_CPUS = 1.0
#: how long the actors may take to be placed and started, seconds
PLACE_TIMEOUT_S = 120.0
#: how often the coordinator collects the actors' finished lines, seconds
DRAIN_EVERY_S = 0.1


class RayWorkerActor:
    """The body of a Ray actor (made remote by :class:`RayPool`): a :class:`WorkerCore` and the buffer of
    its finished lines. Threaded (several calls at once): ``go`` blocks for the whole share while
    ``drain`` and ``cancel`` are called beside it."""

    def __init__(self, index: int) -> None:
        import ray

        self.core = WorkerCore(index, node_id=ray.get_runtime_context().get_node_id())
        self._buf = LineBuffer()

    def setup(self, ctx: RunContext) -> bool:
        """Take the run's context; True when ready."""
        self.core.setup(ctx)
        return True

    def clock(self) -> Any:
        """This actor's :class:`~servelab.bench.load.worker.ClockSample`."""
        return self.core.clock()

    def prepare(self, task: StepTask) -> bool:
        """Take the next share."""
        self.core.prepare(task)
        return True

    def go(self, start: StartAt) -> Any:
        """Run the prepared share from ``start``; returns its :class:`~servelab.bench.results.WorkerStep`."""
        return self.core.go(start, self._buf.add).result()

    def drain(self) -> LineBatch:
        """The lines finished since the last drain, as one batch."""
        return self._buf.take()

    def cancel(self) -> bool:
        """Cancel the running share."""
        self.core.cancel()
        return True

    def close(self) -> bool:
        """Close the session and the loop."""
        self.core.close()
        return True


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--ray needs the ray package: pip install 'servelab[ray]' (on every node of the "
            "cluster, the same ray version as its head)"
        ) from None
    return ray


class RayPool:
    """Workers as Ray actors on the cluster at ``address`` (``auto``: the one this machine belongs to,
    or ``RAY_ADDRESS``); ``n`` in total or ``per_node`` on every node. See the module doc."""

    mode = "ray"

    def __init__(self, address: str, n: int, per_node: int | None = None) -> None:
        self.address: str | None = address
        self.n, self.per_node = n, per_node
        self.alive: list[int] = []
        self._actors: dict[int, Any] = {}
        self._ray: Any = None

    async def start(self, ctx: RunContext) -> list[GeneratorWorker]:
        """Connect, place and start the actors, send ``ctx``, measure clocks. Raises
        :class:`ConfigError` (one line) when the cluster cannot be reached or has no room."""
        ray = self._ray = _import_ray()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                None,
                lambda: ray.init(
                    address=self.address, log_to_driver=False, logging_level="ERROR", configure_logging=False
                ),
            )
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ConfigError(
                f"--ray {self.address}: cannot connect to a Ray cluster ({str(e).splitlines()[0]}); "
                "start one with 'ray start --head' (docs/distributed-bench.md)"
            ) from None
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor_cls = ray.remote(num_cpus=ACTOR_CPUS, max_concurrency=4, max_restarts=0)(RayWorkerActor)
        placements: list[Any] = []
        if self.per_node is not None:
            nodes = [nd["NodeID"] for nd in ray.nodes() if nd.get("Alive") and nd.get("Resources", {}).get("CPU")]
            for node in nodes:
                placements += [NodeAffinitySchedulingStrategy(node, soft=False)] * self.per_node
        else:
            placements = ["SPREAD"] * self.n
        for k, strategy in enumerate(placements):
            self._actors[k] = actor_cls.options(scheduling_strategy=strategy).remote(k)
            self.alive.append(k)
        blob = ray.put(ctx)
        refs = [self._actors[k].setup.remote(blob) for k in self.alive]
        try:
            await asyncio.wait_for(asyncio.gather(*refs), PLACE_TIMEOUT_S)
        except TimeoutError:
            cpus = ray.cluster_resources().get("CPU", 0)
            raise ConfigError(
                f"--ray {self.address}: Ray could not start {len(placements)} load-generator workers "
                f"of {ACTOR_CPUS:g} CPU each in {PLACE_TIMEOUT_S:g} s (the cluster has {cpus:g} CPUs); "
                "lower --workers or add nodes"
            ) from None
        except ray.exceptions.RayError as e:
            raise ConfigError(
                f"--ray {self.address}: a load-generator worker failed to start: "
                f"{str(e).splitlines()[0]}; is servelab installed on every node?"
            ) from None
        out = []
        for k in self.alive:
            samples = []
            for _ in range(5):
                t1 = time.time_ns()
                s = await self._actors[k].clock.remote()
                samples.append((t1, s, time.time_ns()))
            out.append(generator_worker(k, samples))
        return out

    async def _drain(self, k: int, on_lines: OnLines, outcomes: dict[int, WorkerOutcome]) -> bool:
        """Forward worker ``k``'s buffered lines; False when the actor is gone."""
        try:
            got: LineBatch = await self._actors[k].drain.remote()
        except self._ray.exceptions.RayError:
            return False
        if got.count:
            outcomes[k].lines += got.count
            on_lines(k, got)
        return True

    async def run_step(self, tasks: dict[int, StepTask], on_lines: OnLines) -> dict[int, WorkerOutcome]:
        """See :class:`servelab.bench.load.workers.Pool`."""
        outcomes = {k: WorkerOutcome() for k in tasks}
        ready = []
        for k, res in zip(
            tasks,
            await asyncio.gather(
                *(self._actors[k].prepare.remote(t) for k, t in tasks.items()), return_exceptions=True
            ),
            strict=True,
        ):
            if isinstance(res, BaseException):
                self._lose(k, outcomes, res)
            else:
                ready.append(k)
        start = StartAt.ahead(START_LEAD_S["ray"])
        running = {k: asyncio.ensure_future(self._go(k, start)) for k in ready}
        try:
            await self._follow(running, on_lines, outcomes)
        except asyncio.CancelledError:
            for k, fut in running.items():
                if not fut.done():
                    self._actors[k].cancel.remote()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._follow(running, on_lines, outcomes), 10)
            raise
        return outcomes

    async def _go(self, k: int, start: StartAt) -> Any:
        return await self._actors[k].go.remote(start)

    async def _follow(
        self, running: dict[int, asyncio.Task[Any]], on_lines: OnLines, outcomes: dict[int, WorkerOutcome]
    ) -> None:
        pending = {k for k, f in running.items() if outcomes[k].report is None and outcomes[k].lost_reason is None}
        while pending:
            await asyncio.wait([running[k] for k in pending], timeout=DRAIN_EVERY_S)
            for k in list(pending):
                fut = running[k]
                ok = await self._drain(k, on_lines, outcomes)
                if not fut.done():
                    if not ok:
                        self._lose(k, outcomes, RuntimeError("the actor stopped answering"))
                        pending.discard(k)
                    continue
                pending.discard(k)
                exc = fut.exception()
                if exc is None:
                    outcomes[k].report = fut.result()
                else:
                    self._lose(k, outcomes, exc)

    def _lose(self, k: int, outcomes: dict[int, WorkerOutcome], exc: BaseException) -> None:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        outcomes[k].lost_reason = f"Ray actor {k} died: {type(exc).__name__}: {first[:300]}"
        if k in self.alive:
            self.alive.remove(k)

    async def close(self) -> None:
        """Kill the actors and disconnect from the cluster (the cluster itself keeps running)."""
        ray = self._ray
        if ray is None:
            return
        for k, a in self._actors.items():
            try:
                if k in self.alive:
                    await asyncio.wait_for(a.close.remote(), 10)
            except (TimeoutError, ray.exceptions.RayError):
                pass
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a)
        self.alive.clear()
        await asyncio.get_running_loop().run_in_executor(None, ray.shutdown)
