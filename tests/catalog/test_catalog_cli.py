"""`servelab catalog engines|hardware|models` through the real console script's entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servelab.catalog import load_engines, load_hardware


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], capture_output=True, text=True, timeout=120)


def test_engines_lifecycle_shows_tgi_not_for_new_platforms():
    r = run("catalog", "engines", "--lifecycle")
    assert r.returncode == 0, r.stderr
    tgi = [ln for ln in r.stdout.splitlines() if "│ tgi " in ln]
    assert tgi, r.stdout
    assert "archived" in tgi[0] and "2026-03-21" in tgi[0] and "NO" in tgi[0]
    assert "github.com/huggingface/text-gen" in r.stdout
    # non-active rows come first
    rows = [ln.split("│")[1].strip() for ln in r.stdout.splitlines() if ln.startswith("│") and ln.split("│")[1].strip()]
    assert rows[0] == "tgi"


def test_engines_json_is_the_catalog():
    r = run("catalog", "engines", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [d["name"] for d in data] == [e.name for e in load_engines()]
    tgi = next(d for d in data if d["name"] == "tgi")
    assert tgi["lifecycle"]["status"] == "archived" and tgi["lifecycle"]["since"] == "2026-03-21"
    assert all(d["source"] and d["checked"] for d in data)


def test_engines_table():
    r = run("catalog", "engines")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = next(n for n, ln in enumerate(lines) if "│ tgi " in ln)
    cell = " ".join(ln.split("│")[7].strip() for ln in lines[i : i + 4])  # the lifecycle column, folded
    assert cell.startswith("archived since 2026-03-21: not for new platforms"), cell
    assert "audio → text" in r.stdout  # whisper routes: input and output modalities apart


def test_hardware_table_and_json():
    r = run("catalog", "hardware")
    assert r.returncode == 0, r.stderr
    assert "H100-80GB-SXM" in r.stdout and "989.5" in r.stdout and "cpu-host" in r.stdout
    r = run("catalog", "hardware", "--json")
    data = json.loads(r.stdout)
    assert len(data) == len(load_hardware())
    h = next(d for d in data if d["name"] == "MI300X")
    assert h["memory_gib"] == 192 and h["dense_tflops"]["fp8"] == pytest.approx(2614.9)


def test_models_lists_the_model_catalog():
    r = run("catalog", "models", "--json")
    assert r.returncode == 0, r.stderr
    names = {d["name"] for d in json.loads(r.stdout)}
    assert "qwen3-32b" in names
    r = run("catalog", "models")
    assert r.returncode == 0 and "qwen3-32b" in r.stdout


def test_unknown_subcommand_is_an_error():
    r = run("catalog", "gpus")
    assert r.returncode != 0
