"""Hardware catalog: every row sourced and dated, units consistent, lookups and NAME[:COUNT] parsing."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from servelab.catalog import find_hardware, load_hardware
from servelab.catalog.hardware import HARDWARE_FILE, parse_hardware_spec
from servelab.catalog.schema import PRECISIONS, HardwareCatalog, load_yaml_catalog
from servelab.wire.errors import ConfigError

REQUIRED = {
    "H100-80GB-SXM",
    "H100-80GB-PCIe",
    "H200",
    "B200",
    "A100-80GB",
    "A100-40GB",
    "L40S",
    "L4",
    "A10G",
    "RTX-4090",
    "RTX-3090",
    "MI300X",
    "MI325X",
    "M3-Max",
    "M4-Max",
    "laptop-cpu",
    "Xeon-8480+",
    "EPYC-9654",
    "cpu-host",
}


def test_required_devices_present():
    assert {h.name for h in load_hardware()} >= REQUIRED


def test_every_raw_row_has_source_and_checked():
    raw = yaml.safe_load(HARDWARE_FILE.read_text(encoding="utf-8"))["hardware"]
    for row in raw:
        assert str(row.get("source", "")).startswith("https://"), row["name"]
        assert isinstance(row.get("checked"), dt.date), row["name"]


def test_row_without_source_is_rejected(tmp_path):
    raw = yaml.safe_load(HARDWARE_FILE.read_text(encoding="utf-8"))
    del raw["hardware"][0]["source"]
    p = tmp_path / "hw.yaml"
    p.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"hardware\[0\]\.source: required field is missing"):
        load_yaml_catalog(p, HardwareCatalog)


def test_duplicate_alias_is_rejected(tmp_path):
    raw = yaml.safe_load(HARDWARE_FILE.read_text(encoding="utf-8"))
    raw["hardware"][1]["aliases"].append("H100")  # already an alias of H100-80GB-SXM
    p = tmp_path / "hw.yaml"
    p.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match="must be unique"):
        load_yaml_catalog(p, HardwareCatalog)


def test_datasheet_values_dense_not_sparse():
    h100 = find_hardware("H100")
    # NVIDIA's H100 SXM page: BF16 1,979 TFLOPS *with sparsity* -> 989.5 dense; FP8 3,958 -> 1,979.
    assert h100.dense_tflops["bf16"] == pytest.approx(989.5)
    assert h100.dense_tflops["fp8"] == pytest.approx(1979)
    assert h100.memory_bandwidth_gbps == 3350 and h100.memory_gib == 80
    assert h100.interconnect.bandwidth_gbps == 450  # 900 GB/s bidirectional / 2
    # H200 = same compute, more and faster memory
    h200 = find_hardware("H200")
    assert h200.dense_tflops == h100.dense_tflops and h200.memory_gib > h100.memory_gib
    assert "fp8" not in find_hardware("A100-80GB").dense_tflops  # Ampere: no FP8 tensor cores
    assert find_hardware("B200").dense_tflops["fp4"] == pytest.approx(2 * find_hardware("B200").dense_tflops["fp8"])


def test_units_are_plausible():
    for h in load_hardware():
        assert set(h.dense_tflops) <= set(PRECISIONS)
        # dense bf16 never above fp8, fp8 never above fp4 where given
        tf = h.dense_tflops
        if "bf16" in tf and "fp8" in tf:
            assert tf["fp8"] >= tf["bf16"], h.name
        assert 1 <= h.memory_gib <= 1024, h.name
        assert 10 <= h.memory_bandwidth_gbps <= 20000, h.name
        if h.kind in ("apple", "cpu"):
            assert h.interconnect.kind in ("none", "upi")
        # every estimate is explained in the notes
        if h.estimated:
            assert h.notes, h.name


def test_cpu_host_bandwidth_is_a_stated_assumption():
    host = find_hardware("cpu-host")
    assert "memory_bandwidth_gbps" in host.estimated
    assert any("assumption" in n for n in host.notes)


def test_find_by_alias_and_spacing():
    assert find_hardware("h100 80gb").name == "H100-80GB-SXM"
    assert find_hardware("RTX4090").name == "RTX-4090"
    assert find_hardware("4090").name == "RTX-4090"


def test_unknown_name_suggests_nearest():
    with pytest.raises(ConfigError) as ei:
        find_hardware("H100-80G")
    msg = str(ei.value)
    assert "did you mean" in msg and "H100-80GB-SXM" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "spec,name,count",
    [("H100-80GB:2", "H100-80GB-SXM", 2), ("laptop-cpu", "laptop-cpu", 1), (" MI300X : 8 ", "MI300X", 8)],
)
def test_parse_spec(spec, name, count):
    hw, n = parse_hardware_spec(spec)
    assert (hw.name, n) == (name, count)


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("H100:two", "whole number"),
        ("H100:0", "whole number"),
        ("H100:-1", "whole number"),
        ("H100:2:3", "NAME[:COUNT]"),
        (":2", "NAME[:COUNT]"),
        ("", "NAME[:COUNT]"),
        ("H100:100000", "beyond"),
    ],
)
def test_parse_spec_errors_are_one_line(spec, needle):
    with pytest.raises(ConfigError) as ei:
        parse_hardware_spec(spec)
    assert needle in str(ei.value) and "\n" not in str(ei.value)
