"""``servelab plan --engine llamacpp`` against what the REAL llama-server reports at start (-lv 4).

Starts the cached llama-server (Gemma 3 270M Q4_K_M) with several -c / -np / -kvu / -ctk settings,
reads its log until the compute buffer line, stops it, and compares: KV caches (cells, layers, MiB)
within 2 %, n_ctx / n_ctx_seq exactly, output buffer exactly, model (host + CPU_REPACK) within 2 %,
compute buffer within 5 % (a fitted estimate, see servelab.plan.llamacpp).
Skips without a cached binary unless SERVELAB_REQUIRE_ENGINE is set (then it fails), like
tests/engines/test_llamacpp.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from servelab.catalog.readers import read_gguf
from servelab.engines import llamacpp
from servelab.engines.spawn import free_port
from servelab.plan.llamacpp import llamacpp_memory, parse_server_log

MIB = 2**20
# (-c, -np, extra args): odd sizes exercise the padding to 256 and the per-sequence split
CASES = [
    (2048, 1, []),
    (4096, 2, []),
    (8192, 4, []),
    (16384, 3, []),
    (5000, 1, []),
    (8192, 4, ["-kvu"]),
    (8192, 4, ["-ctk", "q8_0", "-ctv", "q8_0"]),
    (3000, 2, ["-ub", "256"]),
]


def _binary() -> Path:
    p = llamacpp.find_llama_server()
    if p is None:
        msg = f"no cached llama-server under {llamacpp.cache_dir()}/llama-server (run `servelab engine build llamacpp`)"
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail(msg + "; SERVELAB_REQUIRE_ENGINE is set")
        pytest.skip(msg)
    return p


def _start_log(binary: Path, model: Path, args: list[str], log: Path, timeout_s: float = 120) -> str:
    """Run llama-server until its log shows the scheduler's graph line (all buffers allocated), then stop it."""
    cmd = [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "-lv",
        "4",
        "--no-warmup",
        *args,
    ]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if "sched_reserve: graph" in text:
                return text
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited {proc.returncode}: {text[-2000:]}")
            time.sleep(0.1)
        pytest.fail(f"llama-server did not log its buffers within {timeout_s} s")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def gguf() -> Path:
    return llamacpp.default_model_path()


@pytest.mark.parametrize(("ctx", "np_", "extra"), CASES, ids=[f"c{c}-np{n}{''.join(e)}" for c, n, e in CASES])
def test_plan_matches_llama_server(ctx: int, np_: int, extra: list[str], gguf: Path, tmp_path: Path) -> None:
    binary = _binary()
    real = parse_server_log(_start_log(binary, gguf, ["-c", str(ctx), "-np", str(np_), *extra], tmp_path / "log"))
    ctk = extra[extra.index("-ctk") + 1] if "-ctk" in extra else "f16"
    ub = int(extra[extra.index("-ub") + 1]) if "-ub" in extra else 512
    plan = llamacpp_memory(
        read_gguf(gguf), ctx, np_, kv_unified="-kvu" in extra, cache_type_k=ctk, cache_type_v=ctk, n_ubatch=ub
    )
    assert (real["n_ctx"], real["n_ctx_seq"]) == (plan.n_ctx, plan.n_ctx_seq)
    base, swa = real["kv_caches"]  # non-SWA first, then SWA (llama_kv_cache_iswa order)
    assert (base["cells"], base["layers"], base["streams"]) == (plan.cells_base, plan.layers_base, plan.n_stream)
    assert (swa["cells"], swa["layers"]) == (plan.cells_swa, plan.layers_swa)
    assert plan.kv_base_bytes / MIB == pytest.approx(base["mib"], rel=0.02)
    assert plan.kv_swa_bytes / MIB == pytest.approx(swa["mib"], rel=0.02)
    host = real["host_mib"]
    assert plan.context_bytes / MIB == pytest.approx(host["context"], rel=0.02, abs=1.0)  # table rounds to MiB
    model_mib = host["model"] + real.get("repack_mib", 0)
    assert plan.model_bytes / MIB == pytest.approx(model_mib, rel=0.02, abs=1.0)
    assert plan.output_bytes / MIB == pytest.approx(real["output_mib"], abs=0.01)
    assert plan.compute_bytes / MIB == pytest.approx(real["compute_mib"], rel=0.05)


def test_cli_plan_matches_llama_server(gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same check through `servelab plan --engine llamacpp --ctx-size --parallel --json`."""
    binary = _binary()
    real = parse_server_log(_start_log(binary, gguf, ["-c", "6000", "-np", "3"], tmp_path / "log"))
    from servelab.cli import main

    with pytest.raises(SystemExit) as e:
        main(
            [
                "plan",
                "--model",
                str(gguf),
                "--hardware",
                "cpu-host",
                "--engine",
                "llamacpp",
                "--context",
                "2000",
                "--concurrency",
                "3",
                "--ctx-size",
                "6000",
                "--parallel",
                "3",
                "--json",
            ]
        )
    assert e.value.code == 0
    out = json.loads(capsys.readouterr().out)["llamacpp"]
    base, swa = real["kv_caches"]
    assert out["kv_base_mib"] == pytest.approx(base["mib"], rel=0.02)
    assert out["kv_swa_mib"] == pytest.approx(swa["mib"], rel=0.02)
    assert (out["n_ctx"], out["n_ctx_seq"]) == (real["n_ctx"], real["n_ctx_seq"])


# a real -c 8192 -np 4 -lv 4 start of this build (2026-11-30), the numbers the issue quotes
RECORDED = (  # long lines split in two literals; the text is the log as recorded
    "0.00.996.946 I common_memory_breakdown_print: |   - Host               |"
    "                  327 =   222 +      84 +      21                |\n"
    "0.00.996.946 I common_memory_breakdown_print: |   - CPU_REPACK         |"
    "                   12 =    12 +       0 +       0                |\n"
    "0.01.704.223 I llama_context: n_ctx                 = 8192\n"
    "0.01.704.236 I llama_context: n_ctx_seq             = 2048\n"
    "0.01.704.515 I llama_context:        CPU  output buffer size =     4.00 MiB\n"
    "0.01.717.684 I llama_kv_cache: size =   24.00 MiB (  2048 cells,   3 layers,"
    "  4/4 seqs), K (f16):   12.00 MiB, V (f16):   12.00 MiB\n"
    "0.01.752.738 I llama_kv_cache: size =   60.00 MiB (  1024 cells,  15 layers,"
    "  4/4 seqs), K (f16):   30.00 MiB, V (f16):   30.00 MiB\n"
    "0.01.755.058 I sched_reserve:        CPU compute buffer size =    21.28 MiB\n"
)


def test_parse_recorded_log_and_hand_arithmetic() -> None:
    r = parse_server_log(RECORDED)
    assert r["host_mib"] == {"total": 327, "model": 222, "context": 84, "compute": 21} and r["repack_mib"] == 12
    assert [c["cells"] for c in r["kv_caches"]] == [2048, 1024] and r["output_mib"] == 4.0
    from servelab.catalog import find_model

    p = llamacpp_memory(find_model("gemma-3-270m"), 8192, 4)
    # non-SWA: n_ctx_seq = pad(8192/4, 256) = 2048 cells x 4 streams x 3 layers x (K 256 + V 256) x 2 bytes
    assert p.kv_base_bytes == 2048 * 4 * 3 * 512 * 2 == 24 * MIB
    # SWA: pad(min(2048, 512*1 + 512 ubatch), 256) = 1024 cells x 4 streams x 15 layers x 512 x 2 bytes
    assert p.kv_swa_bytes == 1024 * 4 * 15 * 512 * 2 == 60 * MIB
    # unified (-kvu): one stream of 8192 cells; SWA pad(min(8192, 512*4 + 512), 256) = 2560 cells
    u = llamacpp_memory(find_model("gemma-3-270m"), 8192, 4, kv_unified=True)
    assert (u.cells_base, u.cells_swa, u.n_stream) == (8192, 2560, 1)
    # -c 16384 -np 3: 16384/3 = 5461 -> padded to 5632 per sequence, n_ctx rounded to 16896
    t = llamacpp_memory(find_model("gemma-3-270m"), 16384, 3)
    assert (t.n_ctx, t.n_ctx_seq) == (16896, 5632)
