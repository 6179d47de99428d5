"""The access log: one JSON line per request (``server.access_log``: a file, ``-`` for stderr, or off).

Fields of a line (:func:`access_record`; docs/gateway-design.md): ``ts`` (epoch s), ``request_id``,
``key_id``, ``tenant``, ``model`` (public), ``backend``, ``api`` (the API the client called:
:func:`api_name`), ``endpoint`` (what was forwarded: ``messages`` when the engine got the client's own
Anthropic body, servelab.gateway.apis.native), ``stream``, ``status``, ``outcome``
(``ok``/``error``/``client_disconnect``), ``error_code``, ``ttft_ms``, ``e2e_ms``, ``prompt_tokens``,
``completion_tokens``, ``charged_tokens``, ``retries``, ``fallback``, ``config_version``,
``client_request_id``; when they apply: ``degraded`` (degrade.Decision.log_record), ``client_ip``,
``policy`` (policy.Applied.log_record), ``application``, ``prompt`` (tenants with ``log_prompts``, redacted),
``worker`` (the worker index under ``servelab gateway --workers N``); ``timeline``: the request's events in ms
since it was received (:mod:`servelab.gateway.timeline`, read by ``servelab gateway explain``).

Several workers write one file: each opens it with ``O_APPEND`` and writes every line with one
``write(2)`` call, so lines never interleave or overwrite each other (POSIX: with ``O_APPEND`` "the file
offset shall be set to the end of the file prior to each write and no intervening file modification
operation shall occur between changing the file offset and the write operation",
https://pubs.opengroup.org/onlinepubs/9799919799/functions/write.html, read 2026-12-01).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import IO, Any

import orjson

from servelab.gateway.reqstate import RequestState

__all__ = ["AccessLog", "access_record", "api_name"]

log = logging.getLogger("servelab.gateway")


class AccessLog:
    """One JSON line per request to stderr or a file (``server.access_log``); writes are unbuffered
    bytes so a crash loses no finished request's line."""

    def __init__(self, where: str | None, worker: int | None = None) -> None:
        self.where = where
        self.worker = worker
        self._f: IO[bytes] | None = None
        if where == "-":
            self._f = sys.stderr.buffer
        elif where:
            Path(where).parent.mkdir(parents=True, exist_ok=True)
            self._f = open(where, "ab", buffering=0)  # noqa: SIM115 - closed in close()

    def write(self, rec: dict[str, Any]) -> None:
        if self._f is not None:
            if self.worker is not None:
                rec["worker"] = self.worker
            try:
                self._f.write(orjson.dumps(rec) + b"\n")
                if self.where == "-":
                    self._f.flush()
            except (OSError, ValueError) as e:  # a full disk must not fail requests
                log.warning("access log write failed: %s", e)

    def close(self) -> None:
        if self._f is not None and self.where not in (None, "-"):
            self._f.close()
        self._f = None


def api_name(r: RequestState) -> str:
    """The API request ``r`` came in on: ``chat``, ``completions``, ``embeddings`` (OpenAI, forwarded as they
    are) or ``messages``, ``count_tokens``, ``responses`` (translated, :mod:`servelab.gateway.apis`). A fixed
    handful of values: the access log's ``api`` and the ``api`` label of ``api_requests_total``."""
    return r.api.name if r.api is not None else r.endpoint


def access_record(r: RequestState, e2e_ns: int, config_version: int, charged_tokens: int) -> dict[str, Any]:
    """The access-log line of the finished request ``r`` (module doc); ``e2e_ns``: received -> last byte."""
    rec: dict[str, Any] = {
        "ts": round(r.ts, 3),
        "request_id": r.rid,
        "key_id": r.key_id,
        "tenant": r.tenant,
        "model": r.model,
        "backend": r.backend,
        "api": api_name(r),
        "endpoint": r.api.native if r.native and r.api is not None and r.api.native else r.endpoint,
        "stream": r.stream,
        "status": r.status,
        "outcome": r.outcome,
        "error_code": r.error_code,
        "ttft_ms": round(r.ttft_ns / 1e6, 3) if r.ttft_ns is not None else None,
        "e2e_ms": round(e2e_ns / 1e6, 3),
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "charged_tokens": charged_tokens,
        "retries": r.retries,
        "fallback": r.fallback,
        "config_version": config_version,
        "client_request_id": r.client_rid,
    }
    if r.degraded is not None:
        rec["degraded"] = r.degraded
    if r.client_ip is not None:
        rec["client_ip"] = r.client_ip
    if r.policy is not None:
        rec["policy"] = r.policy
    if r.application is not None:
        rec["application"] = r.application
    if r.prompt_text is not None:
        rec["prompt"] = r.prompt_text
    rec["timeline"] = r.timeline.record(r.t0_ns)
    return rec
