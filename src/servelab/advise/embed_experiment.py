"""``servelab advise --task embedding --write-experiment FILE``: an embeddings trial
(``goal.task_kind: embeddings``, docs/experiment.md "embeddings") for the advised candidates.

Which candidate each engine gets:

- servelab's own all-MiniLM-L6-v2 embedder on the real llama-server (:mod:`servelab.engines.embedder`),
  as ``engine: command`` candidates at two slot counts (1 and ``min(concurrency, 8)``: one factor at a
  time), when the model is ``all-minilm-l6-v2`` and the hardware a CPU — the llama.cpp route of the
  catalog that servelab can start itself here;
- ``engine: llamacpp`` with ``--embeddings --pooling mean`` for a local ``.gguf`` ``--model`` on a CPU;
- ``engine: url`` for every other engine with an OpenAI-compatible API (TEI, vLLM pooling, …), its
  start command in the comment above it (the catalog's ``serve_hint``; llama-server's gets
  ``--embeddings --pooling mean``, without which it serves no ``/v1/embeddings``,
  https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md, read 2026-12-01). When some
  candidate is launchable they are written commented out, so the file runs as written;
- commented out with the reason: engines without an OpenAI-compatible API, and active candidates past
  :data:`MAX_ACTIVE`.

The gate's reference vectors (``embeddings.reference``) are left to the user (a comment says how to make
them); the SLO is a placeholder on request latency (``e2e``), the only latency an embeddings response has.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from servelab.wire.errors import ConfigError

__all__ = ["render_embeddings_experiment"]

#: the model id of servelab's built-in embedder (servelab.engines.embedder.MODEL_ID; not imported here:
#: advise stays free of engine imports)
_BUILTIN_EMBEDDER = "all-minilm-l6-v2"


#: candidates written active (000 §10.3: a few); the same number as servelab.advise.experiment.MAX_ACTIVE
MAX_ACTIVE = 3


def _steps(concurrency: int) -> list[int]:
    """1, 2, 4, … up to ``concurrency`` (included)."""
    out, c = [], 1
    while c < concurrency:
        out.append(c)
        c *= 2
    return [*out, concurrency]


def _flow(d: dict[str, Any]) -> str:
    return json.dumps(d, ensure_ascii=False)


def _embedder(name: str, parallel: int) -> dict[str, Any]:
    """A ``command`` candidate running servelab's embedder with this Python (the file is for this host)."""
    import sys

    return {
        "name": name,
        "engine": "command",
        "settings": {
            "argv": [sys.executable, "-m", "servelab.engines.embedder", "--port", "{port}", "--parallel", str(parallel)]
        },
    }


def _launchable(advice: Any, engine: Any) -> list[dict[str, Any]]:
    """The candidate entries servelab can start for ``engine`` (``[]`` when none)."""
    req = advice.request
    if engine.launch != "llamacpp" or req.hardware.kind != "cpu":
        return []
    arg = Path(os.path.expanduser(req.model_arg))
    if arg.is_file() and arg.suffix == ".gguf":
        slots = max(1, min(req.concurrency, 8))
        return [
            {
                "name": "llamacpp-embed",
                "engine": "llamacpp",
                "model": str(arg.absolute()),
                "settings": {
                    "parallel": slots,
                    "ctx_size": 512 * slots,
                    "extra_args": ["--embeddings", "--pooling", "mean"],
                },
            }
        ]
    if req.model.name == _BUILTIN_EMBEDDER:
        hi = max(2, min(req.concurrency, 8))
        return [_embedder("embedder-np1", 1), _embedder(f"embedder-np{hi}", hi)]
    return []


def render_embeddings_experiment(advice: Any, name: str) -> str:
    """The embeddings experiment YAML (with comments) for an :class:`~servelab.advise.core.Advice` of the
    ``embedding`` task. Raises ConfigError when no candidate has an OpenAI-compatible API."""
    from servelab.advise.select import serve_command

    req = advice.request
    slo = "e2e_p95<=1s,error_rate<=1%" if req.hardware.kind != "cpu" else "e2e_p95<=5s,error_rate<=1%"
    lines = [
        f"# servelab trial experiment (embeddings) written by `servelab advise` for: model {req.model.name},",
        f"# {req.count} x {req.hardware.name}, concurrency {req.concurrency}.",
        "# Candidates are in the evaluation order of 000 §1 row 5 (an order of verification, not a ranking).",
        "# Each candidate must serve OpenAI POST /v1/embeddings. `engine: url` candidates are servers servelab",
        "# does NOT start: start each with the command above it, then run `servelab trial THIS_FILE`.",
        "# The ranking is on inputs/s (vectors/s) at the SLO, with batch size and input length stated (000 §10.2).",
        "# SLO and input lengths below are placeholders: set your traffic's.",
        "# Format: docs/experiment.md (embeddings); checked with servelab.trial.spec.load_experiment when written.",
        f"name: {name}",
        "goal:",
        f"  task: {json.dumps(f'{req.task.title}: {req.model.name} on {req.count} x {req.hardware.name}')}",
        "  task_kind: embeddings",
        f"  slo: {json.dumps(slo)}   # placeholder: latency of one request of embeddings.batch_size inputs",
        "  error_budget: 0.01",
        "candidates:",
    ]
    launch = {id(c): _launchable(advice, c.engine) for c in advice.candidates}
    any_launchable = any(launch.values())
    used_ports: set[int] = set()
    active = 0
    for cand in advice.candidates:
        eng = cand.engine
        header = f"  # {cand.tier}: {eng.display_name} — {cand.reasons[0] if cand.reasons else ''}"
        entries = launch[id(cand)]
        if entries:
            lines.append(header)
            lines.append(
                "  # launched by servelab"
                + (
                    ": all-MiniLM-L6-v2 on llama-server (servelab embed-engine), two slot counts"
                    if entries[0]["engine"] == "command"
                    else ""
                )
            )
        elif eng.features.openai_api is True:
            port = eng.default_port or 8000
            while port in used_ports:
                port += 1
            used_ports.add(port)
            cmd = serve_command(eng, req, port) or f"start it listening on port {port} (see {eng.source})"
            if eng.launch == "llamacpp" or "llama-server" in cmd:
                cmd += " --embeddings --pooling mean"
            entries = [
                {
                    "name": eng.name.replace("_", "-").replace(".", "-"),
                    "engine": "url",
                    "url": f"http://127.0.0.1:{port}/v1",
                }
            ]
            if eng.name == "transformers":  # `transformers serve` loads the model named in each request
                entries[0]["model_name"] = getattr(req.model, "hf_repo", None) or req.model.name
            lines.append(header)
            lines.append(f"  # external launch: {cmd}")
            if any_launchable:
                lines.append("  # not started by servelab: start the server as above, then uncomment to include")
                lines.append("  # - " + _flow(entries[0]))
                continue
        else:
            lines.append(header)
            lines.append(
                f"  # not written: {eng.display_name} has no OpenAI-compatible API in the catalog, "
                "so servelab trial cannot measure it"
            )
            continue
        for e in entries:
            if active >= MAX_ACTIVE:
                lines.append(
                    f"  # lower in the evaluation order (only the first {MAX_ACTIVE} are active, "
                    "000 §10.3); uncomment to include"
                )
            lines.append(("  - " if active < MAX_ACTIVE else "  # - ") + _flow(e))
            active += 1
    if active == 0:
        raise ConfigError(
            "--write-experiment: no candidate has an OpenAI-compatible /v1/embeddings API; nothing to trial"
        )
    steps = _steps(max(1, min(req.concurrency, 16)))
    lines += [
        f"steps: {_flow({'concurrency': steps})}",
        f"requests_per_step: {max(8, 2 * steps[-1])}",
        "timeout_s: 120",
        "repeats: 3",
        "embeddings:",
        "  batch_size: 8        # inputs per request: your client's batch",
        "  input_tokens: 16-256  # per-input length in the model's tokenizer: your documents'/queries'",
        "  # reference: vectors.json   # {items: [{text, embedding}]} from the model's own library, then",
        "  # similarity_min: 0.99      # every served vector must be this close (cosine) to its reference",
    ]
    return "\n".join(lines) + "\n"
