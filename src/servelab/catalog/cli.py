"""``servelab catalog engines|models|hardware [--json] [--lifecycle]``: print the catalogs as rich
tables, or as JSON (``--json``: a list of entries, every field, dates as ``YYYY-MM-DD``)."""

from __future__ import annotations

import json
import shutil
from typing import Any

import typer

catalog_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The engine, model and hardware catalogs servelab selects from "
    "(every row with its source URL and the date it was checked).",
)

_JSON = typer.Option(False, "--json", help="Print JSON (a list of entries with every field) instead of a table.")


def console() -> Any:
    """A rich Console at least 160 columns wide (wider terminals keep their width), so tables stay
    readable when the output is piped or captured."""
    from rich.console import Console

    return Console(width=max(160, shutil.get_terminal_size((160, 40)).columns))


def _dump(entries: list[Any]) -> None:
    typer.echo(json.dumps([e.model_dump(mode="json") for e in entries], indent=2, ensure_ascii=False))


def _yes(flag: bool | None) -> str:
    return {True: "yes", False: "no", None: "?"}[flag]


_FEATURE_SHORT = {
    "continuous_batching": "CB",
    "prefix_cache": "prefix",
    "structured_output": "json",
    "tool_calling": "tools",
    "lora": "LoRA",
    "speculative_decoding": "spec",
    "mtp": "MTP",
    "tp": "TP",
    "pp": "PP",
    "ep": "EP",
    "dp": "DP",
    "openai_api": "OpenAI",
    "metrics_endpoint": "metrics",
}


def feature_summary(entry: Any) -> str:
    """Short names of the features an engine entry documents (``CB prefix json tools … OpenAI``)."""
    f = entry.features.model_dump()
    return " ".join(short for key, short in _FEATURE_SHORT.items() if f.get(key) is True)


def lifecycle_text(entry: Any) -> str:
    """``active``, or ``archived since 2026-03-21: not for new platforms``."""
    lc = entry.lifecycle
    if lc.for_new_platforms:
        return "active"
    since = f" since {lc.since}" if lc.since else ""
    return f"{lc.status}{since}: not for new platforms"


@catalog_app.command("engines")
def engines_command(
    as_json: bool = _JSON,
    lifecycle: bool = typer.Option(
        False,
        "--lifecycle",
        help="Show each project's maintenance state: whether a "
        "new platform may start on it, since when, and the "
        "source that says so.",
    ),
) -> None:
    """Inference engines, pipeline libraries and serving platforms (000 §1–§4): stack layers, tasks,
    input → output modalities, platforms, features, lifecycle."""
    from rich.table import Table

    from servelab.catalog.engines import load_engines

    engines = load_engines()
    if as_json:
        _dump(engines)
        return
    if lifecycle:
        t = Table(title="engine lifecycle (a project that is not active is not for new platforms)")
        for col in ("engine", "status", "since", "new platforms", "note", "source", "checked"):
            t.add_column(col, overflow="fold")
        for e in sorted(engines, key=lambda x: (x.lifecycle.for_new_platforms, x.name)):
            lc = e.lifecycle
            t.add_row(
                e.name,
                lc.status,
                str(lc.since or "-"),
                "yes" if lc.for_new_platforms else "NO",
                lc.note or "-",
                lc.source or e.source,
                str(lc.checked or e.checked),
            )
        console().print(t)
        return
    t = Table(title=f"engines ({len(engines)}; `--lifecycle` for maintenance state, `--json` for every field)")
    for col in ("engine", "layers", "tasks", "input → output", "platforms", "features", "lifecycle", "source"):
        t.add_column(col, overflow="fold")
    for e in engines:
        t.add_row(
            e.name,
            ", ".join(e.layers),
            ", ".join(e.tasks),
            f"{'+'.join(e.input_modalities)} → {'+'.join(e.output_modalities)}",
            ", ".join(e.platforms),
            feature_summary(e),
            lifecycle_text(e),
            f"{e.source} ({e.checked})",
        )
    console().print(t)


@catalog_app.command("hardware")
def hardware_command(as_json: bool = _JSON) -> None:
    """GPUs, accelerators, Apple SoCs and CPUs: memory (GiB), bandwidth (GB/s), dense TFLOPS by
    precision, interconnect (GB/s per direction per device). ``*`` marks an estimate."""
    from rich.table import Table

    from servelab.catalog.hardware import load_hardware

    hw = load_hardware()
    if as_json:
        _dump(hw)
        return
    t = Table(title="hardware (dense TFLOPS, no sparsity; * = estimate, see --json notes)")
    for col in ("name", "kind", "memory GiB", "BW GB/s", "bf16", "fp8", "fp4", "interconnect", "aliases", "source"):
        t.add_column(col, overflow="fold")

    def est(h: Any, field: str, text: str) -> str:
        return f"{text}*" if field in h.estimated else text

    for h in hw:
        tf = h.dense_tflops
        bf16 = tf.get("bf16", tf.get("fp16"))
        t.add_row(
            h.name,
            h.kind,
            est(h, "memory_gib", f"{h.memory_gib:g}"),
            est(h, "memory_bandwidth_gbps", f"{h.memory_bandwidth_gbps:g}"),
            est(h, "dense_tflops", "-" if bf16 is None else f"{bf16:g}"),
            "-" if "fp8" not in tf else est(h, "dense_tflops", f"{tf['fp8']:g}"),
            "-" if "fp4" not in tf else f"{tf['fp4']:g}",
            f"{h.interconnect.kind} {h.interconnect.bandwidth_gbps:g}",
            ", ".join(h.aliases),
            f"{h.source} ({h.checked})",
        )
    console().print(t)


@catalog_app.command("models")
def models_command(as_json: bool = _JSON) -> None:
    """Models with the architecture facts capacity planning needs (servelab.catalog.models)."""
    from rich.table import Table

    from servelab.catalog import load_models

    models = load_models()
    if as_json:
        _dump(models)
        return
    t = Table(title=f"models ({len(models)}; `--json` for every field)")
    for col in ("name", "family", "kind", "tasks", "params (total / active)", "max context", "source"):
        t.add_column(col, overflow="fold")
    for m in models:
        p = m.published_params
        params = f"{p.total / 1e9:.3g}B" + (f" / {p.active / 1e9:.3g}B" if p.active else "")
        t.add_row(
            m.name,
            m.family,
            m.kind,
            ", ".join(m.tasks),
            params,
            f"{m.architecture.max_context:,}",
            f"{m.source} ({m.checked})",
        )
    console().print(t)
