"""A traffic profile's lengths from evidence (``lengths_from``): a Mooncake trace's input/output
columns and a trial run folder's server-reported usage become the profile's empirical samples, a
declared side still wins, and a missing source is one line naming it. In-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.capacity.profile import load_profile
from servelab.wire.errors import ConfigError

REAL = Path(__file__).parent / "fixtures" / "llamacpp-slots"
HEAD = "daily_active_users: 1000\nrequests_per_user_per_day: 4\npeak_to_mean: 2\n"


def test_lengths_from_a_trace(tmp_path: Path) -> None:
    rows = [
        {"timestamp": i * 100, "input_length": 100 * (i + 1), "output_length": 10 + i, "hash_ids": [i]}
        for i in range(5)
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "p.yaml").write_text(HEAD + "lengths_from: {trace: t.jsonl}\n")
    p = load_profile(tmp_path / "p.yaml")
    assert p.inputs().values == [100, 200, 300, 400, 500] and p.outputs().values == [10, 11, 12, 13, 14]


def test_lengths_from_a_run_folder_and_a_declared_side_wins(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(HEAD + f"lengths_from: {{run: {REAL}}}\noutput_tokens: {{mean: 50}}\n")
    p = load_profile(tmp_path / "p.yaml")
    want = []
    for f in sorted(REAL.rglob("requests.jsonl")):
        want += [json.loads(x)["prompt_tokens"] for x in f.read_text().splitlines() if x.strip()]
    assert p.inputs().values == want and len(want) > 200
    assert p.outputs().values is None and p.outputs().mean == 50


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("lengths_from: {trace: nope.jsonl}\n", "lengths_from.trace"),
        ("lengths_from: {run: nope}\n", "p.yaml: lengths_from.run "),
        ("lengths_from: {}\n", "one of trace or run"),
        ("", "input_tokens and output_tokens, or lengths_from"),
    ],
)
def test_bad_lengths_source_is_one_line(tmp_path: Path, extra: str, needle: str) -> None:
    (tmp_path / "p.yaml").write_text(HEAD + extra)
    with pytest.raises(ConfigError) as e:
        load_profile(tmp_path / "p.yaml")
    assert needle in str(e.value) and "\n" not in str(e.value)
