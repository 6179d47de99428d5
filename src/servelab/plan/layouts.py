"""Parallel layouts (TP x PP x DP, optional EP) and their validation against a model.

TP splits each layer's heads and FFN columns, so it must divide the attention heads; KV heads are
split when TP divides them and replicated when TP is a multiple of them (vLLM's rule: "the number of
attention heads must be divisible by tensor parallel size"; KV heads may be replicated,
https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html, read 2026-11-30). PP gives each stage
``ceil(L/pp)`` layers. EP spreads whole experts over ``ep`` devices of a replica (vLLM: EP size =
TP x DP of the MoE layers; here ``ep`` must divide ``tp * dp`` and the expert count). DP is replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.catalog.models import ModelEntry
from servelab.wire.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    """``tp * pp * dp`` devices; ``ep`` (None = experts sharded by TP like dense layers)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int | None = None

    @property
    def devices(self) -> int:
        """Devices the layout uses."""
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        s = f"TP{self.tp} x PP{self.pp} x DP{self.dp}"
        return s + (f" (EP{self.ep})" if self.ep else "")

    def as_dict(self) -> dict[str, int | None]:
        """JSON-able view."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "devices": self.devices}


def _divisors_hint(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0 and d <= 64)


def validate_layout(model: ModelEntry, layout: Layout, count: int | None = None) -> None:
    """Raise :class:`ConfigError` (one line naming the fix) when ``layout`` cannot run ``model``:
    a size < 1, TP not dividing the attention heads, TP neither dividing nor a multiple of the KV
    heads, PP above the layer count, EP on a dense model or not dividing experts / TP*DP, or more
    devices than ``count``."""
    for name, v in (("tp", layout.tp), ("pp", layout.pp), ("dp", layout.dp)):
        if v < 1:
            raise ConfigError(f"--{name} must be >= 1, got {v}")
    a = model.architecture
    heads = a.attention.num_heads if a.attention else (a.mla.num_heads if a.mla else None)
    if heads and heads % layout.tp:
        raise ConfigError(
            f"TP {layout.tp} does not divide the {heads} attention heads of {model.name}; "
            f"use --tp one of {_divisors_hint(heads)}"
        )
    if a.attention and layout.tp > 1:
        kv = a.attention.num_kv_heads
        if kv % layout.tp and layout.tp % kv:
            raise ConfigError(
                f"TP {layout.tp} neither divides nor is a multiple of the {kv} KV heads of {model.name}; "
                f"use --tp one of {_divisors_hint(heads or kv)} that is a divisor or multiple of {kv}"
            )
    if a.ssm and a.ssm.num_heads % layout.tp:
        raise ConfigError(f"TP {layout.tp} does not divide the {a.ssm.num_heads} Mamba heads of {model.name}")
    if layout.pp > a.num_layers:
        raise ConfigError(f"PP {layout.pp} is more stages than the {a.num_layers} layers of {model.name}")
    if layout.ep is not None:
        if a.moe is None:
            raise ConfigError(f"--ep {layout.ep} given but {model.name} has no MoE layers; drop --ep")
        if layout.ep < 1 or a.moe.num_experts % layout.ep:
            raise ConfigError(f"EP {layout.ep} does not divide the {a.moe.num_experts} experts of {model.name}")
        if (layout.tp * layout.dp) % layout.ep:
            raise ConfigError(
                f"EP {layout.ep} must divide TP x DP = {layout.tp * layout.dp} (experts are spread "
                "over the devices of the MoE layers)"
            )
    if count is not None and layout.devices > count:
        raise ConfigError(
            f"layout {layout} needs {layout.devices} devices but --hardware gives {count}; "
            f"raise the count (H:{layout.devices}) or lower --tp/--pp/--dp"
        )


def candidate_layouts(model: ModelEntry, max_devices: int, per_node: int) -> list[Layout]:
    """Valid layouts with 1..``max_devices`` devices, fewest devices first.

    The model-parallel group (TP x PP) is a power of two with TP inside one node (``per_node``), as
    deployments size it; DP replicas come in any number, since requests are spread over them and each
    replica holds ``1/dp`` of the sequences (12 GPUs as TP4 x DP3 is a deployment; TP3 or PP3 rarely).
    Among layouts of one size: no PP before PP (PP adds a pipeline bubble and cross-node hops), then
    smaller TP (more independent replicas, less all-reduce traffic) first.
    """
    out: list[Layout] = []
    pows = [1 << i for i in range(7)]  # 1 .. 64
    for n in range(1, max_devices + 1):
        for pp in pows:
            for tp in pows:
                if tp > per_node or n % (tp * pp):
                    continue
                lay = Layout(tp=tp, pp=pp, dp=n // (tp * pp))
                try:
                    validate_layout(model, lay)
                except ConfigError:
                    continue
                out.append(lay)
    return out


def default_layout(model: ModelEntry, count: int, pp: int = 1, dp: int = 1) -> tuple[Layout, str | None]:
    """The layout ``servelab plan`` uses when ``--tp`` is not given: TP over all ``count / (pp*dp)``
    devices when the model allows it, else the largest TP the model allows that divides that count,
    with the remaining devices as extra DP replicas (3 GPUs for a 32-head model: TP1 x DP3, not an
    error about a TP 3 nobody asked for). Returns (layout, a note saying what was chosen, or None)."""
    group = max(1, count // max(1, pp * dp))
    for tp in range(group, 0, -1):
        if group % tp:
            continue
        lay = Layout(tp=tp, pp=pp, dp=dp * (group // tp))
        try:
            validate_layout(model, lay)
        except ConfigError:
            continue
        if tp == group:
            return lay, None
        return lay, (
            f"TP{group} is not possible for {model.name} (heads do not divide); using {lay} on the "
            f"{count} devices (pass --tp/--dp to choose)"
        )
    return Layout(tp=group, pp=pp, dp=dp), None  # validate_layout names the problem
