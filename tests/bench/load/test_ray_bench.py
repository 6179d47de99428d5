"""``servelab bench --ray`` on a real local Ray cluster: a head and a second node, each its own
``ray start --block`` process on this machine (1 CPU each, small memory: fits a 2-core CI box), so one
load-generator actor lands on each node. Checks merged counts against the mock's own count, the open-loop
schedule against a single process with the same seed, and percentiles against the concatenated records.
The cluster (tests/raycluster.py) is torn down at the end, every process of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import raycluster
from test_bench_workers import assert_pooled_percentiles, bench, intended_offsets, load, mock_requests


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """``HOST:PORT`` of a two-node Ray cluster on this machine (tests/raycluster.py)."""
    with raycluster.ray_cluster() as address:
        yield address


def test_ray_open_loop_merged_like_one_process(ray_cluster, mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "3", "--itl-ms", "2", "--output-tokens", "8")
    one, two = tmp_path / "one", tmp_path / "ray"
    common = [
        "--url",
        m.base_url,
        "--rate",
        "30",
        "--arrival",
        "poisson",
        "--requests",
        "36",
        "--warmup",
        "2",
        "--seed",
        "7",
    ]
    r = bench(*common, "--out", str(one))
    assert r.returncode == 0, r.stderr
    before = mock_requests(m.root)
    r = bench(*common, "--ray", ray_cluster, "--workers", "2", "--out", str(two), timeout=300)
    assert r.returncode == 0, r.stderr
    summary, lines = load(two)
    gen = summary["generator"]
    assert gen["mode"] == "ray" and gen["ray_address"] == ray_cluster
    assert len({w["node_id"] for w in gen["workers"]}) == 2  # one actor on each node
    assert all(w["same_clock"] and w["rtt_s"] > 0 and w["wall_offset_s"] is not None for w in gen["workers"])
    # merged counts equal the requests sent, by the mock's own count
    assert mock_requests(m.root) - before == len(lines) == 36 + 2
    s = summary["steps"][0]
    assert s["counts"]["submitted"] == 36 == sum(w["finished"] for w in s["workers"])
    assert {x["worker"] for x in lines if not x["warmup"]} == {0, 1}
    # one global schedule: the same intended send times as the single process, to the nanosecond
    assert intended_offsets(lines, "r30") == intended_offsets(load(one)[1], "r30")
    assert_pooled_percentiles(s, lines)
    assert all(w["cpu_fraction"] is not None for w in s["workers"])


def test_ray_closed_loop_per_node(ray_cluster, mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "3", "--itl-ms", "2", "--output-tokens", "8")
    out = tmp_path / "run"
    r = bench(
        "--url",
        m.base_url,
        "--ray",
        ray_cluster,
        "--workers-per-node",
        "1",
        "--concurrency",
        "4",
        "--requests",
        "24",
        "--warmup",
        "0",
        "--out",
        str(out),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    assert mock_requests(m.root) == len(lines) == 24
    s = summary["steps"][0]
    assert [(w["concurrency"], w["assigned"], w["finished"]) for w in s["workers"]] == [(2, 12, 12), (2, 12, 12)]
    assert_pooled_percentiles(s, lines)
