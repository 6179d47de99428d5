"""Server-side telemetry of a candidate while its load steps run (seed 003 §19).

:class:`MetricsSampler` is a thread that, every ``interval_s`` seconds and at each measured step's
start and end (:meth:`MetricsSampler.boundary`), takes one :class:`TelemetrySample`:

- the engine's ``/metrics`` figures its kind names (:class:`~servelab.engines.kind.ServerMetrics`:
  running, waiting = queue length, KV-cache use, prompt and generation token counters);
- the launched engine's process tree (the process servelab started and all its descendants, psutil):
  resident memory (bytes, summed) and CPU seconds (user + system, summed; children a tree member
  already reaped count through its ``children_user``/``children_system``);
- per NVIDIA GPU the candidate uses (NVML through nvidia-ml-py): memory used, utilisation and power.
  Without a driver/GPU the telemetry says ``gpu.present = false`` with the reason
  (``NVML: libnvidia-ml.so.1 not found …``); nothing fails.

:meth:`MetricsSampler.telemetry` turns the samples into typed per-step records (:class:`StepTelemetry`,
``results.candidates.<name>.telemetry.steps``): CPU % of one core over the step, peak and mean RSS,
running/waiting/KV gauges (mean, max), GPU memory peak per device, and the server's output tokens
(the generation counter's increase over the step, :func:`generation_counters`) beside the client's
(the step's ``tokens.output_total``: ``usage.completion_tokens`` of the succeeded requests) with their
difference in %. Every sample is also appended to ``server_metrics.jsonl`` (one JSON line each).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil
from pydantic import Field

from servelab.bench.results import ResultModel, ServerFigure, StepSummary
from servelab.engines import registry
from servelab.wire.jsontypes import JsonObject

__all__ = [
    "generation_counters",
    "GpuDevice",
    "GpuInfo",
    "GpuSample",
    "GpuStep",
    "MetricsSampler",
    "Nvml",
    "StepTelemetry",
    "Telemetry",
    "TelemetrySample",
    "TokenAgreement",
    "UrlTarget",
    "host_gpus",
    "parse_visible_devices",
    "start_sampler",
    "tree_cpu_seconds",
    "visible_devices_of",
]


#: the engine counters of generated (output) tokens, by engine; the first present in a step is used.
#: vLLM ``vllm:generation_tokens_total`` (https://docs.vllm.ai/en/latest/design/metrics.html, read
#: 2026-12-01); llama-server ``llamacpp:tokens_predicted_total`` with ``--metrics`` ("Number of generation
#: tokens processed", its /metrics HELP text; on the b11434 build here it matched usage.completion_tokens
#: exactly on every measured step, tests/trial/test_telemetry.py); SGLang ``sglang:generation_tokens_total``
#: (https://docs.sglang.io/references/production_metrics.html, read 2026-12-01).
def generation_counters() -> tuple[str, ...]:
    """Every registered engine kind's generation-token counter (``ServerMetrics.generation_tokens``: the
    ones above for the built-in kinds; a third-party kind declares its own), in registration order."""
    return registry.ServerMetrics.merged(k.metrics for k in registry.kinds()).generation_tokens


# --------------------------------------------------------------------------------------------- models


class GpuSample(ResultModel):
    """One NVIDIA device at one instant: NVML ``index``, ``memory_used_bytes``
    (``nvmlDeviceGetMemoryInfo().used``), ``utilization_pct`` (``nvmlDeviceGetUtilizationRates().gpu``:
    share of the last sample period a kernel ran, 0-100) and ``power_w`` (``nvmlDeviceGetPowerUsage``,
    milliwatts / 1000). A figure the device does not report is ``None``."""

    index: int
    memory_used_bytes: int | None = None
    utilization_pct: float | None = None
    power_w: float | None = None


class TelemetrySample(ResultModel):
    """One line of ``server_metrics.jsonl``: at ``t_unix_s``, during load step ``step`` (``workload/step``;
    ``None`` between steps): the engine's ``/metrics`` figures kept (by name, labels included), the
    process tree's RSS (bytes) and cumulative CPU seconds (``cpu_s``; ``None`` when there is no process
    to read) of process ``pid`` (its leader), and one :class:`GpuSample` per device watched."""

    t_unix_s: float
    step: str | None = None
    rss_bytes: int = 0
    pid: int | None = None
    cpu_s: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    gpus: list[GpuSample] = Field(default_factory=list)


class GpuDevice(ResultModel):
    """A device NVML lists: ``index``, ``name``, ``uuid``, ``memory_total_bytes``."""

    index: int
    name: str | None = None
    uuid: str | None = None
    memory_total_bytes: int | None = None


class GpuInfo(ResultModel):
    """Whether GPU telemetry was taken: ``present`` with the ``devices`` watched and the
    ``driver_version``, or absent with the ``reason``; ``selected_by``: how the devices were chosen
    (``CUDA_VISIBLE_DEVICES=…`` of the candidate, or ``all``)."""

    present: bool = False
    reason: str | None = None
    driver_version: str | None = None
    selected_by: str | None = None
    devices: list[GpuDevice] = Field(default_factory=list)


class GpuStep(ResultModel):
    """One device over one step: memory used (peak and mean, bytes), utilisation (mean, max, %) and
    power (mean, max, W)."""

    index: int
    memory_used_max_bytes: int | None = None
    memory_used_mean_bytes: float | None = None
    utilization_mean_pct: float | None = None
    utilization_max_pct: float | None = None
    power_mean_w: float | None = None
    power_max_w: float | None = None


class TokenAgreement(ResultModel):
    """Output tokens of one step, server vs client: ``server_output_tokens`` (increase of ``counter``
    between the step's first and last sample), ``client_output_tokens`` (the step's
    ``tokens.output_total``), each per second of the step (server: over the samples' span, client: over
    the step window), and ``diff_pct`` = 100 × (server − client) / client. ``client_failed``: measured
    requests that failed (their tokens are in the server's count only)."""

    counter: str
    server_output_tokens: float
    client_output_tokens: int
    server_output_tokens_per_s: float | None = None
    client_output_tokens_per_s: float | None = None
    diff_pct: float | None = None
    client_failed: int = 0


class StepTelemetry(ResultModel):
    """Telemetry of one load step (``workload/step``): ``samples`` taken over ``span_s`` seconds;
    ``cpu_percent``: the engine process tree's CPU seconds over the span, in % of one core (200 = two
    cores busy); ``rss_max_bytes``/``rss_mean_bytes``; ``running``/``waiting``/``kv_usage``: the
    kind's gauges (mean, max; KV usage a fraction 0-1); ``tokens``: server vs client output tokens;
    ``gpus``: per device."""

    samples: int = 0
    span_s: float | None = None
    cpu_percent: float | None = None
    rss_max_bytes: int | None = None
    rss_mean_bytes: float | None = None
    running: ServerFigure | None = None
    waiting: ServerFigure | None = None
    kv_usage: ServerFigure | None = None
    tokens: TokenAgreement | None = None
    gpus: list[GpuStep] = Field(default_factory=list)


class Telemetry(ResultModel):
    """``results.candidates.<name>.telemetry``: sampling ``interval_s``, the host's ``cpu_cores``
    (logical; ``cpu_percent`` can reach 100 × cores), ``process_tree`` (a process servelab launched was
    read), the :class:`GpuInfo`, per-step records and the candidate's peaks: RSS (bytes, largest tree
    sample) and GPU memory (bytes, the largest per-device sample summed over devices at one instant)."""

    interval_s: float
    cpu_cores: int | None = None
    process_tree: bool = False
    gpu: GpuInfo = Field(default_factory=GpuInfo)
    steps: dict[str, StepTelemetry] = Field(default_factory=dict)
    peak_rss_bytes: int | None = None
    peak_gpu_memory_bytes: int | None = None


# --------------------------------------------------------------------------------------------- helpers


def tree_cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds (user + system) used so far by process ``pid`` and all its live descendants, plus
    the children they already reaped (psutil ``cpu_times``). ``None`` when ``pid`` is gone."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def parse_visible_devices(value: str | None) -> tuple[list[int] | None, list[str] | None]:
    """``CUDA_VISIBLE_DEVICES`` → (indices, UUIDs): ``None`` value = every device ``(None, None)``;
    ``""`` or ``-1`` = no device ``([], [])``; ``0,2`` = indices; ``GPU-…``/``MIG-…`` = UUIDs. As CUDA
    does, the list stops at the first entry it cannot read. Indices are NVML's (PCI bus order): they
    match CUDA's only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (CUDA's default order is fastest first)."""
    if value is None:
        return None, None
    idx: list[int] = []
    uuids: list[str] = []
    for part in (p.strip() for p in value.split(",")):
        if part.lstrip("-").isdigit():
            if int(part) < 0:
                break
            idx.append(int(part))
        elif part.startswith(("GPU-", "MIG-")):
            uuids.append(part)
        else:
            break
    return idx, uuids


def visible_devices_of(cand: Any) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` the candidate's engine runs with: its settings' ``env`` when that
    sets it, else servelab's own environment (a launched engine inherits it); ``None`` = unset."""
    env = getattr(getattr(cand, "settings", None), "env", None)
    if isinstance(env, Mapping) and "CUDA_VISIBLE_DEVICES" in env:
        return str(env["CUDA_VISIBLE_DEVICES"])
    return os.environ.get("CUDA_VISIBLE_DEVICES")


class Nvml:
    """NVML (nvidia-ml-py's ``pynvml``) opened once for a candidate: :attr:`info` says whether GPU
    telemetry is taken and why not; :meth:`sample` reads every watched device. ``visible``: the
    candidate's ``CUDA_VISIBLE_DEVICES`` (:func:`parse_visible_devices`). Never raises."""

    def __init__(self, visible: str | None = None) -> None:
        self.info = GpuInfo(present=False)  # said in the record even when false (exclude_unset)
        self._nv: Any = None
        self._handles: list[tuple[int, Any]] = []
        try:
            import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no stubs
        except ImportError:
            self.info.reason = "NVML: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            self.info.reason = (
                "NVML: libnvidia-ml.so.1 not found (no NVIDIA driver on this host): GPU "
                "memory, utilisation and power not measured"
            )
            return
        except pynvml.NVMLError as e:
            self.info.reason = f"NVML: {e}"
            return
        self._nv = pynvml
        try:
            self.info.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
            idx, uuids = parse_visible_devices(visible)
            self.info.selected_by = "all" if idx is None else f"CUDA_VISIBLE_DEVICES={visible}"
            devices: list[GpuDevice] = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(pynvml.nvmlDeviceGetUUID(h))
                if idx is not None and i not in idx and uuid not in (uuids or []):
                    continue
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                devices.append(
                    GpuDevice(
                        index=i, name=_text(pynvml.nvmlDeviceGetName(h)), uuid=uuid, memory_total_bytes=int(mem.total)
                    )
                )
                self._handles.append((i, h))
            self.info.devices = devices
        except pynvml.NVMLError as e:
            self.info.reason = f"NVML: {e}"
            self._handles = []
            return
        self.info.present = bool(self._handles)
        if not self._handles:
            self.info.reason = (
                f"NVML: no device matches CUDA_VISIBLE_DEVICES={visible!r}"
                if visible is not None
                else "NVML: the driver lists no GPU"
            )

    def sample(self) -> list[GpuSample]:
        """One :class:`GpuSample` per watched device (a figure NVML refuses is ``None``)."""
        nv = self._nv
        out = []
        for i, h in self._handles:
            s = GpuSample(index=i)
            for field, read in (
                ("memory_used_bytes", lambda h: int(nv.nvmlDeviceGetMemoryInfo(h).used)),
                ("utilization_pct", lambda h: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
                ("power_w", lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ):
                with contextlib.suppress(nv.NVMLError):
                    setattr(s, field, read(h))
            out.append(s)
        return out

    def close(self) -> None:
        """``nvmlShutdown`` (once per :class:`Nvml` that opened it)."""
        if self._nv is not None:
            with contextlib.suppress(self._nv.NVMLError):
                self._nv.nvmlShutdown()
            self._nv = None


def host_gpus() -> JsonObject | None:
    """The host's NVIDIA GPUs for the record's ``environment.gpu``: ``{"driver_version", "devices":
    [{"index", "name", "uuid", "memory_total_bytes"}]}`` (NVML), ``None`` when there is none (the
    reason is in each candidate's ``telemetry.gpu``)."""
    nv = Nvml(None)
    try:
        if not nv.info.present:
            return None
        return {
            "driver_version": nv.info.driver_version,
            "devices": [d.model_dump(mode="json") for d in nv.info.devices],
        }
    finally:
        nv.close()


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _fig(vals: list[float]) -> ServerFigure | None:
    return ServerFigure(mean=sum(vals) / len(vals), max=max(vals)) if vals else None


def _series_sum(s: TelemetrySample, name: str) -> float | None:
    vals = [v for k, v in s.metrics.items() if k.split("{")[0] == name]
    return sum(vals) if vals else None


class UrlTarget:
    """A server servelab did not start, as the sampler reads it: ``read_metrics`` scrapes
    ``<server root>/metrics`` (``base_url`` without its trailing ``/v1``), with ``api_key`` as a
    bearer token; no process (``pid`` ``None``, ``rss_bytes`` 0)."""

    pid: int | None = None

    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        root = base_url.rstrip("/")
        self.root_url = root[:-3] if root.endswith("/v1") else root
        self.api_key = api_key

    def rss_bytes(self) -> int:
        """0: a server servelab did not start has no process here to read."""
        return 0

    def read_metrics(self, timeout_s: float = 10.0) -> dict[str, float]:
        """``{series: value}`` of the server's Prometheus page. Raises :class:`RuntimeError` on a
        non-200 answer and :class:`OSError` when the server does not answer."""
        import urllib.error
        import urllib.request

        from servelab.wire.prometheus import parse_prometheus_text

        hdrs = {"Accept": "text/plain"} | ({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})
        req = urllib.request.Request(self.root_url + "/metrics", headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{self.root_url}/metrics answered HTTP {e.code}") from e
        return parse_prometheus_text(body.decode("utf-8", "replace"))


def start_sampler(cand: Any, running: Any, base_url: str, api_key: str | None, path: Path) -> MetricsSampler:
    """Start the :class:`MetricsSampler` of a trial candidate: on the engine servelab launched
    (``running``: process tree and NVML on the candidate's devices) or, for a server it did not start,
    on its URL (``/metrics`` only; GPU telemetry is absent: the server may run on another host)."""
    if running is not None:
        s = MetricsSampler(running, path, metrics=cand.kind.metrics, visible_devices=visible_devices_of(cand))
    else:
        s = MetricsSampler(
            UrlTarget(base_url, api_key),
            path,
            metrics=cand.kind.metrics,
            gpu=False,
            no_gpu_reason="not launched by servelab: its process and GPUs may be on another host, "
            "only its /metrics is read",
        )
    s.start()
    return s


# --------------------------------------------------------------------------------------------- sampler


class MetricsSampler(threading.Thread):
    """Samples a running engine every ``interval_s`` seconds while load steps run (see the module doc).

    ``engine``: the :class:`~servelab.engines.running.RunningEngine` (``rss_bytes()``, ``read_metrics()``,
    ``pid``; the reliability watch replaces it after a restart); ``path``: the JSONL file appended to;
    ``metrics``: the kind's names (default: every registered kind's); ``visible_devices``: the
    candidate's ``CUDA_VISIBLE_DEVICES`` (``None`` = all devices); ``gpu``: ``False`` skips NVML (the
    telemetry then says ``no_gpu_reason``)."""

    def __init__(
        self,
        engine: Any,
        path: Path,
        interval_s: float = 1.0,
        metrics: registry.ServerMetrics | None = None,
        visible_devices: str | None = None,
        gpu: bool = True,
        no_gpu_reason: str = "GPU sampling off",
    ) -> None:
        super().__init__(daemon=True)
        self.engine, self.path, self.interval_s = engine, path, interval_s
        self.metrics = metrics if metrics is not None else registry.all_metrics()
        self._gen = generation_counters()
        self._keep = self.metrics.names() | set(self._gen)  # only the kind's names (and token counters)
        self.step: str | None = None
        self.samples: list[TelemetrySample] = []
        self.peak_rss_bytes = 0
        self.nvml = Nvml(visible_devices) if gpu else None
        self.no_gpu_reason = no_gpu_reason
        self._stop_evt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        with open(self.path, "ab") as f:
            while not self._stop_evt.wait(self.interval_s):
                self.sample(f)

    def sample(self, f: Any) -> None:
        """Take one sample now and append it to ``f`` (also used at step boundaries)."""
        eng = self.engine
        try:
            rss = int(eng.rss_bytes())
        except Exception:  # noqa: BLE001 — the engine may be gone
            rss = 0
        pid = getattr(eng, "pid", None)
        cpu = tree_cpu_seconds(pid)
        try:
            m = eng.read_metrics(timeout_s=2.0)
        except Exception:  # noqa: BLE001 — no /metrics, or the engine died: keep going
            m = {}
        keep = {k: v for k, v in m.items() if k.split("{")[0] in self._keep}
        gpus = self.nvml.sample() if self.nvml is not None else []
        with self._lock:
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            s = TelemetrySample(
                t_unix_s=time.time(), step=self.step, rss_bytes=rss, pid=pid, cpu_s=cpu, metrics=keep, gpus=gpus
            )
            self.samples.append(s)
            f.write(s.to_json_bytes() + b"\n")
            f.flush()

    def boundary(self, step: str | None) -> None:
        """Label later samples ``step`` and take one sample now: called at a measured step's start and end,
        so a step shorter than ``interval_s`` still has a first and a last sample (counter increases
        then span the whole step)."""
        self.step = step
        with open(self.path, "ab") as f:
            self.sample(f)

    def stop(self) -> None:
        """Stop polling, wait for the thread and close NVML."""
        self._stop_evt.set()
        if self.is_alive():
            self.join(timeout=5)
        if self.nvml is not None:
            self.nvml.close()

    def _by_step(self) -> dict[str, list[TelemetrySample]]:
        by: dict[str, list[TelemetrySample]] = {}
        for s in self.samples:
            if s.step:
                by.setdefault(s.step, []).append(s)
        return by

    def per_step(self) -> dict[str, dict[str, ServerFigure]]:
        """``{step_label: {metric: ServerFigure}}`` over the samples of each step: gauges ``mean``/``max``,
        counters ``increase`` over ``span_s``; ``rss_bytes`` its ``max`` (when a process was read)."""
        out: dict[str, dict[str, ServerFigure]] = {}
        for step, ss in self._by_step().items():
            agg: dict[str, ServerFigure] = {}
            names = {k for s in ss for k in s.metrics}
            for k in sorted(names):
                vals = [s.metrics[k] for s in ss if k in s.metrics]
                base = k.split("{")[0]
                if base in self.metrics.counters or base in self._gen:
                    agg[k] = ServerFigure(increase=vals[-1] - vals[0], span_s=ss[-1].t_unix_s - ss[0].t_unix_s)
                else:
                    agg[k] = ServerFigure(mean=sum(vals) / len(vals), max=max(vals))
            if any(s.rss_bytes for s in ss):  # a server servelab did not start has no RSS here
                agg["rss_bytes"] = ServerFigure(max=max(s.rss_bytes for s in ss))
            out[step] = agg
        return out

    def telemetry(self, steps: Iterable[StepSummary | None] = ()) -> Telemetry:
        """The typed :class:`Telemetry` of the samples so far; ``steps``: the candidate's step summaries
        (for the client's output tokens; a step without one has no :attr:`StepTelemetry.tokens`)."""
        by_label = {st.label: st for st in steps if st is not None and not st.skipped}
        out = Telemetry(
            interval_s=self.interval_s,
            cpu_cores=psutil.cpu_count(logical=True),
            process_tree=any(s.cpu_s is not None for s in self.samples),
            gpu=self.nvml.info if self.nvml is not None else GpuInfo(reason=self.no_gpu_reason),
        )
        # assigned, not filled in place: the record is written with exclude_unset
        out.steps = {label: self._step(ss, by_label.get(label)) for label, ss in self._by_step().items()}
        rss = [s.rss_bytes for s in self.samples if s.rss_bytes]
        out.peak_rss_bytes = max(rss) if rss else None
        gpu_tot = [sum(g.memory_used_bytes or 0 for g in s.gpus) for s in self.samples if s.gpus]
        out.peak_gpu_memory_bytes = max(gpu_tot) if gpu_tot else None
        return out

    def _gauges(self, ss: list[TelemetrySample]) -> registry.ServerMetrics:
        """The kind's running/waiting/KV names; for a table that names none (a server of unknown make,
        the mock), the first known engine's whose running gauge is in the samples."""
        if self.metrics.running is not None:
            return self.metrics
        from servelab.engines.url import SGLANG_METRICS, TGI_METRICS

        seen = {k.split("{")[0] for s in ss for k in s.metrics}
        known = [k.metrics for k in registry.kinds()] + [
            SGLANG_METRICS,
            TGI_METRICS,
            registry.ServerMetrics(running="mock_requests_running"),
        ]
        return next((k for k in known if k.running in seen), self.metrics)

    def _step(self, ss: list[TelemetrySample], st: StepSummary | None) -> StepTelemetry:
        span = ss[-1].t_unix_s - ss[0].t_unix_s
        out = StepTelemetry(samples=len(ss), span_s=round(span, 3))
        cpu = wall = 0.0
        for a, b in zip(ss, ss[1:], strict=False):  # only pairs of the same process (a restart resets it)
            if a.cpu_s is not None and b.cpu_s is not None and a.pid == b.pid:
                cpu += max(0.0, b.cpu_s - a.cpu_s)
                wall += b.t_unix_s - a.t_unix_s
        if wall > 0:
            out.cpu_percent = round(100.0 * cpu / wall, 2)
        rss = [s.rss_bytes for s in ss if s.rss_bytes]
        if rss:
            out.rss_max_bytes, out.rss_mean_bytes = max(rss), sum(rss) / len(rss)
        m = self._gauges(ss)
        for field, name in (("running", m.running), ("waiting", m.waiting), ("kv_usage", m.kv_usage)):
            if name:
                setattr(out, field, _fig([v for s in ss if (v := _series_sum(s, name)) is not None]))
        for counter in self._gen:
            first, last = _series_sum(ss[0], counter), _series_sum(ss[-1], counter)
            if first is None or last is None:
                continue
            if st is not None:
                client = st.tokens.output_total
                server = last - first
                out.tokens = TokenAgreement(
                    counter=counter,
                    server_output_tokens=server,
                    client_output_tokens=client,
                    server_output_tokens_per_s=round(server / span, 3) if span > 0 else None,
                    client_output_tokens_per_s=round(client / st.window_s, 3) if st.window_s else None,
                    diff_pct=round(100.0 * (server - client) / client, 3) if client else None,
                    client_failed=st.counts.failed_total,
                )
            break
        devices = sorted({g.index for s in ss for g in s.gpus})
        gpus: list[GpuStep] = []
        for i in devices:
            gs = [g for s in ss for g in s.gpus if g.index == i]
            mem = [g.memory_used_bytes for g in gs if g.memory_used_bytes is not None]
            util = [g.utilization_pct for g in gs if g.utilization_pct is not None]
            pw = [g.power_w for g in gs if g.power_w is not None]
            gpus.append(
                GpuStep(
                    index=i,
                    memory_used_max_bytes=max(mem) if mem else None,
                    memory_used_mean_bytes=sum(mem) / len(mem) if mem else None,
                    utilization_mean_pct=sum(util) / len(util) if util else None,
                    utilization_max_pct=max(util) if util else None,
                    power_mean_w=sum(pw) / len(pw) if pw else None,
                    power_max_w=max(pw) if pw else None,
                )
            )
        if gpus:
            out.gpus = gpus
        return out
