"""The gates of a chat candidate before any load: the smoke tests, then the quality gate (business
samples checked by regex or JSON schema, and the schema-valid share of the structured set), within the
trial budget (:mod:`servelab.trial.quality_budget`)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from servelab.bench.load.step import LoadModel
from servelab.bench.results import RequestLine
from servelab.trial.console import gate_line
from servelab.trial.context import TrialContext
from servelab.trial.flows.chat.benching import ChatBench
from servelab.trial.flows.chat.smoke import model_name, send_one, smoke
from servelab.trial.goal import Sample
from servelab.trial.results import CandidateResult, JsonObject, Quality, QualityCheck, SmokeCheck
from servelab.trial.workloads import experiment_workloads
from servelab.wire.client import make_session
from servelab.wire.types import RequestSpec

__all__ = ["QualityGate"]


class QualityGate:
    """Smoke tests and the quality gate of one candidate after another (``ctx``: the trial's)."""

    def __init__(self, ctx: TrialContext, bench: ChatBench) -> None:
        self.ctx, self.bench = ctx, bench

    def smoke(
        self, base_url: str, model: str | None, checks: tuple[str, ...], api_key: str | None, path: Path
    ) -> dict[str, SmokeCheck]:
        """Smoke tests; returns ``{check: SmokeCheck}`` (docs/record-schema.md) and writes
        every smoke request to ``path`` (JSONL, the requests.jsonl format)."""
        return asyncio.run(smoke(base_url, model, checks, api_key, path, self.ctx.exp.timeout_s))

    def quality(self, base_url: str, model: str | None, cand_dir: Path, api_key: str | None) -> Quality:
        """Quality gate: business samples (regex/schema checks, ``goal.quality.samples``) and the
        schema-valid share of ``goal.quality.structured_requests`` requests of the structured set,
        within the trial budget (:mod:`servelab.trial.quality_budget`: each request estimated from
        the first measured one; what does not fit is skipped, recorded in ``method.budget`` as
        ``CANDIDATE/quality/...``, and its check is undetermined, so the gate is not passed)."""
        from servelab.trial.quality_budget import first_timing

        q = self.ctx.exp.goal.quality
        name = cand_dir.name
        checks: list[QualityCheck] = []
        samples_path = cand_dir / "quality.jsonl"  # docs/record-schema.md: the quality-gate sample requests
        samples_path.write_bytes(b"")
        timing = first_timing(cand_dir / "smoke.jsonl")
        if q.samples:
            res = asyncio.run(
                _samples(
                    base_url,
                    model,
                    q.samples,
                    api_key,
                    samples_path,
                    self.ctx.exp.timeout_s,
                    fits=self.ctx.budget.allows,
                )
            )
            timing = res.timing or timing
            check = _gate("samples_pass_fraction", res.fraction, q.samples_pass_min)
            if res.ran < len(q.samples):
                self.ctx.budget.skip(f"{name}/quality/samples[{res.ran}:]")
                check = _undetermined(check, res.ran, len(q.samples), res.estimate_s)
            checks.append(check)
        if "structured" in [w.label for w in self.ctx.exp.workloads]:
            structured = experiment_workloads(self.ctx.exp, self.ctx.counter)("structured", self.ctx.exp.seed + 424242)
            caps = [sp.max_tokens for sp in structured.requests(q.structured_requests)]
            est = sum(timing.request_s(m) for m in caps) if timing is not None else 0.0
            if not self.ctx.budget.allows(est):
                self.ctx.budget.skip(f"{name}/quality/structured")
                checks.append(
                    _undetermined(
                        QualityCheck(name="structured_valid_fraction", value=None, limit=q.structured_valid_min),
                        0,
                        len(caps),
                        est,
                    )
                )
                return Quality(passed=False, undetermined=True, checks=checks)
            s = self.bench.run(
                base_url,
                model,
                cand_dir / "quality",
                workloads=["structured"],
                load=[LoadModel(kind="closed", concurrency=1)],
                requests=q.structured_requests,
                warmup=0,
                objectives=[],
                stop_on_slo=False,
                seed=self.ctx.exp.seed + 424242,
                api_key=api_key,
                seeded=True,
            )
            c = s.steps[0].counts
            valid = c.submitted - c.failed_total - _schema_failures(cand_dir / "quality" / "requests.jsonl")
            frac = valid / c.submitted if c.submitted else 0.0
            checks.append(_gate("structured_valid_fraction", frac, q.structured_valid_min))
        undetermined = any(c.undetermined for c in checks)
        return Quality(passed=not undetermined and all(c.ok for c in checks), undetermined=undetermined, checks=checks)

    def gates(
        self,
        name: str,
        base_url: str,
        model: str | None,
        api_key: str | None,
        result: CandidateResult,
        files: dict[str, str],
    ) -> bool:
        """Smoke tests, then the quality gate, into ``result`` (and their request files into ``files``);
        ``False`` (with ``result`` excluded and its reason) when one failed."""
        cdir = self.ctx.out / "candidates" / name
        smoke = result.smoke = self.smoke(
            base_url, model, tuple(self.ctx.exp.goal.quality.smoke), api_key, cdir / "smoke.jsonl"
        )
        files["smoke"] = f"candidates/{name}/smoke.jsonl"
        bad = [k for k, v in smoke.items() if not v.ok]
        if bad:
            result.status = "excluded"
            result.reason = "smoke test failed: " + "; ".join(f"{k}: {smoke[k].detail}" for k in bad)
            self.ctx.say(f"[{name}] excluded: {result.reason}")
            return False
        self.ctx.say(f"[{name}] smoke tests passed: {', '.join(smoke)}")
        quality = result.quality = self.quality(base_url, model, cdir, api_key)
        files["quality"] = f"candidates/{name}/quality.jsonl"
        if (cdir / "quality" / "requests.jsonl").exists():
            files["quality_structured"] = f"candidates/{name}/quality/requests.jsonl"
        self.ctx.say(gate_line(name, quality.checks))
        if quality.undetermined:
            result.status = "excluded"
            result.reason = (
                "quality gate undetermined: it could not finish within the trial budget "
                "(goal.budget.max_minutes), so it was not passed: "
                + "; ".join(f"{c.name}: {c.note}" for c in quality.checks if c.undetermined)
            )
            self.ctx.say(f"[{name}] excluded: {result.reason}")
            return False
        if not quality.passed:
            result.status = "excluded"
            result.reason = "quality gate failed: " + "; ".join(
                f"{c.name} {c.value or 0:.2f} < {c.limit or 0:.2f}" for c in quality.checks if not c.ok
            )
            self.ctx.say(f"[{name}] excluded: {result.reason}")
            return False
        return True


def _gate(name: str, value: float, minimum: float) -> QualityCheck:
    """A quality-gate figure against its minimum; a minimum of 0 cannot fail: ``informational``."""
    informational = minimum <= 0
    return QualityCheck(
        name=name, value=value, limit=minimum, ok=informational or value >= minimum, informational=informational
    )


def _undetermined(check: QualityCheck, ran: int, planned: int, estimate_s: float) -> QualityCheck:
    """``check`` marked undetermined: only ``ran`` of its ``planned`` requests fitted in the trial
    budget (the next one estimated at ``estimate_s`` seconds, :mod:`servelab.trial.quality_budget`)."""
    return check.model_copy(
        update={
            "ok": False,
            "undetermined": True,
            "ran": ran,
            "planned": planned,
            "note": f"{ran} of {planned} requests ran; the rest (estimated {estimate_s:.0f} s from the first measured "
            f"gate request) did not fit in the trial budget: not run",
        }
    )


def _schema_failures(jsonl: Path) -> int:
    """Measured, succeeded requests of a ``requests.jsonl`` whose answer was not schema-valid JSON."""
    n = 0
    with open(jsonl, "rb") as f:
        for raw in f:
            d = RequestLine.model_validate_json(raw)
            if not d.warmup and d.failure is None and {"json_invalid", "json_schema_mismatch"} & set(d.gate_failures):
                n += 1
    return n


class _SamplesRun(NamedTuple):
    fraction: float  # passed / ran (1.0 when none ran)
    ran: int
    timing: Any  # trial.quality_budget.GateTiming of the first sample, or None
    estimate_s: float = 0.0  # the estimate of the first sample not run


async def _samples(
    base_url: str,
    model: str | None,
    samples: list[Sample],
    api_key: str | None,
    path: Path,
    timeout_s: float,
    fits: Callable[[float], bool] | None = None,
) -> _SamplesRun:
    """Send each business sample (``timeout_s`` per request); each request is written to ``path`` with
    ``workload`` ``sample:<name>`` (``s<index>`` when unnamed). ``fits``: asked before each sample after
    the first with its estimated seconds (:class:`servelab.trial.quality_budget.GateTiming` of the first);
    ``False`` stops there. Returns the fraction that passed of those that ran, how many ran, the timing."""
    from servelab.bench.load.lines import record_to_json
    from servelab.trial.quality_budget import GateTiming

    passed = 0
    timing: GateTiming | None = None
    async with make_session() as session:
        m = await model_name(session, base_url, model, api_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for i, s in enumerate(samples):
                est = timing.request_s(s.max_tokens) if timing is not None else 0.0
                if i > 0 and fits is not None and not fits(est):
                    return _SamplesRun(passed / i, i, timing, est)
                schema = s.expect_json_schema
                extra: JsonObject = {"temperature": 0}
                if schema:
                    extra["response_format"] = {
                        "type": "json_schema",
                        "json_schema": {"name": "sample", "schema": schema, "strict": True},
                    }
                msgs = s.messages or [{"role": "user", "content": s.prompt}]
                spec = RequestSpec(endpoint="chat", max_tokens=s.max_tokens, messages=msgs, extra=extra)
                r = await send_one(
                    session, base_url, m, spec, api_key, i, timeout_s=timeout_s, workload=f"sample:{s.name or f's{i}'}"
                )
                ok = r.failure is None and re.search(s.expect_regex or "", r.content_text) is not None
                if ok and schema:
                    ok = json_valid(r.content_text, schema)
                passed += ok
                f.write(record_to_json(r, sample_passed=bool(ok)).to_json_bytes() + b"\n")
                timing = timing or GateTiming.of(r)
    return _SamplesRun(passed / len(samples) if samples else 1.0, len(samples), timing)


def json_valid(text: str, schema: JsonObject) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False
