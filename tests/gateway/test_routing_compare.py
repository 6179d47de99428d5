"""benches/routing_compare.py (issue 26): its reading of the engines' cached-prompt figures (unit), and its
llama-server path end to end (engine tier: 2 real replicas, 1 round, 2 sessions of 2 turns, 2 policies).

The stream events below are llama-server's (build 11434) final chunk of a streamed chat completion with
``include_usage``, as it sent them to benches/routing_compare.py here: ``usage.prompt_tokens_details`` and
llama.cpp's own ``timings``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("routing_compare", ROOT / "benches" / "routing_compare.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


LLAMA_FINAL = {
    "choices": [],
    "usage": {
        "completion_tokens": 8,
        "prompt_tokens": 692,
        "total_tokens": 700,
        "prompt_tokens_details": {"cached_tokens": 648},
    },
    "timings": {"cache_n": 648, "prompt_n": 44, "prompt_ms": 336.6, "predicted_n": 8, "predicted_ms": 494.2},
}


def test_cached_tokens_from_usage_else_llamacpp_timings_else_none() -> None:
    m = _bench()
    assert m.cached_of(LLAMA_FINAL) == 648
    no_details = {"usage": {"prompt_tokens": 692}, "timings": {"cache_n": 600, "prompt_n": 92}}
    assert m.cached_of(no_details) == 600  # an older llama-server: only its timings say it
    assert m.cached_of({"choices": [{"delta": {"content": "x"}}]}) is None  # a content chunk says nothing
    assert m.cached_of({"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}}) == 0


def test_engine_counters_per_engine_llamacpp_queries_are_cached_plus_processed() -> None:
    m = _bench()
    llama = (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        "llamacpp:prompt_tokens_total 730\n"
        "llamacpp:prompt_tokens_cached_total 1347\n"
        "llamacpp:prompt_tokens_seconds 185.5\n"
    )
    assert m.engine_counters(llama, "llamacpp") == (1347.0, 2077.0)
    vllm = (
        "vllm:prefix_cache_hits_total 48\nvllm:prefix_cache_queries_total 64\n"
        'vllm:prefix_cache_hits_total{model_name="other"} 2\n'
    )  # series summed over their labels
    assert m.engine_counters(vllm, "mock") == (50.0, 64.0)


def test_llamacpp_path_runs_end_to_end_and_prints_every_figure(tmp_path: Path) -> None:
    """Two real llama-server replicas behind two gateways (round_robin, engine), one 2-turn session: the run
    ends and every request succeeds; round robin sends turn 2 to the other, empty replica (moved 1, nothing
    cached), the engine picker keeps it where turn 1's prompt is (moved 0, a cached share > 0). Skips
    without a cached llama-server (fails with ``SERVELAB_REQUIRE_ENGINE``), as the other engine tests."""
    from servelab.engines.llamacpp import find_llama_server

    if find_llama_server() is None:
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail("no cached llama-server; SERVELAB_REQUIRE_ENGINE is set")
        pytest.skip("no cached llama-server (run `servelab engine build llamacpp`)")
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benches" / "routing_compare.py"),
            "--engine",
            "llamacpp",
            "--replicas",
            "2",
            "--rounds",
            "1",
            "--sessions",
            "1",
            "--turns",
            "2",
            "--system-words",
            "30",
            "--user-words",
            "4",
            "--max-tokens",
            "2",
            "--policies",
            "round_robin,engine",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    rows = {ln.split()[0]: ln.split() for ln in out.stdout.splitlines() if ln.startswith(("round_robin ", "engine "))}
    assert set(rows) == {"round_robin", "engine"}, out.stdout
    for name, cells in rows.items():
        assert cells[-1] == "0", f"{name}: failed requests in {cells}"  # the 'failed' column
    # columns: policy, cached, engine hit, ..., moved, route ms, failed
    rr, eng = rows["round_robin"], rows["engine"]
    assert (float(rr[1]), float(rr[2]), rr[-3]) == (0.0, 0.0, "1.000"), rr
    assert 0.0 < float(eng[1]) < 1.0 and eng[-3] == "0.000", eng
    assert eng[1] == eng[2], eng  # usage's cached_tokens and llama.cpp's counters agree
    assert re.search(r"cached share\s+n/a \(needs >= 3 rounds\)", out.stdout), out.stdout


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--replicas", "1"], "--replicas 1: routing compares where requests go, which needs 2 replicas or more"),
        (["--policies", ",,"], "--policies ',,' names no policy"),
        (["--policies", "nope"], "--policies: nope not among"),
        (["--replicas", "x"], "invalid int value"),
    ],
)
def test_bad_arguments_are_refused_with_one_line(
    argv: list[str], words: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--replicas 1 ran a comparison on one replica, --policies ,, ran round_robin alone; argparse's
    refusals came with a usage block. Now each is one line and exit 2."""
    mod = _bench()
    monkeypatch.setattr(sys, "argv", ["routing_compare.py", *argv])
    with pytest.raises(SystemExit) as e:
        mod._args()
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and words in err, err
