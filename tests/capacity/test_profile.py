"""The traffic profile: the example loads, its schema is current, and every bad value is one line
(exit 2, no traceback) naming the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servelab.capacity.profile import PUBLISHED_SCHEMA, load_profile
from servelab.wire.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "traffic.yaml"


def test_example_loads_and_schema_is_current() -> None:
    p = load_profile(EXAMPLE)
    assert p.tiers == {"small": "np1", "strong": "np4"} and abs(sum(t.share for t in p.tasks) - 1) < 1e-9
    assert PUBLISHED_SCHEMA.problem() is None


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"daily_active_users": 0}, "daily_active_users"),
        ({"peak_to_mean": 0.5}, "peak_to_mean"),
        ({"hourly_shape": [1.0] * 24}, "not both"),
        ({"input_tokens": {"mean": 100, "p95": 50}}, "below the mean"),
        ({"input_tokens": {"mean": 100, "p95": 1000}}, "no lognormal"),
        ({"output_tokens": {"values": [0, 3]}}, ">= 1"),
        ({"retry_rate": 1.5}, "retry_rate"),
        ({"slo": ["ttft_p95<=fast"]}, "invalid SLO"),
        ({"tasks": [{"name": "a", "share": 0.5, "tier": "small"}]}, "add up to 0.5"),
        ({"tasks": [{"name": "a", "share": 1.0, "tier": "huge"}]}, "'huge'"),
        ({"long_share": 0.2, "long_input_tokens": None}, "long_input_tokens"),
        ({"dayly_active_users": 3}, "dayly_active_users"),
        # NaN and infinity are named as such, not as out of range ('less than or equal to 1000, got nan')
        ({"peak_to_mean": float("nan")}, "peak_to_mean: input should be a finite number"),
        ({"stream_hold_s": float("inf")}, "stream_hold_s: input should be a finite number"),
        ({"input_tokens": {"mean": float("nan")}}, "input_tokens.mean: input should be a finite number"),
    ],
)
def test_bad_value_is_one_line(tmp_path: Path, change: dict, needle: str) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data.update(change)
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_profile(f)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_cli_bad_profile_exit_2_one_line(tmp_path: Path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text("daily_active_users: -3\n")
    r = subprocess.run([sys.executable, "-m", "servelab.cli", "capacity", str(f)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("servelab: error: ") and "daily_active_users" in r.stderr
