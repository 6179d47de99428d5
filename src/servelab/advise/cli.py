"""``servelab advise``: print candidates in evaluation order with reasons, exclusions with reasons,
serving-platform layers, the 000 §5 checklist and the capacity plan; ``--json`` prints the same as one
JSON object; ``--write-experiment FILE`` writes a validated ``servelab trial`` experiment."""

from __future__ import annotations

import json
from typing import Any

import typer


def advise_command(
    task: str = typer.Option(
        ...,
        "--task",
        "-t",
        help="Service type: chat, code, agent (tool calling), rag "
        "(long context), structured, batch, edge (local), vlm, "
        "embedding, rerank, asr, tts, realtime-voice, image-gen, "
        "video-gen (aliases accepted, e.g. tools, stt, t2v).",
    ),
    model: str = typer.Option(
        ...,
        "--model",
        "-m",
        help="Model: a catalog name or alias (`servelab catalog models`), a config.json / its folder, or a .gguf file.",
    ),
    hardware: str = typer.Option(
        ...,
        "--hardware",
        help="NAME[:COUNT] devices of one deployment, e.g. H100-80GB:2, laptop-cpu (`servelab catalog hardware`).",
    ),
    context: str = typer.Option(
        "8k", "--context", help="Tokens per request (prompt + output) to support: 32768, 32k (= 32,768), 1m."
    ),
    concurrency: int = typer.Option(8, "--concurrency", "-c", help="Requests in flight to support."),
    precision: str | None = typer.Option(
        None,
        "--precision",
        help="Weight precision (bf16, fp16, fp8, nvfp4, mxfp4, int8, int4); default: the model's published dtype.",
    ),
    kv_precision: str | None = typer.Option(
        None, "--kv-precision", help="KV cache precision (bf16, fp8, …); default: the planner's."
    ),
    openai_api: bool = typer.Option(False, "--openai-api", help="Require an OpenAI-compatible API."),
    tools: bool = typer.Option(False, "--tools", help="Require tool (function) calling."),
    json_output: bool = typer.Option(False, "--json-output", help="Require structured (JSON-schema) output."),
    local: bool = typer.Option(
        False,
        "--local",
        "--offline",
        help="One local machine with no outside network at run time: single-machine engines first (000 §1 row 6).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    write_experiment: str | None = typer.Option(
        None,
        "--write-experiment",
        help="Write a servelab trial experiment YAML for the candidates to FILE (validated).",
    ),
) -> None:
    """Which engines to verify first for a task, model, hardware and load — and which to leave out, why,
    what is known and what is still to verify (../shared/seeds/000 §1, §5, §11)."""
    from servelab.advise import advise
    from servelab.advise import write_experiment as write_exp

    adv = advise(
        task,
        model,
        hardware,
        context,
        concurrency,
        precision=precision,
        kv_precision=kv_precision,
        openai_api=openai_api,
        tools=tools,
        json_output=json_output,
        local=local,
    )
    if as_json:
        d = adv.to_dict()
        d["experiment_file"] = write_exp(adv, write_experiment) if write_experiment else None
        typer.echo(json.dumps(d, indent=2, ensure_ascii=False, default=str))
        return
    render_advice(adv)
    written = write_exp(adv, write_experiment) if write_experiment else None  # after the advice is shown
    if written:
        typer.echo(f"\nexperiment written: {written} (validated; run: servelab trial {written})")


def render_advice(adv: Any) -> None:
    """Print an :class:`~servelab.advise.core.Advice` as rich tables and panels."""
    from rich.panel import Panel
    from rich.table import Table

    from servelab.catalog.cli import console

    con = console()
    r = adv.request
    con.print(
        Panel(
            f"task [b]{r.task.id}[/b] ({r.task.title}) · model [b]{r.model.name}[/b] · "
            f"{r.count} x [b]{r.hardware.name}[/b] · context {r.context_tokens:,} tokens · concurrency "
            f"{r.concurrency} · weights {r.weight_precision}"
            + (f" · required: {', '.join(r.required_features)}" if r.required_features else "")
            + ("\nsingle-machine deployment (000 §1 row 6)" if r.is_local else "")
            + f"\nroute: {r.task.row}\nmodel choice: {r.task.focus}; easy to miss: {r.task.hidden_cost}",
            title="servelab advise",
        )
    )
    t = Table(title="candidates, in evaluation order (an order of verification, not a ranking; 000 §11)")
    ratios: tuple[tuple[str, int | None], ...] = (
        ("#", None),
        ("engine", None),
        ("tier", None),
        ("why here", 3),
        ("check", 3),
        ("start (template)", 2),
    )
    for col, ratio in ratios:
        t.add_column(col, overflow="fold", ratio=ratio)
    for i, c in enumerate(adv.candidates, 1):
        t.add_row(
            str(i), c.engine.display_name, c.tier, "\n".join(c.reasons), "\n".join(c.cautions), c.serve_command or "-"
        )
    con.print(t)
    t = Table(title="excluded")
    for col in ("engine", "because", "reasons (with sources)"):
        t.add_column(col, overflow="fold")
    for e in adv.excluded:
        t.add_row(e.engine.display_name, e.category, "\n".join(e.reasons))
    con.print(t)
    if adv.platform_layer:
        t = Table(title="serving-platform layer: after an engine is verified (000 §1 last row, §11)")
        for col in ("layer", "applies", "note"):
            t.add_column(col, overflow="fold")
        for n in adv.platform_layer:
            t.add_row(n.engine.display_name, "yes" if n.applicable else "no", n.reason)
        con.print(t)
    t = Table(title="000 §5 exact-combination checklist: known from the catalogs vs still to verify")
    for col in ("item", "status", "known (source, checked)", "to verify"):
        t.add_column(col, overflow="fold")
    for it in adv.checklist:
        known = "\n".join(f"{f.text} [{f.source}, {f.checked}]" for f in it.known) or "-"
        t.add_row(f"{it.found}\n{it.question}", it.status, known, "\n".join(it.verify) or "-")
    con.print(t)
    if adv.plan_render is not None:
        con.print(adv.plan_render)
    else:
        con.print(Panel(adv.plan_note or "no capacity plan", title="capacity plan"))
    for n in adv.notes:
        con.print(f"note: {n}")
