"""What ``servelab plan`` answers (:class:`CapacityPlan`): the layout, the memory on the fullest device by
part (:class:`DeviceMemory`), the KV pool and the sequences it holds, the speeds, and the tables and text
the command prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelab.catalog.models import ModelEntry
from servelab.plan.layouts import Layout
from servelab.plan.llamacpp import LlamaCppMemory
from servelab.plan.pitfalls import Speculative
from servelab.plan.roofline import Roofline

__all__ = ["GIB", "CapacityPlan", "DeviceMemory"]

GIB = 1024**3


@dataclass
class DeviceMemory:
    """Bytes on the fullest device, by part."""

    weights_by_part: dict[str, float]
    kv_pool_bytes: float
    kv_needed_bytes: float
    activation_bytes: float
    graph_bytes: float
    comm_bytes: float
    reserve_bytes: float
    capacity_bytes: float
    estimates: list[str] = field(default_factory=list)

    @property
    def weights_bytes(self) -> float:
        """Sum of the weight parts."""
        return sum(self.weights_by_part.values())

    @property
    def needed_bytes(self) -> float:
        """Memory the plan needs at the requested concurrency and context."""
        return (
            self.weights_bytes
            + self.kv_needed_bytes
            + self.activation_bytes
            + self.graph_bytes
            + self.comm_bytes
            + self.reserve_bytes
        )


@dataclass
class CapacityPlan:
    """Result of :func:`estimate`. ``fits``: weights + activations fit and the KV pool holds
    ``concurrency`` sequences of ``context_tokens``. ``max_concurrent_sequences``: over all DP
    replicas at ``context_tokens`` (None when no cache limits it). ``reasons``: why it does not fit.
    ``smallest_layout``: when it does not fit, the smallest layout of this hardware that would (or None)."""

    model: ModelEntry
    hardware_name: str
    count: int
    layout: Layout
    engine: str
    precision: str
    kv_precision: str
    context_tokens: int
    concurrency: int
    device: DeviceMemory
    state_per_sequence: dict[str, float]
    max_concurrent_sequences: int | None
    fits: bool
    reasons: list[str]
    roofline: Roofline
    notes: list[str]
    llamacpp: LlamaCppMemory | None = None
    smallest_layout: Layout | None = None
    warnings: list[str] = field(default_factory=list)
    speculative: Speculative | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able plan (bytes as numbers; GiB views rounded to 3 decimals)."""
        d = self.device
        out: dict[str, Any] = {
            "model": self.model.name,
            "hardware": self.hardware_name,
            "count": self.count,
            "layout": self.layout.as_dict(),
            "engine": self.engine,
            "precision": self.precision,
            "kv_precision": self.kv_precision,
            "context_tokens": self.context_tokens,
            "concurrency": self.concurrency,
            "fits": self.fits,
            "reasons": self.reasons,
            "per_device": {
                "weights_by_part_bytes": d.weights_by_part,
                "weights_bytes": d.weights_bytes,
                "kv_needed_bytes": d.kv_needed_bytes,
                "kv_pool_bytes": d.kv_pool_bytes,
                "activation_bytes": d.activation_bytes,
                "cuda_graph_bytes": d.graph_bytes,
                "communication_bytes": d.comm_bytes,
                "runtime_reserve_bytes": d.reserve_bytes,
                "needed_bytes": d.needed_bytes,
                "capacity_bytes": d.capacity_bytes,
                "needed_gib": round(d.needed_bytes / GIB, 3),
                "capacity_gib": round(d.capacity_bytes / GIB, 3),
                "estimated_parts": d.estimates,
            },
            "state_per_sequence": self.state_per_sequence,
            "max_concurrent_sequences": self.max_concurrent_sequences,
            "roofline": self.roofline.as_dict(),
            "notes": self.notes,
            "warnings": self.warnings,
            "speculative": self.speculative.as_dict(self.context_tokens) if self.speculative else None,
            "smallest_fitting_layout": self.smallest_layout.as_dict() if self.smallest_layout else None,
        }
        if self.llamacpp is not None:
            out["llamacpp"] = self.llamacpp.as_dict()
        return out

    def render(self) -> Any:
        """A rich renderable: the per-device memory table, the verdict, and the roofline floors."""
        from rich.console import Group, RenderableType
        from rich.table import Table
        from rich.text import Text

        d = self.device
        t = Table(
            title=f"{self.model.display_name} on {self.count} x {self.hardware_name}, {self.layout}, "
            f"{self.engine}, weights {self.precision}, KV {self.kv_precision}",
            title_justify="left",
        )
        t.add_column("per device (fullest)")
        t.add_column("GiB", justify="right")
        t.add_column("how")
        for part, b in d.weights_by_part.items():
            if b:
                t.add_row(f"weights: {part}", f"{b / GIB:.3f}", "params x bytes/weight, sharded by layout")
        spec = self.speculative
        t.add_row(
            "KV / state needed",
            f"{d.kv_needed_bytes / GIB:.3f}",
            f"{self.concurrency} seq x {self.context_tokens} tokens, per attention kind"
            + (f", + {spec.layers} {spec.method} layer(s)" if spec else ""),
        )
        t.add_row(
            "activations (prefill peak)",
            f"{d.activation_bytes / GIB:.3f}",
            "estimate" if self.engine != "llamacpp" else "llama.cpp compute + output buffers",
        )
        if d.graph_bytes:
            t.add_row("CUDA graphs", f"{d.graph_bytes / GIB:.3f}", "estimate")
        if d.comm_bytes:
            t.add_row("communication buffers", f"{d.comm_bytes / GIB:.3f}", "estimate")
        if d.reserve_bytes:
            t.add_row("runtime reserve", f"{d.reserve_bytes / GIB:.3f}", "outside the engine's budget")
        t.add_row("needed", f"{d.needed_bytes / GIB:.3f}", "")
        t.add_row("device memory", f"{d.capacity_bytes / GIB:.3f}", "")
        seqs = self.max_concurrent_sequences if self.max_concurrent_sequences is not None else "not cache-bound"
        verdict = Text(
            ("FITS" if self.fits else "DOES NOT FIT")
            + f": max concurrent sequences at {self.context_tokens} tokens = {seqs}",
            style="bold green" if self.fits else "bold red",
        )
        lines: list[RenderableType] = [t, verdict]
        for r in self.reasons:
            lines.append(Text(f"  - {r}"))
        if not self.fits:
            lines.append(
                Text(
                    f"  smallest layout that fits: {self.smallest_layout} "
                    f"({self.smallest_layout.devices} x {self.hardware_name})"
                    if self.smallest_layout
                    else "  no layout of this hardware up to 64 devices fits"
                )
            )
        for w in self.warnings:
            lines.append(Text(f"warning: {w}", style="yellow"))
        roof = self.roofline
        rt = Table(title="roofline floors (no engine beats these)", title_justify="left")
        rt.add_column("quantity")
        rt.add_column("value", justify="right")
        rt.add_row("TPOT floor at this concurrency", f"{roof.decode_step_s * 1e3:.2f} ms")
        rt.add_row("tokens/s per sequence (max)", f"{roof.per_sequence_tokens_per_s:.1f}")
        rt.add_row("tokens/s aggregate (max)", f"{roof.aggregate_tokens_per_s * self.layout.dp:.1f}")
        rt.add_row(
            "prefill of one prompt (min)",
            f"{roof.prefill_s:.3f} s" if roof.prefill_s is not None else "unknown peak FLOP/s",
        )
        lines.append(rt)
        if self.llamacpp is not None:
            lines.append(_llamacpp_table(self.llamacpp, self.kv_precision))
        for n in self.notes:
            lines.append(Text(f"note: {n}", style="dim"))
        return Group(*lines)


def _llamacpp_table(llm: LlamaCppMemory, kv_precision: str) -> Any:
    """The allocation as llama-server logs it at start with ``-lv 4`` (``llama_kv_cache: size = …``,
    the memory breakdown), so the two can be compared line by line."""
    from rich.table import Table

    mib = 1024.0**2
    t = Table(
        title=f"llama-server at start: -c {llm.n_ctx} -np {llm.n_seq}{' -kvu' if llm.kv_unified else ''} "
        f"(n_ctx_seq = {llm.n_ctx_seq}, {llm.n_stream} KV stream{'s' if llm.n_stream != 1 else ''})",
        title_justify="left",
    )
    t.add_column("buffer")
    t.add_column("MiB", justify="right")
    t.add_column("cells x layers x streams")
    if llm.layers_base:
        t.add_row(
            "KV cache (non-SWA)",
            f"{llm.kv_base_bytes / mib:.2f}",
            f"{llm.cells_base} x {llm.layers_base} x {llm.n_stream}, K and V {kv_precision}",
        )
    if llm.layers_swa:
        t.add_row(
            "KV cache (SWA)",
            f"{llm.kv_swa_bytes / mib:.2f}",
            f"{llm.cells_swa} x {llm.layers_swa} x {llm.n_stream}, K and V {kv_precision}",
        )
    if llm.layers_recurrent:
        t.add_row("recurrent state", f"{llm.recurrent_bytes / mib:.2f}", f"{llm.layers_recurrent} layers")
    t.add_row("model", f"{llm.model_bytes / mib:.2f}", "weights (the GGUF tensor table when a file is given)")
    t.add_row("context", f"{llm.context_bytes / mib:.2f}", "all caches (the memory breakdown's 'context')")
    t.add_row("compute", f"{llm.compute_bytes / mib:.2f}", "graph buffer (fitted estimate)")
    t.add_row("output", f"{llm.output_bytes / mib:.2f}", "logits buffer (not in llama-server's table)")
    return t
