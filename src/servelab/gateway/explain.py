"""``servelab gateway explain REQUEST_ID``: where one request's time went, read from the access log.

The access-log line of a request (:mod:`servelab.gateway.accesslog`) holds its ``timeline``
(:mod:`servelab.gateway.timeline`); :func:`explain` turns it into rows (time in ms since received, event,
detail) and one diagnosis line naming the cause: a refusal and the limit that made it, the failed
attempts before the answer, time waiting in the engine's queue (and how busy its slots were), prefill,
decode, the limiter, or a client that left.

How TTFT is split (all ms, the gateway's clock): ``checks`` = received -> checked (auth, body, policy);
``limiter`` = checked -> admitted; ``failed attempts`` = first attempt sent -> last attempt sent (the
failed attempts and their backoff); ``at the engine`` = last attempt sent -> first token. When the engine
reports its own ``prompt_ms`` (llama.cpp ``timings``), ``prefill`` is that and ``engine queue`` is the rest
of the time at the engine (network and the gateway's relay included, which are sub-millisecond on one
host); without it the time at the engine is reported whole. The largest part is the cause.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from servelab.wire.errors import ConfigError

__all__ = ["Explanation", "explain", "find_record", "format_explanation"]

#: bytes read per block when scanning the access log from its end
_BLOCK = 1 << 20


@dataclass
class Explanation:
    """One request explained: ``rows`` ``(ms since received, event, detail)``, the ``diagnosis`` line,
    ``cause`` (a short tag: ``refused``, ``limit``, ``failed_attempts``, ``engine_queue``, ``prefill``,
    ``engine``, ``limiter``, ``checks``, ``client_left``, ``upstream_failed``, ``stream_broke``) and
    ``parts_ms``: the TTFT parts (ms) it was chosen from."""

    rows: list[tuple[float, str, str]]
    diagnosis: str
    cause: str
    parts_ms: dict[str, float] = field(default_factory=dict)


def find_record(path: str | Path, request_id: str) -> dict[str, Any]:
    """The access-log line of ``request_id`` (the gateway's ``X-Request-ID``, or the client's own
    ``client_request_id``: the latest such line) in the file ``path``, read from its end. Raises
    :class:`ConfigError` (one line) when the file cannot be read or holds no such request."""
    p = Path(path)
    needle = orjson.dumps(request_id)
    try:
        with p.open("rb") as f:
            f.seek(0, 2)
            pos, tail = f.tell(), b""
            while pos > 0:
                step = min(_BLOCK, pos)
                pos -= step
                f.seek(pos)
                chunk = f.read(step) + tail
                lines = chunk.split(b"\n")
                tail = lines[0] if pos > 0 else b""
                for line in reversed(lines[1:] if pos > 0 else lines):
                    if needle in line:
                        rec = _decode(line)
                        if rec is not None and request_id in (rec.get("request_id"), rec.get("client_request_id")):
                            return rec
    except OSError as e:
        raise ConfigError(
            f"cannot read the access log {str(p)!r}: {e.strerror or e}; pass the gateway's "
            "server.access_log file with --log (or its config with --config)"
        ) from None
    raise ConfigError(
        f"request {request_id!r} is not in the access log {str(p)!r}; use the X-Request-ID the "
        "gateway answered with (or the client's own X-Request-ID)"
    )


def _decode(line: bytes) -> dict[str, Any] | None:
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return rec if isinstance(rec, dict) else None


def _s(ms: float) -> str:
    """``ms`` as seconds for a sentence: ``2.1 s`` (``0.012 s`` under 0.1 s)."""
    s = ms / 1000
    return f"{s:.3f} s" if s < 0.1 else f"{s:.2f} s"


def _busy(att: dict[str, Any]) -> str:
    """How busy the backend was when attempt ``att`` was sent, in words."""
    n = att.get("in_flight", 0)
    parts = [f"{n} other request{'s' if n != 1 else ''} in flight there"]
    slots, running, waiting = att.get("slots"), att.get("running"), att.get("waiting")
    if running is not None:
        eng = f"{running:g} of {slots:g} slots busy" if slots else f"{running:g} running"
        if waiting is not None:
            eng += f", {waiting:g} waiting"
        parts.append(f"engine: {eng} at its last scrape")
    return "; ".join(parts)


def _failure(a: dict[str, Any]) -> str:
    """A failed attempt's cause in words: ``503 model_busy``, ``timeout -> 504 upstream_timeout``."""
    answer = f"{a.get('status')} {a.get('code') or ''}".rstrip()
    cause = str(a.get("cause"))
    return answer if cause == str(a.get("status")) else f"{cause} -> {answer}"


def _detail(name: str, a: dict[str, Any]) -> str:
    """One row's detail for event ``name`` with attributes ``a``."""
    if name == "routed":
        cands = ", ".join(f"{b} ({role}, {n} in flight)" for b, role, n in a.get("candidates", []))
        return f"candidates {cands or 'none'}; {a.get('why', '')}".rstrip("; ")
    if name == "attempt":
        return f"#{a.get('n')} to {a.get('backend')} ({a.get('role')}): {_busy(a)}"
    if name == "skipped":
        return f"{a.get('backend')}: {a.get('why')}"
    if name == "failed":
        return f"#{a.get('n')} on {a.get('backend')}: {_failure(a)}"
    if name == "refused":
        lim = f" by the {a['limit']} limit on the {a.get('scope', 'key')}" if a.get("limit") else ""
        ra = f", retry after {math.ceil(a['retry_after_s'])} s" if a.get("retry_after_s") is not None else ""
        return f"{a.get('status')} {a.get('code') or ''}{lim}{ra}"
    if name == "connected":
        return "pooled keep-alive connection" if a.get("reused") else "new connection"
    if name == "engine":
        bits = []
        if "prompt_n" in a:
            bits.append(f"prefill {a['prompt_n']} tokens in {a.get('prompt_ms', 0):.1f} ms")
        if "cache_n" in a or "cached_tokens" in a:
            bits.append(f"{a.get('cache_n', a.get('cached_tokens'))} prompt tokens from cache")
        if "predicted_n" in a:
            bits.append(f"decode {a['predicted_n']} tokens in {a.get('predicted_ms', 0):.1f} ms")
        return "; ".join(bits)
    if name in ("headers", "done"):
        return str(a.get("status", ""))
    return ", ".join(f"{k}={v}" for k, v in a.items())


def _events(rec: dict[str, Any]) -> list[tuple[str, float, dict[str, Any]]]:
    out = []
    for ev in rec.get("timeline") or []:
        if isinstance(ev, list) and len(ev) >= 2 and isinstance(ev[0], str) and isinstance(ev[1], (int, float)):
            out.append((ev[0], float(ev[1]), ev[2] if len(ev) > 2 and isinstance(ev[2], dict) else {}))
    return out


def explain(rec: dict[str, Any], ttft_slo_s: float | None = None) -> Explanation:
    """Explain the access-log line ``rec`` (module doc); ``ttft_slo_s``: the TTFT objective (seconds)
    quoted in the diagnosis when given. Raises :class:`ConfigError` for a line without a timeline
    (written by a gateway older than the timeline)."""
    evs = _events(rec)
    if not evs:
        raise ConfigError(
            f"request {rec.get('request_id')!r} has no timeline in its access-log line (a gateway "
            "before servelab's request timelines wrote it); nothing to explain"
        )
    rows = [(t, name, _detail(name, a)) for name, t, a in evs]
    first: dict[str, tuple[float, dict[str, Any]]] = {}
    for name, t, a in evs:
        first.setdefault(name, (t, a))
    attempts = [(t, a) for name, t, a in evs if name == "attempt"]
    failures = [(t, a) for name, t, a in evs if name == "failed"]
    engine = first.get("engine", (0.0, {}))[1]
    status = rec.get("status")
    fails_txt = "; ".join(f"attempt {a.get('n')} on {a.get('backend')} failed ({_failure(a)})" for _, a in failures)

    if "refused" in first:
        t, a = first["refused"]
        if a.get("limit"):
            ra = (
                f"; the client was told to retry in {math.ceil(a['retry_after_s'])} s" if a.get("retry_after_s") else ""
            )
            diag = (
                f"refused by the {a['limit']} limit on the {a.get('scope', 'key')} after {t:.1f} ms: "
                f"{a.get('status')} {a.get('code')}{ra}; nothing was sent to an engine"
            )
            return Explanation(rows, diag, "limit")
        return Explanation(
            rows,
            f"refused at admission after {t:.1f} ms: {a.get('status')} {a.get('code')}; nothing was sent to an engine",
            "refused",
        )

    ttft = rec.get("ttft_ms")
    t_first = first["first_token"][0] if "first_token" in first else (float(ttft) if ttft is not None else None)
    client_left = "client_left" in first
    if t_first is None:  # no answer reached the client
        if client_left:
            t = first["client_left"][0]
            where = (
                f" while attempt {attempts[-1][1].get('n')} on {attempts[-1][1].get('backend')} waited"
                if attempts
                else ""
            )
            return Explanation(
                rows,
                f"the client left after {_s(t)} before the first token{where}"
                + (f"; before that {fails_txt}" if failures else ""),
                "client_left",
            )
        diag = f"no backend answered: {fails_txt}" if failures else "no backend could be tried"
        skipped = [a for name, _, a in evs if name == "skipped"]
        if skipped:
            diag += "; skipped " + ", ".join(f"{a.get('backend')} ({a.get('why')})" for a in skipped)
        return Explanation(
            rows, f"{diag}; the client got {status} {rec.get('error_code') or ''}".rstrip(), "upstream_failed"
        )

    checked = first.get("checked", (0.0, {}))[0]
    admitted = first.get("admitted", (checked, {}))[0]
    parts: dict[str, float] = {"checks": checked, "limiter": max(0.0, admitted - checked)}
    sent, att = attempts[-1] if attempts else (admitted, {})
    if failures and attempts:
        parts["failed attempts"] = max(0.0, sent - attempts[0][0])
    at_engine = max(0.0, t_first - sent)
    if "prompt_ms" in engine:
        prefill = min(float(engine["prompt_ms"]), at_engine)
        parts["prefill"] = prefill
        parts["engine queue"] = at_engine - prefill
    else:
        parts["at the engine"] = at_engine
    cause_part = max(parts, key=lambda k: parts[k])
    backend = att.get("backend") or rec.get("backend")
    head = f"{_s(t_first)} to first token"
    if cause_part == "engine queue":
        why = (
            f"{_s(parts['engine queue'])} waiting in backend {backend}'s queue ({_busy(att)}), prefill "
            f"{_s(parts['prefill'])}"
        )
        cause = "engine_queue"
    elif cause_part == "prefill":
        cached = engine.get("cache_n", engine.get("cached_tokens"))
        why = (
            f"prefill of {engine.get('prompt_n', '?')} prompt tokens on backend {backend} took "
            f"{_s(parts['prefill'])}"
            + (f" ({cached} more reused from the prompt cache)" if cached else "")
            + f", {_s(parts['engine queue'])} queued ({_busy(att)})"
        )
        cause = "prefill"
    elif cause_part == "failed attempts":
        why = f"{_s(parts['failed attempts'])} lost on failed attempts ({fails_txt}) before {backend} answered"
        cause = "failed_attempts"
    elif cause_part == "limiter":
        why = f"{_s(parts['limiter'])} in the limiter (state.redis_url slow or far?)"
        cause = "limiter"
    elif cause_part == "checks":
        why = f"{_s(parts['checks'])} in admission checks (auth, body, policy) before the limiter"
        cause = "checks"
    else:
        why = (
            f"{_s(at_engine)} from sending to backend {backend} to its first token ({_busy(att)}); the "
            "engine reports no timings, so its queue and prefill cannot be told apart"
        )
        cause = "engine"
    diag = f"{head}: {why}"
    if failures and cause != "failed_attempts":
        diag += f"; after {len(failures)} failed attempt{'s' if len(failures) > 1 else ''} ({fails_txt})"
    if "predicted_n" in engine and engine.get("predicted_ms"):
        n = engine["predicted_n"]
        diag += (
            f"; decode {_s(float(engine['predicted_ms']))} for {n} tokens "
            f"({float(engine['predicted_ms']) / max(1, n):.1f} ms/token)"
        )
    if client_left:
        diag += f"; the client left at {_s(first['client_left'][0])}"
    elif rec.get("outcome") == "error" and rec.get("error_code"):
        diag += f"; then the stream ended in error ({rec['error_code']})"
        cause = "stream_broke" if status == 200 else cause
    if ttft_slo_s is not None:
        diag += f"; the TTFT SLO is {ttft_slo_s:g} s ({'met' if t_first / 1000 <= ttft_slo_s else 'missed'})"
    return Explanation(rows, diag, cause, {k: round(v, 3) for k, v in parts.items()})


def format_explanation(rec: dict[str, Any], exp: Explanation) -> str:
    """The text ``servelab gateway explain`` prints: a header line about the request, the timeline rows
    (ms since received, event, detail) and ``diagnosis: ...``."""
    ts = rec.get("ts")
    when = (
        _dt.datetime.fromtimestamp(ts, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
        if isinstance(ts, (int, float))
        else "?"
    )
    client = f" (client id {rec['client_request_id']})" if rec.get("client_request_id") else ""
    head = (
        f"request {rec.get('request_id')}{client} at {when}: key {rec.get('key_id')} tenant {rec.get('tenant')} "
        f"model {rec.get('model')} -> backend {rec.get('backend') or 'none'}, {rec.get('status')} "
        f"{rec.get('outcome')}{' stream' if rec.get('stream') else ''}, TTFT "
        f"{'-' if rec.get('ttft_ms') is None else format(rec['ttft_ms'], '.1f')} ms, E2E "
        f"{rec.get('e2e_ms', 0):.1f} ms, tokens {rec.get('prompt_tokens')} in / {rec.get('completion_tokens')} "
        f"out, retries {rec.get('retries', 0)}{', fallback' if rec.get('fallback') else ''}"
    )
    lines = [head, f"{'ms':>10}  {'event':<12} detail"]
    lines += [f"{t:>10.1f}  {name:<12} {detail}".rstrip() for t, name, detail in exp.rows]
    lines.append(f"diagnosis: {exp.diagnosis}")
    return "\n".join(lines)
