"""``servelab plan``: capacity plan of a model on hardware (memory by part, fit, max concurrency, floors)."""

from __future__ import annotations

import json
import re

import typer

from servelab.wire.errors import ConfigError

_TOKENS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_tokens(text: str | int, what: str = "--context") -> int:
    """A token count: ``"32k"`` -> 32768, ``"1m"`` -> 1048576, ``"5000"`` -> 5000 (k = 1024 tokens, as
    context sizes are quoted: "32k context" = 32768); an int is taken as is. Raises ConfigError (one
    line naming ``what``) for anything else or a value < 1."""
    if isinstance(text, int):
        n = text
    else:
        m = _TOKENS.match(str(text))
        if not m:
            raise ConfigError(f"{what} {text!r} is not a token count; write e.g. 8192, 32k or 1m")
        mult = {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
        n = int(float(m.group(1)) * mult)
    if n < 1:
        raise ConfigError(f"{what} {text!r}: must be at least 1 token")
    return n


def parse_hardware(text: str) -> tuple[str, int]:
    """``"H100-80GB-SXM:8"`` -> (name, 8); no ``:N`` means 1. Raises ConfigError for a bad count."""
    name, _, n = text.partition(":")
    if not name:
        raise ConfigError("--hardware needs a name, e.g. H100-80GB-SXM:8 (list: `servelab catalog hardware`)")
    if not n:
        return name, 1
    if not n.isdigit() or int(n) < 1:
        raise ConfigError(f"--hardware {text!r}: the count after ':' must be a whole number >= 1")
    return name, int(n)


def plan_command(
    model: str = typer.Option(
        ..., "--model", help="catalog name/alias, a config.json (or its folder), or a .gguf file"
    ),
    hardware: str = typer.Option(..., "--hardware", help="catalog hardware name, optionally :COUNT (H100-80GB-SXM:8)"),
    context: str = typer.Option("8192", "--context", help="tokens per sequence (prompt + output): 8192, 32k ..."),
    concurrency: int = typer.Option(1, "--concurrency", help="concurrent sequences to hold"),
    precision: str = typer.Option(
        "bf16", "--precision", help="weights: bf16, fp8, int8, int4, mxfp4, nvfp4, q4_k_m ..., native"
    ),
    kv_precision: str | None = typer.Option(
        None, "--kv-precision", help="KV cache: bf16/fp16/fp8 (llama.cpp: f16, q8_0, q4_0)"
    ),
    tp: int | None = typer.Option(None, "--tp", help="tensor parallel size (default: all devices / (pp*dp))"),
    pp: int = typer.Option(1, "--pp", help="pipeline parallel stages"),
    ep: int | None = typer.Option(None, "--ep", help="expert parallel size (MoE)"),
    dp: int = typer.Option(1, "--dp", help="data parallel replicas"),
    engine: str = typer.Option("vllm", "--engine", help="vllm | sglang | llamacpp (how KV is allocated)"),
    parallel: int | None = typer.Option(None, "--parallel", help="llama.cpp -np slots (default: --concurrency)"),
    ctx_size: int | None = typer.Option(
        None, "--ctx-size", help="llama.cpp -c total tokens (default: context x parallel)"
    ),
    kv_unified: bool = typer.Option(False, "--kv-unified", help="llama.cpp -kvu (one KV buffer shared by all slots)"),
    gpu_memory_utilization: float | None = typer.Option(
        None, "--gpu-memory-utilization", help="engine budget fraction (warns above 0.95)"
    ),
    speculative: str | None = typer.Option(
        None,
        "--speculative",
        help="count speculative decoding: mtp (the catalog's MTP module) or draft (with --draft-model)",
    ),
    draft_model: str | None = typer.Option(
        None,
        "--draft-model",
        help="draft model for speculative decoding (catalog name, config.json "
        "or .gguf): its weights and KV are counted",
    ),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
) -> None:
    """Plan memory by part per device, whether it fits, the max concurrent sequences and roofline floors.
    Exit status: 0 fits, 1 does not fit (the plan is still printed), 2 bad input."""
    from servelab.plan.estimate import estimate

    name, count = parse_hardware(hardware)
    plan = estimate(
        model,
        name,
        count,
        parse_tokens(context),
        concurrency,
        precision=precision,
        kv_precision=kv_precision,
        tp=tp,
        pp=pp,
        ep=ep,
        dp=dp,
        engine=engine,
        parallel=parallel,
        ctx_size=ctx_size,
        kv_unified=kv_unified,
        gpu_memory_utilization=gpu_memory_utilization,
        speculative=speculative,
        draft_model=draft_model,
    )
    if as_json:
        typer.echo(json.dumps(plan.to_dict(), indent=1, default=str))
    else:
        from rich.console import Console

        Console().print(plan.render())
    if not plan.fits:
        raise typer.Exit(1)
