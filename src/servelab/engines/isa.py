"""Instruction-set extensions: which ones this host's CPU has, and which ones a compiled binary needs.

A native build (``-march=native``) may use every extension of the machine that compiled it; copied to
a CPU without one of them (a shared home directory, a container image, a cache restored on another
host) it dies with SIGILL at the first such instruction. So a build records the extensions its
compiler was allowed to use, and a launcher compares them with this host's before it starts the
binary.

- :func:`host_cpu` reads ``/proc/cpuinfo`` (Linux): the model name and the ``flags`` line.
- :func:`compiler_isa` asks the compiler which ISA macros a set of ``-m`` flags turns on
  (``cc FLAGS -E -dM -x c /dev/null``; GCC and Clang both print ``__AVX2__``, ``__AMX_TILE__`` …) and
  names them as ``/proc/cpuinfo`` does (:data:`MACRO_TO_CPUINFO`), so the two sets compare directly.
- :func:`missing_isa` is the difference.

Only extensions that compilers emit on their own are tracked (SIMD, AMX, BMI, FMA, F16C …); the
baseline x86-64 set (SSE2) and kernel-only features are not.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

__all__ = ["MACRO_TO_CPUINFO", "HostCpu", "compiler_isa", "host_cpu", "missing_isa", "tracked_host_isa"]

#: predefined compiler macro -> the flag name in Linux ``/proc/cpuinfo`` (arch/x86/include/asm/cpufeatures.h)
MACRO_TO_CPUINFO: dict[str, str] = {
    "__SSE3__": "pni",
    "__SSSE3__": "ssse3",
    "__SSE4_1__": "sse4_1",
    "__SSE4_2__": "sse4_2",
    "__POPCNT__": "popcnt",
    "__AVX__": "avx",
    "__AVX2__": "avx2",
    "__FMA__": "fma",
    "__F16C__": "f16c",
    "__BMI__": "bmi1",
    "__BMI2__": "bmi2",
    "__LZCNT__": "abm",
    "__MOVBE__": "movbe",
    "__AVXVNNI__": "avx_vnni",
    "__AVXVNNIINT8__": "avx_vnni_int8",
    "__AVX512F__": "avx512f",
    "__AVX512CD__": "avx512cd",
    "__AVX512BW__": "avx512bw",
    "__AVX512DQ__": "avx512dq",
    "__AVX512VL__": "avx512vl",
    "__AVX512IFMA__": "avx512ifma",
    "__AVX512VBMI__": "avx512vbmi",
    "__AVX512VBMI2__": "avx512_vbmi2",
    "__AVX512VNNI__": "avx512_vnni",
    "__AVX512BITALG__": "avx512_bitalg",
    "__AVX512VPOPCNTDQ__": "avx512_vpopcntdq",
    "__AVX512BF16__": "avx512_bf16",
    "__AVX512FP16__": "avx512_fp16",
    "__AMX_TILE__": "amx_tile",
    "__AMX_INT8__": "amx_int8",
    "__AMX_BF16__": "amx_bf16",
    "__AMX_FP16__": "amx_fp16",
    "__GFNI__": "gfni",
    "__VAES__": "vaes",
    "__VPCLMULQDQ__": "vpclmulqdq",
    "__SHA__": "sha_ni",
    "__AES__": "aes",
    "__PCLMUL__": "pclmulqdq",
    # aarch64 (cpuinfo "Features")
    "__ARM_FEATURE_SVE": "sve",
    "__ARM_FEATURE_SVE2": "sve2",
    "__ARM_FEATURE_DOTPROD": "asimddp",
    "__ARM_FEATURE_MATMUL_INT8": "i8mm",
    "__ARM_FEATURE_FP16_VECTOR_ARITHMETIC": "asimdhp",
    "__ARM_FEATURE_SME": "sme",
}

_TRACKED = frozenset(MACRO_TO_CPUINFO.values())


class HostCpu(BaseModel):
    """This host's CPU as ``/proc/cpuinfo`` names it: ``model`` (model name) and ``flags`` (the ISA
    extension names of the first processor; every core of a Linux host reports the same set)."""

    model: str = Field(description="CPU model name, e.g. 'Intel(R) Xeon(R) Platinum 8480+'")
    machine: str = Field(description="platform.machine(): x86_64, aarch64 ...")
    flags: list[str] = Field(default_factory=list, description="/proc/cpuinfo flags (or Features), sorted")


def host_cpu(cpuinfo: str | Path = "/proc/cpuinfo") -> HostCpu:
    """This host's CPU model and ISA flags from ``cpuinfo`` (default ``/proc/cpuinfo``); an empty
    flag list where the file cannot be read (not Linux)."""
    model, flags = platform.processor() or "unknown", ""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and model in ("unknown", "", platform.processor()):
            model = value.strip() or model
        elif key in ("flags", "features") and not flags:
            flags = value
    return HostCpu(model=model, machine=platform.machine(), flags=sorted(set(flags.split())))


def tracked_host_isa(cpu: HostCpu) -> list[str]:
    """The host's flags that :data:`MACRO_TO_CPUINFO` tracks (what a binary's needs are compared with)."""
    return sorted(set(cpu.flags) & _TRACKED)


def compiler_isa(compiler: str, flags: Sequence[str]) -> list[str]:
    """ISA extensions (``/proc/cpuinfo`` names) that ``compiler`` may emit when given ``flags`` (the
    ``-m...`` options of a compile command, in order: later ones win as in the real build).

    Runs ``compiler FLAGS -E -dM -x c /dev/null`` and maps the predefined macros. Raises RuntimeError
    when the compiler is missing or rejects the flags."""
    exe = shutil.which(compiler) or compiler
    try:
        r = subprocess.run(
            [exe, *flags, "-E", "-dM", "-x", "c", "/dev/null"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"cannot run {compiler} to read its ISA macros: {e}") from e
    if r.returncode != 0:
        raise RuntimeError(f"{compiler} {' '.join(flags)} -E -dM failed: {r.stderr.strip()[-300:]}")
    macros = set(re.findall(r"^#define (\w+)", r.stdout, re.MULTILINE))
    return sorted({MACRO_TO_CPUINFO[m] for m in macros if m in MACRO_TO_CPUINFO})


def missing_isa(required: Iterable[str], cpu: HostCpu) -> list[str]:
    """Extensions in ``required`` that ``cpu`` lacks (sorted); ``[]`` when the host's flags are
    unknown (nothing to compare against: the caller cannot refuse on no evidence)."""
    if not cpu.flags:
        return []
    have = set(cpu.flags)
    return sorted(set(required) - have)
