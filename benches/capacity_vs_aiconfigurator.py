#!/usr/bin/env python3
"""How many GPUs for a target request rate and SLO: AIConfigurator's recommendation next to servelab's
(issue 23 item 6). Run by hand (not a test), from the repository root, with the project venv:

    .venv/bin/python benches/capacity_vs_aiconfigurator.py            # ~2 minutes on 2 cores
    .venv/bin/python benches/capacity_vs_aiconfigurator.py --aic PATH  # another aiconfigurator binary

Set-up (once; its own venv, never ``.venv``): ``python3 -m venv ~/.cache/aic-venv &&
~/.cache/aic-venv/bin/pip install aiconfigurator==0.12.0`` (20 s, no torch; works offline with its
bundled model configs and performance databases).

For each case (a model x GPU both tools know, an input/output length, a target rate, TTFT and TPOT
limits) both run in the same invocation:

* **AIConfigurator**: ``aiconfigurator cli recommend --model-path M --system S --backend vllm --isl I
  --osl O --target-request-rate R --ttft MS --tpot MS --save-dir D``; the aggregated (non-disaggregated)
  rank-1 row of ``D/.../agg/best_config_topn.csv`` gives ``total_gpus_needed``, its parallelism, batch,
  TTFT and TPOT. Its numbers rest on per-kernel latency tables measured on that GPU with that engine
  version (its perf database; "HYBRID" mode fills gaps with speed-of-light + empirical factors), composed
  into an iteration model of the engine.
* **servelab**: ``servelab plan`` (:func:`servelab.plan.estimate`) for each TP in 1, 2, 4, 8 gives the
  memory plan (does it fit, how many sequences of ``I + O`` tokens the KV pool holds = the replica's
  slots, capped at vLLM's ``max_num_seqs`` 256) and the roofline floors; a continuous-batching law is
  read off the floors (:func:`roofline_law`: decode gap at 1 and at ``slots`` running, a line between;
  prefill at the peak FLOP/s) and given to ``servelab capacity``'s plan arithmetic
  (:func:`servelab.capacity.plan.capacity`: the highest Poisson rate whose simulated TTFT and TPOT meet
  the SLO; replicas ``ceil(R / capacity)``, no headroom, as AIConfigurator). The TP with the fewest GPUs
  wins. The roofline is a floor on time, so this count is a **lower bound** on GPUs: nothing here was
  measured on a GPU (this machine has none), and servelab's calibrated model (``servelab capacity
  --record RUN``) needs a trial on the target GPU.

The SLO is judged on P50 TTFT and P50 TPOT in servelab's simulation (AIConfigurator's TTFT/TPOT are
single steady-state values, closest to a median). Printed per case: both GPU counts and their ratio,
AIConfigurator's TPOT at its batch next to servelab's roofline TPOT floor at the same batch and TP
(ratio = how far measured kernels sit above the bandwidth/FLOP floor), and the memory facts servelab used.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from servelab.bench.analysis.slo import parse_slo
from servelab.capacity.plan import Workload, capacity
from servelab.capacity.profile import Lengths, TrafficProfile
from servelab.capacity.results import PerfParams
from servelab.plan import estimate
from servelab.plan.estimate import MAX_NUM_SEQS
from servelab.wire.errors import ConfigError

AIC_DEFAULT = Path(os.path.expanduser("~/.cache/aic-venv/bin/aiconfigurator"))


@dataclass(frozen=True)
class Case:
    """One comparison: the model as each tool names it, the GPU as each names it, the workload and SLO."""

    aic_model: str
    servelab_model: str
    aic_system: str
    servelab_hw: str
    isl: int
    osl: int
    rate_rps: float
    ttft_ms: float
    tpot_ms: float


CASES = [
    Case("Qwen/Qwen3-32B", "qwen3-32b", "h200_sxm", "H200", 1024, 256, 10.0, 1000, 50),
    Case("meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b", "h100_sxm", "H100-80GB-SXM", 2048, 512, 20.0, 500, 30),
    Case("meta-llama/Meta-Llama-3.1-70B", "llama-3.1-70b", "h100_sxm", "H100-80GB-SXM", 1024, 256, 5.0, 2000, 60),
]


def run_aic(aic: Path, c: Case, out: Path) -> dict[str, str]:
    """AIConfigurator's rank-1 aggregated row for ``c`` (raises RuntimeError with its last lines)."""
    cmd = [
        str(aic),
        "cli",
        "recommend",
        "--model-path",
        c.aic_model,
        "--system",
        c.aic_system,
        "--backend",
        "vllm",
        "--isl",
        str(c.isl),
        "--osl",
        str(c.osl),
        "--target-request-rate",
        f"{c.rate_rps:g}",
        "--ttft",
        f"{c.ttft_ms:g}",
        "--tpot",
        f"{c.tpot_ms:g}",
        "--save-dir",
        str(out),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    rows = sorted(out.glob("**/agg/best_config_topn.csv"))
    if p.returncode != 0 or not rows:
        raise RuntimeError(f"aiconfigurator failed ({p.returncode}): {(p.stdout + p.stderr)[-600:]}")
    with rows[0].open() as f:
        return next(iter(csv.DictReader(f)))


def roofline_law(model: str, hw: str, tp: int, isl: int, osl: int) -> tuple[PerfParams, float] | None:
    """The continuous-batching law servelab's roofline implies for one TP-``tp`` replica, and the
    weights GiB per GPU; None when the weights do not fit. ``slots`` = sequences of ``isl + osl`` the
    KV pool holds (capped at ``MAX_NUM_SEQS``); decode gap ``g(b)`` = the roofline decode step at ``b``
    running (max of the bandwidth and FLOP floors), the line through ``b = 1`` and ``b = slots`` (a chord
    over a convex floor, so never below it); prefill = ``isl`` tokens at the prefill floor."""
    ctx = isl + osl
    base = estimate(model, hw, tp, ctx, 1, tp=tp, find_smallest=False)
    if not base.max_concurrent_sequences:
        return None
    slots = min(base.max_concurrent_sequences, MAX_NUM_SEQS)
    g1 = base.roofline.decode_step_s
    gb = estimate(model, hw, tp, ctx, slots, tp=tp, find_smallest=False).roofline.decode_step_s
    pre = estimate(model, hw, tp, isl, 1, tp=tp, find_smallest=False).roofline.prefill_s
    if pre is None:
        return None
    law = PerfParams(
        prefill_base_s=0.0,
        prefill_tokens_per_s=isl / pre,
        decode_base_s=g1,
        decode_per_running_s=(gb - g1) / (slots - 1) if slots > 1 else 0.0,
        slots=slots,
        slots_identified=True,
    )
    return law, base.device.weights_bytes / 2**30


def servelab_gpus(c: Case) -> dict[str, float | int | str]:
    """servelab's smallest GPU count for ``c`` over TP 1, 2, 4, 8 (module doc)."""
    profile = TrafficProfile(
        daily_active_users=1,
        requests_per_user_per_day=1,
        input_tokens=Lengths(mean=c.isl),
        output_tokens=Lengths(mean=c.osl),
        slo=[f"ttft_p50<={c.ttft_ms:g}ms", f"tpot_p50<={c.tpot_ms:g}ms"],
        headroom=0.0,
    )
    slo = parse_slo(",".join(profile.slo))
    best: dict[str, float | int | str] = {}
    for tp in (1, 2, 4, 8):
        try:
            got = roofline_law(c.servelab_model, c.servelab_hw, tp, c.isl, c.osl)
        except ConfigError:
            continue  # a layout the model cannot use (heads not divisible)
        if got is None:
            continue
        law, w_gib = got
        cap, _ = capacity(law, Workload(profile), slo)
        if cap <= 0:
            continue
        replicas = max(1, math.ceil(c.rate_rps / cap - 1e-9))
        gpus = replicas * tp
        if not best or gpus < int(best["gpus"]):
            best = {
                "gpus": gpus,
                "tp": tp,
                "replicas": replicas,
                "cap_rps": cap,
                "slots": law.slots,
                "weights_gib": w_gib,
                "g1_ms": law.decode_base_s * 1e3,
                "prefill_tps": law.prefill_tokens_per_s or 0.0,
            }
    return best


def roofline_tpot_ms(c: Case, tp: int, batch: int) -> float:
    """servelab's roofline TPOT floor (ms) for ``batch`` sequences of ``isl + osl`` at TP ``tp``."""
    return (
        estimate(
            c.servelab_model, c.servelab_hw, tp, c.isl + c.osl, batch, tp=tp, find_smallest=False
        ).roofline.decode_step_s
        * 1e3
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aic", type=Path, default=AIC_DEFAULT, help="the aiconfigurator executable")
    args = ap.parse_args()
    if not args.aic.exists():
        print(
            f"no aiconfigurator at {args.aic}; set it up: python3 -m venv ~/.cache/aic-venv && "
            "~/.cache/aic-venv/bin/pip install aiconfigurator==0.12.0",
            file=sys.stderr,
        )
        return 2
    ver = subprocess.run(
        [str(args.aic.parent / "pip"), "show", "aiconfigurator"], capture_output=True, text=True
    ).stdout
    print(
        f"aiconfigurator {next((ln.split()[1] for ln in ver.splitlines() if ln.startswith('Version')), '?')}, "
        f"backend vllm, agg rank 1 | servelab plan roofline + capacity simulation, SLO on P50, no headroom\n"
    )
    head = (
        f"{'case':<50} {'AIC GPUs':>8} {'AIC cfg':>14} {'servelab GPUs':>13} {'servelab cfg':>16} "
        f"{'ratio s/A':>9} {'AIC TPOT':>9} {'floor TPOT':>10} {'AIC/floor':>9}"
    )
    print(head)
    print("-" * len(head))
    details = []
    for c in CASES:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as d:
            a = run_aic(args.aic, c, Path(d))
        t_aic = time.monotonic() - t0
        t0 = time.monotonic()
        s = servelab_gpus(c)
        t_sl = time.monotonic() - t0
        a_gpus, a_tp, a_bs = int(a["total_gpus_needed"]), int(a["tp"]), int(float(a["bs"]))
        a_tpot = float(a["tpot"])
        floor = roofline_tpot_ms(c, a_tp, a_bs)
        name = f"{c.servelab_model}@{c.servelab_hw} {c.isl}/{c.osl} {c.rate_rps:g}rps {c.ttft_ms:g}/{c.tpot_ms:g}ms"
        a_cfg = f"{a['replicas_needed']}x tp{a_tp} bs{a_bs}"
        s_cfg = f"{s['replicas']}x tp{s['tp']} slots{s['slots']}" if s else "-"
        s_gpus = int(s["gpus"]) if s else 0
        print(
            f"{name:<50} {a_gpus:>8} {a_cfg:>14} {s_gpus or '-':>13} {s_cfg:>16} "
            f"{(s_gpus / a_gpus if s_gpus else float('nan')):>9.2f} {a_tpot:>7.1f}ms {floor:>8.1f}ms "
            f"{a_tpot / floor:>9.2f}"
        )
        details.append((c, a, s, t_aic, t_sl))
    print("\nwhat each number rests on:")
    for c, a, s, t_aic, t_sl in details:
        print(
            f"- {c.servelab_model} on {c.servelab_hw}: AIConfigurator ({t_aic:.0f} s): "
            f"{float(a['seq/s']):.2f} req/s per replica x {a['replicas_needed']} = {a['total_gpus_needed']} GPUs "
            f"at TTFT {float(a['ttft']):.0f} ms, TPOT {float(a['tpot']):.1f} ms, "
            f"{float(a['memory']):.1f} GB per GPU, from its {a['version']} vllm kernel tables for {a['system']}."
        )
        if s:
            print(
                f"  servelab ({t_sl:.0f} s): weights {s['weights_gib']:.1f} GiB/GPU at tp{s['tp']}, KV holds "
                f"{s['slots']} sequences of {c.isl + c.osl} tokens; roofline law: decode gap {s['g1_ms']:.2f} ms "
                f"at 1 running, prefill {s['prefill_tps']:.0f} tok/s -> {s['cap_rps']:.2f} req/s per replica "
                "meeting the SLO in simulation (a floor on time: GPUs are a lower bound, no GPU measured)."
            )
        else:
            print("  servelab: no TP up to 8 meets the SLO even on the roofline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
