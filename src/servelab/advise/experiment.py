"""Write the candidates of an :class:`~servelab.advise.core.Advice` as a ``servelab trial`` experiment
file (docs/experiment.md), then validate it with :func:`servelab.trial.spec.load_experiment`.

Which candidate kind each engine gets:

- ``llamacpp`` / ``vllm`` (servelab launches them; both are **CPU builds**): only when the hardware is a
  CPU and the model can be pointed at — a local GGUF file (both; vLLM converts it once) or HF folder
  (vllm) given as ``--model``, or ``gemma-3-270m``, the built-in default weights. llama.cpp's
  ``ctx_size`` is ``-c``, the total shared by its slots: context per sequence x ``parallel``.
- ``url`` (the schema's route for an engine started outside servelab): every other candidate with an
  OpenAI-compatible chat API; the comment above it gives the command to start it on the target machine
  and the port the URL expects. The trial cannot start these; start them first. When some candidate
  *is* launchable by servelab, the ``url`` ones are written commented out, so the file runs as written
  (``servelab trial`` stops at a ``url`` candidate whose server is not up).
- commented out: candidates without an OpenAI chat API, and candidates past the first
  :data:`MAX_ACTIVE` (000 §10.3: pick a few candidates), each with the reason.

Text tasks are trialled on OpenAI chat completions; the ``embedding`` task gets an embeddings trial
(:mod:`servelab.advise.embed_experiment`); for reranking, speech, images or video :func:`write_experiment`
raises ConfigError.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from servelab.advise.core import Advice
from servelab.advise.select import serve_command
from servelab.wire.errors import ConfigError

#: Candidates written active; the rest are written commented out (000 §10.3: a few candidates).
MAX_ACTIVE = 3

_BUILTIN_GGUF_MODEL = "gemma-3-270m"


def _steps(concurrency: int) -> list[int]:
    """1, 2, 4, … up to ``concurrency`` (included)."""
    out, c = [], 1
    while c < concurrency:
        out.append(c)
        c *= 2
    out.append(concurrency)
    return out


def _workloads(advice: Advice) -> list[Any]:
    req = advice.request
    names = list(req.task.workloads)
    if (req.json_output or req.tools) and "structured" not in names:
        names.append("structured")
    out: list[Any] = []
    for n in names:
        if n == "rag":
            n_in = max(256, min(req.context_tokens // 2, 16384))
            out.append({"name": "rag", "set": {"input_tokens": n_in, "output_tokens": 128}})
        else:
            out.append(n)
    return out


def _launchable(advice: Advice, engine: Any) -> tuple[str, str | None] | None:
    """(kind, model path or None) when servelab can launch this engine for this request, else None."""
    req = advice.request
    if engine.launch is None or req.hardware.kind != "cpu":
        return None
    arg = Path(os.path.expanduser(req.model_arg))
    if engine.launch == "llamacpp":
        if arg.is_file() and arg.suffix == ".gguf":
            return "llamacpp", str(arg.absolute())
        if req.model.name == _BUILTIN_GGUF_MODEL:
            return "llamacpp", None
    if engine.launch == "vllm":
        # servelab's vLLM-CPU launcher serves an HF folder, or converts a GGUF (the built-in one when null) once
        if arg.is_dir() or (arg.is_file() and arg.suffix == ".gguf"):
            return "vllm", str(arg.absolute())
        if req.model.name == _BUILTIN_GGUF_MODEL:
            return "vllm", None
    return None


def _flow(d: dict[str, Any]) -> str:
    return json.dumps(d, ensure_ascii=False)


def render_experiment(advice: Advice, name: str) -> str:
    """The experiment YAML text (with comments) for ``advice``. Raises ConfigError for a task that
    ``servelab trial`` cannot measure, or when no candidate has an OpenAI chat API."""
    req = advice.request
    if req.task.id == "embedding":  # an embeddings trial (goal.task_kind: embeddings)
        from servelab.advise.embed_experiment import render_embeddings_experiment

        return render_embeddings_experiment(advice, name)
    if not req.task.trialable:
        raise ConfigError(
            f"--write-experiment: servelab trial measures OpenAI chat completions (text in, text "
            f"out); task {req.task.id} ({req.task.title}) needs its own benchmark — use the "
            "candidates and checklist printed by advise"
        )
    lines = [
        f"# servelab trial experiment written by `servelab advise` for: task {req.task.id}, model {req.model.name},",
        f"# {req.count} x {req.hardware.name}, context {req.context_tokens} tokens, concurrency {req.concurrency}.",
        "# Candidates are in the evaluation order of 000 §1/§11 (an order of verification, not a ranking).",
        "# `engine: url` candidates are servers servelab does NOT start (the experiment schema's route for an",
        "# external launch): start each on the target machine with the command in the comment above it, at",
        "# the port its url expects, then run `servelab trial THIS_FILE`. servelab itself launches only",
        "# llamacpp / vllm (CPU builds) and mock candidates. SLOs below are placeholders: set your own.",
        "# Format: docs/experiment.md; checked with servelab.trial.spec.load_experiment when written.",
        f"name: {name}",
        "goal:",
        f"  task: {json.dumps(f'{req.task.title}: {req.model.name} on {req.count} x {req.hardware.name}')}",
    ]
    gpu = req.hardware.kind != "cpu"
    slo = "ttft_p95<=2s,itl_p95<=100ms,error_rate<=1%" if gpu else "ttft_p95<=5s,itl_p95<=500ms,error_rate<=1%"
    lines += [f"  slo: {json.dumps(slo)}   # placeholder", "  error_budget: 0.01"]
    needs_json = req.json_output or req.task.id in ("structured", "agent")
    smoke = ["streaming", "usage", "stop"] + (["json_schema"] if needs_json else [])
    lines += ["  quality:", f"    smoke: {json.dumps(smoke)}"]
    lines.append("candidates:")
    used_ports: set[int] = set()
    active = 0
    # When servelab can launch some candidates itself, the file must run as written: an `engine: url`
    # candidate whose server is not up stops the whole trial, so those are written commented out.
    any_launchable = any(_launchable(advice, c.engine) is not None for c in advice.candidates)
    for cand in advice.candidates:
        eng = cand.engine
        cname = eng.name.replace("_", "-")
        launch = _launchable(advice, eng)
        header = f"  # {cand.tier}: {eng.display_name} — {cand.reasons[0] if cand.reasons else ''}"
        if launch is not None:
            kind, path = launch
            slots = max(1, min(req.concurrency, 16))
            # llama-server's -c is the total KV context shared by its -np slots: context per sequence x slots
            settings: dict[str, Any] = (
                {"parallel": slots, "ctx_size": req.context_tokens * slots}
                if kind == "llamacpp"
                else {"max_num_seqs": max(1, min(req.concurrency, 256)), "max_model_len": req.context_tokens}
            )
            entry = {"name": cname, "engine": kind, "model": path, "settings": settings}
            note = "launched by servelab" + (
                ""
                if path
                else " (model null = the built-in Gemma 3 270M Q4_K_M GGUF"
                + (", converted once for vLLM)" if kind == "vllm" else ")")
            )
        elif eng.features.openai_api is True:
            port = eng.default_port or 8000
            while port in used_ports:
                port += 1
            used_ports.add(port)
            entry = {"name": cname, "engine": "url", "url": f"http://127.0.0.1:{port}/v1"}
            if eng.name == "transformers":  # `transformers serve` loads the model named in each request
                entry["model_name"] = getattr(req.model, "hf_repo", None) or req.model.name
            cmd = serve_command(eng, req, port) or f"start it listening on port {port} (see {eng.source})"
            note = f"external launch: {cmd}"
        else:
            lines.append(header)
            lines.append(
                f"  # not written: {eng.display_name} has no OpenAI-compatible chat API in the catalog, "
                "so servelab trial cannot measure it"
            )
            continue
        lines.append(header)
        lines.append(f"  # {note}")
        if launch is None and any_launchable:
            lines.append("  # not started by servelab: start the server as above, then uncomment to include")
            lines.append("  # - " + _flow(entry))
            continue
        prefix = "  - " if active < MAX_ACTIVE else "  # - "
        if active >= MAX_ACTIVE:
            lines.append(
                f"  # lower in the evaluation order (only the first {MAX_ACTIVE} are active, 000 §10.3); "
                "uncomment to include"
            )
        lines.append(prefix + _flow(entry))
        active += 1
    if active == 0:
        raise ConfigError("--write-experiment: no candidate speaks an OpenAI-compatible chat API; nothing to trial")
    steps = _steps(req.concurrency)
    lines += ["workloads:"] + [f"  - {_flow(w) if isinstance(w, dict) else w}" for w in _workloads(advice)]
    lines += [
        f"steps: {_flow({'concurrency': steps})}",
        f"requests_per_step: {max(8, 2 * steps[-1])}",
        "warmup: 2",
        "timeout_s: 300",
        "# arrival test off: set goal.expected_rate_rps (your real arrival rate) and enable it (000 §10.3)",
        "arrival_test: {enabled: false}",
    ]
    return "\n".join(lines) + "\n"


def write_experiment(advice: Advice, path: str | os.PathLike[str]) -> str:
    """Write :func:`render_experiment` to ``path`` and validate it with
    :func:`servelab.trial.spec.load_experiment`. Returns the path. Raises ConfigError when the task cannot
    be trialled, when the file cannot be written, or (a bug) when the written file does not validate."""
    from servelab.trial.spec import load_experiment

    p = Path(path)
    name = "".join(ch if (ch.isalnum() or ch in "_.-") else "-" for ch in p.stem) or "advise"
    text = render_experiment(advice, name)
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ConfigError(
            f"--write-experiment {path}: cannot write ({e.strerror or e}); give a writable file path"
        ) from None
    load_experiment(p)
    return str(p)
