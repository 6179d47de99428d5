"""Golden record of the trial's decision: recorded bench outputs fed through the decision code give the
decision and the figures frozen in fixtures/golden/expected/ (issue 22's acceptance: the same inputs
through the old and the new decision code give the same decision and figures).

Each case (fixtures/golden/cases/) is a recorded trial cut down to the decision's inputs, its derived
figures cleared: a real llama-server trial, two mock-engine trials and the schema-version-1 fixture
run. The test recomputes the effective step, the arrival-run verdicts and the decision
(fixtures/golden/make_golden.py ``outcome``, the trial's own order of calls) and compares every field:
strings, booleans, ``None`` and list lengths exactly, dict keys in order, floats to a relative
tolerance of 1e-9 (room for a reordered sum, none for a changed rule). A deliberate change of the
decision's output rewrites the expected files with ``make_golden.py`` and says so in its commit."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
REL_TOL = 1e-9
ABS_TOL = 1e-12


def _make_golden() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_golden", mod)
    spec.loader.exec_module(mod)
    return mod


MG = _make_golden()
CASES = sorted(p.stem for p in (GOLDEN / "cases").glob("*.json"))


def mismatches(got: object, want: object, path: str = "$") -> list[str]:
    """Every place where ``got`` differs from ``want`` (JSON values), as ``path: got != want``."""
    if isinstance(want, bool) or want is None or isinstance(want, str):
        return [] if type(got) is type(want) and got == want else [f"{path}: {got!r} != {want!r}"]
    if isinstance(want, (int, float)):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return [f"{path}: {got!r} != {want!r}"]
        ok = math.isclose(float(got), float(want), rel_tol=REL_TOL, abs_tol=ABS_TOL)
        return [] if ok else [f"{path}: {got!r} != {want!r}"]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{path}: {len(got) if isinstance(got, list) else got!r} items != {len(want)}"]
        return [m for i, (g, w) in enumerate(zip(got, want, strict=True)) for m in mismatches(g, w, f"{path}[{i}]")]
    assert isinstance(want, dict), path
    if not isinstance(got, dict) or list(got) != list(want):
        return [f"{path}: keys {list(got) if isinstance(got, dict) else got!r} != {list(want)}"]
    return [m for k in want for m in mismatches(got[k], want[k], f"{path}.{k}")]


def _recompute(name: str) -> object:
    case = MG.read_case(GOLDEN / "cases" / f"{name}.json")
    return json.loads(MG.outcome(case).model_dump_json())


def _expected(name: str) -> object:
    return json.loads((GOLDEN / "expected" / f"{name}.json").read_text(encoding="utf-8"))


def test_every_case_has_its_expected_outcome() -> None:
    assert len(CASES) >= 4, CASES
    assert sorted(p.stem for p in (GOLDEN / "expected").glob("*.json")) == CASES


@pytest.mark.parametrize("name", CASES)
def test_decision_matches_the_golden_record(name: str) -> None:
    got, want = _recompute(name), _expected(name)
    bad = mismatches(got, want)
    assert not bad, f"{len(bad)} difference(s) from fixtures/golden/expected/{name}.json:\n" + "\n".join(bad[:20])


def test_the_cases_cover_the_decisions_paths() -> None:
    """The golden record holds an adopt, backups, exclusions, a tie-break, a significant difference,
    a difference with too few samples, cost, replicas and an arrival verdict: a change to any of these
    paths shows."""
    texts, verdicts = [], set()
    for name in CASES:
        d = _expected(name)
        assert isinstance(d, dict)
        verdicts.update(v["verdict"] for v in d["decision"]["verdicts"].values())
        texts.append(json.dumps(d, ensure_ascii=False))
    blob = "\n".join(texts)
    assert verdicts == {"adopt", "backup", "exclude"}
    for phrase in (
        "by the tie-break",
        "sustains",
        "too few samples",
        "per 10k output tokens",
        "replica(s)",
        "at the expected rate",
        "error rate",
        "smoke",
        "broke",
    ):
        assert phrase in blob, phrase


def test_a_changed_figure_is_caught() -> None:
    """The comparison is not blind: one step's throughput moved by 1 % changes the outcome."""
    case = MG.read_case(GOLDEN / "cases" / "mock-three.json")
    for s in case.candidates["fast"].steps:
        if s.steady is not None and s.steady.blocks:
            s.steady.blocks = [b * 1.01 for b in s.steady.blocks]
    got = json.loads(MG.outcome(case).model_dump_json())
    assert mismatches(got, _expected("mock-three"))
    assert not mismatches(_expected("mock-three"), _expected("mock-three"))
