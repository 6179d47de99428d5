"""The smoke tests of a chat candidate: the sub-features the service needs (streaming, usage in the
stream, JSON-schema output, stop strings, and the more of :mod:`servelab.trial.smoke_more`), each
request written to the candidate's ``smoke.jsonl``."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from servelab.trial.results import SmokeCheck
from servelab.trial.smoke_more import MORE_CHECKS, more_checks
from servelab.wire.client import make_session, send
from servelab.wire.types import RequestRecord, RequestSpec

__all__ = ["fail_text", "model_name", "send_one", "smoke"]

_SMOKE_SCHEMA = {
    "type": "object",
    "properties": {"capital": {"type": "string", "maxLength": 40}, "certain": {"type": "boolean"}},
    "required": ["capital", "certain"],
    "additionalProperties": False,
}


async def send_one(
    session: Any,
    base_url: str,
    model: str,
    spec: RequestSpec,
    api_key: str | None,
    i: int,
    sent: list[RequestRecord] | None = None,
    *,
    timeout_s: float,
    workload: str = "smoke",
) -> RequestRecord:
    """Send one gate request (``timeout_s``: the experiment's per-request timeout, seconds); ``sent``
    collects the record before it is sent, so a request that raises is still written."""
    rec = RequestRecord(request_id=i, workload=workload)
    hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
    if sent is not None:
        sent.append(rec)
    await send(session, base_url, model, spec, rec, timeout_s=timeout_s, headers=hdrs)
    return rec


async def model_name(session: Any, base_url: str, model: str | None, api_key: str | None) -> str:
    from servelab.wire.preflight import preflight

    hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
    m, _ = await preflight(session, base_url, model, hdrs)
    return m


async def smoke(
    base_url: str, model: str | None, checks: tuple[str, ...], api_key: str | None, path: Path, timeout_s: float
) -> dict[str, SmokeCheck]:
    """The smoke checks; every request sent is written to ``path`` (JSONL, requests.jsonl format), also
    when a check raises."""
    sent: list[RequestRecord] = []
    try:
        return await _smoke_checks(base_url, model, checks, api_key, sent, timeout_s)
    finally:
        from servelab.bench.load.lines import record_to_json

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(record_to_json(r).to_json_bytes() + b"\n" for r in sent))


async def _smoke_checks(
    base_url: str,
    model: str | None,
    checks: tuple[str, ...],
    api_key: str | None,
    sent: list[RequestRecord],
    timeout_s: float,
) -> dict[str, SmokeCheck]:
    import jsonschema

    res: dict[str, SmokeCheck] = {}
    async with make_session() as session:
        m = await model_name(session, base_url, model, api_key)
        story = RequestSpec(
            endpoint="chat",
            max_tokens=40,
            extra={"temperature": 0},
            messages=[{"role": "user", "content": "Write a short story about a cat."}],
        )
        r = await send_one(session, base_url, m, story, api_key, 0, sent, timeout_s=timeout_s)
        if "streaming" in checks:
            ok = r.failure is None and len(r.chunk_ns) >= 2 and r.finish_reason is not None
            res["streaming"] = SmokeCheck(
                ok=ok,
                detail=(
                    f"{len(r.chunk_ns)} token chunks, finish {r.finish_reason}" if r.failure is None else fail_text(r)
                ),
            )
        if "usage" in checks:
            ok = r.failure is None and r.output_tokens_source == "usage"
            res["usage"] = SmokeCheck(
                ok=ok,
                detail=(
                    f"usage.completion_tokens={r.output_tokens}"
                    if ok
                    else "no usage in the stream (stream_options.include_usage ignored)"
                    if r.failure is None
                    else fail_text(r)
                ),
            )
        if "json_schema" in checks:
            detail = ""
            ok = False
            for attempt in range(3):  # support is shown by one valid answer; a small model may ramble
                spec = RequestSpec(
                    endpoint="chat",
                    max_tokens=128,
                    extra={
                        "temperature": 0 if attempt == 0 else 0.7,
                        "seed": attempt,  # retries must differ
                        "response_format": {
                            "type": "json_schema",
                            "json_schema": {"name": "answer", "schema": _SMOKE_SCHEMA, "strict": True},
                        },
                    },
                    messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
                )
                jr = await send_one(session, base_url, m, spec, api_key, 10 + attempt, sent, timeout_s=timeout_s)
                if jr.failure is not None:
                    detail = fail_text(jr)
                    continue
                try:
                    jsonschema.validate(json.loads(jr.content_text), _SMOKE_SCHEMA)
                    ok, detail = True, f"valid on try {attempt + 1}: {jr.content_text[:60]!r}"
                    break
                except (ValueError, jsonschema.ValidationError) as e:
                    detail = f"answer not valid against the schema ({type(e).__name__}): {jr.content_text[:60]!r}"
            res["json_schema"] = SmokeCheck(ok=ok, detail=detail)
        if "stop" in checks:
            res["stop"] = await _stop_check(session, base_url, m, r, story, api_key, sent, timeout_s)
        if any(c in MORE_CHECKS for c in checks):  # tools, reasoning, cancellation (trial/smoke_more.py)

            def one(spec: RequestSpec, i: int) -> Awaitable[RequestRecord]:
                return send_one(session, base_url, m, spec, api_key, i, sent, timeout_s=timeout_s)

            hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
            res.update(await more_checks(session, base_url, m, checks, one, hdrs, timeout_s))
    return res


async def _stop_check(
    session: Any,
    base_url: str,
    m: str,
    r: RequestRecord,
    story: RequestSpec,
    api_key: str | None,
    sent: list[RequestRecord] | None = None,
    timeout_s: float = 120.0,
) -> SmokeCheck:
    """Greedy decoding twice: the second time with a stop string taken from the first answer's middle;
    the engine must end the answer right before it, with finish reason ``stop``."""
    text = r.content_text
    if r.failure is not None or len(text) < 8:
        return SmokeCheck(ok=False, detail="no reference answer to take a stop string from")
    rng = random.Random(0)
    piece, k = "", -1
    for _ in range(50):
        k = rng.randrange(len(text) // 3, max(len(text) // 3 + 1, len(text) - 3))
        piece = text[k : k + 3]
        if piece.strip() and text.find(piece) == k:
            break
    else:
        return SmokeCheck(ok=False, detail="no unique stop string in the reference answer")
    spec = RequestSpec(
        endpoint="chat", max_tokens=story.max_tokens, messages=story.messages, extra={**story.extra, "stop": [piece]}
    )
    s = await send_one(session, base_url, m, spec, api_key, 20, sent, timeout_s=timeout_s)
    if s.failure is not None:
        return SmokeCheck(ok=False, detail=fail_text(s))
    got = s.content_text
    ok = piece not in got and s.finish_reason == "stop" and text.startswith(got.rstrip()) and len(got) <= k + 1
    return SmokeCheck(ok=ok, detail=f"stop={piece!r}: answer {len(got)} chars (expected {k}), finish {s.finish_reason}")


def fail_text(r: RequestRecord) -> str:
    msg = r.error.message if r.error else ""
    return f"{r.failure.value if r.failure else 'failed'}: {msg[:120]}"
