"""Inspecting a built llama-server (its ``--version``, the cmake cache and compile commands it was built
with, whether AMX kernels are in it) and proving it serves: started on a small GGUF, it must stream
tokens from ``/v1/completions`` before it is cached."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from servelab.engines.exits import EngineStartError
from servelab.engines.isa import compiler_isa
from servelab.engines.llamacpp.manifest import CMAKE_CACHE_KEYS, BuildProof
from servelab.engines.spawn import spawn_on_port

__all__ = [
    "amx_kernels_in",
    "isa_from_compile_commands",
    "parse_version_output",
    "prove_llama_server",
    "read_cmake_cache",
    "version_output",
]


def version_output(binary: Path) -> str:
    """``binary --version`` (stdout + stderr). Raises RuntimeError on a non-zero exit (a signal named)."""
    r = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        from servelab.engines.exits import describe_exit

        raise RuntimeError(f"{binary} --version {describe_exit(r.returncode)}: {(r.stderr or r.stdout).strip()[-400:]}")
    return (r.stdout + r.stderr).strip()


def parse_version_output(text: str) -> dict[str, Any]:
    """``version: 1 (build 0, commit unknown)`` / ``version: 4000 (abc123)`` -> fields."""
    out: dict[str, Any] = {"version_output": text}
    m = re.search(r"version:\s*(\S+)\s*\((?:build\s+(\d+),\s*commit\s+)?([^)]*)\)", text)
    if m:
        out["version_reported"] = m.group(1)
        if m.group(2) is not None:
            out["build_number_reported"] = int(m.group(2))
        out["commit"] = m.group(3).strip()
    m = re.search(r"built with (.+?) for (.+)", text)
    if m:
        out["compiler"], out["build_target"] = m.group(1).strip(), m.group(2).strip()
    return out


def read_cmake_cache(build_dir: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        for line in (build_dir / "CMakeCache.txt").read_text(encoding="utf-8", errors="replace").splitlines():
            m = re.match(r"^([A-Za-z0-9_]+):[A-Z]+=(.*)$", line)
            if m and m.group(1) in CMAKE_CACHE_KEYS:
                out[m.group(1)] = m.group(2)
    except OSError:
        pass
    return out


def isa_from_compile_commands(build_dir: Path) -> list[str] | None:
    """ISA extensions the compiler may emit in ggml's CPU backend: the ``-m`` flags of the compile
    command of ``ggml-cpu.c`` in ``compile_commands.json``, asked back from the same compiler
    (:func:`compiler_isa`). ``None`` when the file or the command is missing."""
    try:
        commands = json.loads((build_dir / "compile_commands.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for entry in commands:
        if str(entry.get("file", "")).endswith(("ggml-cpu/ggml-cpu.c", "ggml-cpu\\ggml-cpu.c")):
            argv = entry.get("arguments") or shlex.split(entry.get("command", ""))
            if not argv:
                return None
            flags = [a for a in argv[1:] if re.match(r"^-m[a-z]", a)]
            try:
                return compiler_isa(argv[0], flags)
            except RuntimeError:
                return None
    return None


def amx_kernels_in(binary: Path) -> bool | None:
    """Whether ggml's AMX backend (``ggml_backend_amx_*``, compiled only with ``__AMX_INT8__``) is in
    ``binary``, read from its symbol table; ``None`` when the binary has no symbols to tell."""
    data = binary.read_bytes()
    if b"ggml_backend_amx_" in data:
        return True
    return False if b"ggml_backend_cpu_init" in data else None


def prove_llama_server(
    binary: Path, model: Path, log_dir: Path, tokens: int = 4, timeout_s: float = 120.0
) -> BuildProof:
    """Start ``binary`` on ``model`` (one slot, 512-token context), stream a ``tokens``-token
    completion from ``/v1/completions`` (``ignore_eos``), stop it. Never raises for the binary's
    faults: a crash, no readiness or no token is ``BuildProof(ok=False, error=...)``."""
    from servelab.engines.exits import describe_exit

    t0 = time.monotonic()
    proof = BuildProof(ok=False, model=str(model))
    try:
        eng = spawn_on_port(
            "llama.cpp",
            lambda port: [
                str(binary),
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-c",
                "512",
                "-np",
                "1",
            ],
            host="127.0.0.1",
            port=None,
            log_path_for=lambda port: log_dir / f"proof-{port}.log",
            ready_timeout_s=timeout_s,
        )
    except EngineStartError as e:
        proof.error = str(e).splitlines()[0]
        proof.total_s = round(time.monotonic() - t0, 3)
        return proof
    proof.log_path = str(eng.log_path)
    proof.ready_s = round(eng.cold_start.get("health_s", time.monotonic() - t0), 3)
    try:
        body = json.dumps(
            {
                "prompt": "The capital of France is",
                "max_tokens": tokens,
                "stream": True,
                "ignore_eos": True,
                "temperature": 0,
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{eng.port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        t_req = time.monotonic()
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[5:]).get("choices") or [{}]
                if choices[0].get("text"):
                    proof.tokens += 1
                    if proof.first_token_s is None:
                        proof.first_token_s = round(time.monotonic() - t_req, 3)
        proof.ok = proof.tokens > 0
        if not proof.ok:
            proof.error = "the stream ended without a token"
    except (OSError, ValueError) as e:
        rc = eng.process.poll()
        proof.error = (
            f"llama-server {describe_exit(rc)} while serving the proof request"
            if rc is not None
            else f"the proof request failed: {type(e).__name__}: {e}"
        )
    finally:
        eng.stop()
        proof.total_s = round(time.monotonic() - t0, 3)
    return proof
