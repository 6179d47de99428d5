"""Upstream selection, retry and fallback: one request's route plan tried target by target.

:meth:`Upstream.proxy` asks the router (servelab.gateway.routing) for the plan of a request: its targets
in order (weighted split, affinity, balance, then the fallback chain, each checked against the key's and
tenant's permissions and pools) and an optional shadow target. Targets whose breaker is open or that are
saturated (``max_in_flight``) are skipped without spending an attempt. Retries (``retry.attempts``, with
backoff and the retry budget) happen only before the first byte reached the client: on connection
failures, timeouts, engine 429/5xx and error answers (servelab.gateway.degrade.another_target); the
engine's error text goes to the log only (servelab.gateway.scrub). A pooled keep-alive connection the
engine had closed is re-sent on a fresh one without counting as a retry. Once a target answers, the
:class:`~servelab.gateway.relay.Relay` passes its answer on. A sampled request is also mirrored to the
shadow target (:meth:`Upstream.shadow`, servelab.gateway.shadow).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from servelab.gateway import capabilities as caps_mod
from servelab.gateway import degrade, enginefields, lengths, pooled, scrub
from servelab.gateway.admission import may_use_model
from servelab.gateway.apis import native
from servelab.gateway.breaker import RetryBudget, backoff_s
from servelab.gateway.errors import GatewayError
from servelab.gateway.fdbudget import is_local_resource_error
from servelab.gateway.hashing import affinity_text
from servelab.gateway.keys import KeyInfo
from servelab.gateway.metrics import GatewayMetrics
from servelab.gateway.relay import Relay, close_upstream
from servelab.gateway.reqstate import RequestState, UpstreamFailed
from servelab.gateway.routespec import Target
from servelab.gateway.shadow import ShadowBook, ShadowRun, fetch_shadow, sample_of
from servelab.gateway.snapshot import Snapshot
from servelab.gateway.timeline import attempt_event, route_event, skip_reason

__all__ = ["ENDPOINT_PATH", "Upstream", "reason"]

log = logging.getLogger("servelab.gateway")

#: the engine path of each gateway endpoint (rerank: vLLM's and llama-server's ``/v1/rerank``)
ENDPOINT_PATH = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "rerank": "/v1/rerank",
}


def _engine_fields(up: dict[str, Any], snap: Snapshot, target: Target, r: RequestState) -> None:
    """Apply the engine-field policy of the model ``target`` serves to its body ``up`` (in place)."""
    entry = snap.cfg.models.get(target.public_model)
    enginefields.apply(
        up,
        entry.engine_fields if entry is not None else None,
        target.kind,
        degrade.priority_of(snap.cfg, r),
        keep=(*target.overrides, *enginefields.API_FIELDS.get(r.endpoint, ())),
    )


def reason(e: BaseException) -> str:
    """One line for an exception: its class and first message line (OSError: its strerror)."""
    msg = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)).strip().splitlines()
    return f"{type(e).__name__}: {msg[0]}" if msg else type(e).__name__


def _retry_after(resp: aiohttp.ClientResponse) -> float | None:
    v = resp.headers.get("Retry-After")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


@dataclass(eq=False)
class Upstream:
    """Tries a request's targets and mirrors shadows. ``session`` (the shared upstream
    :class:`aiohttp.ClientSession`) is set by the gateway once started; ``retry_budget`` is the gateway's
    (kept across reloads); ``spawn(coro)`` runs a task the gateway awaits at close; ``session_secret``:
    the HMAC key of ``routing.session_header`` when its env var is unset; ``shadow_sem``: at most 16
    shadow copies in flight (more are dropped, never queued)."""

    metrics: GatewayMetrics
    relay: Relay
    retry_budget: RetryBudget
    shadows: ShadowBook
    spawn: Callable[[Coroutine[Any, Any, Any]], None]
    session_secret: bytes
    session: aiohttp.ClientSession | None = None
    #: backend name -> the engine's gauges at the last scrape (servelab.gateway.enginegauges), or None
    engine_state: Callable[[str], dict[str, Any] | None] | None = None
    shadow_sem: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(16))

    async def proxy(
        self,
        request: web.Request,
        snap: Snapshot,
        r: RequestState,
        body: dict[str, Any],
        task: str | None,
        key: KeyInfo | None = None,
    ) -> web.StreamResponse:
        """Plan the route of ``r`` and try its targets in order (module doc); the answer as relayed.
        Raises :class:`GatewayError` (what the client gets) when no target answered."""
        tenant = snap.cfg.tenants.get(r.tenant)
        pools = set(tenant.pools) if tenant is not None and tenant.pools is not None else None
        # every model the request can reach is checked against the key's and tenant's permissions
        may_use = (
            (lambda m: may_use_model(snap, key, m))
            if key is not None
            else (lambda m: snap.cfg.tenant_may_use(r.tenant, m))
        )
        plan = snap.router.plan(
            r.model, body, task, affinity_text(body), self.split_key(snap, request, r), may_use=may_use, pools=pools
        )
        for m in plan.denied:
            self.metrics.fallbacks_denied.labels(r.model, m).inc()
            log.info("request %s: fallback %s of %s skipped: key %s may not use it", r.rid, m, r.model, r.key_id)
        targets = list(plan.targets)
        r.timeline.mark("routed", route_event(plan, snap.router.load.outstanding))
        if plan.pick is not None:  # the endpoint picker's choice and every replica's scores (gateway.picker)
            r.timeline.mark("pick", dict(plan.pick))
        if plan.shadow is not None and not self.shadow_sem.locked() and self.session is not None:
            r.shadow = ShadowRun(r.t0_ns)  # at most 16 at a time: dropped beyond, never queued
            self.spawn(self.shadow(snap, plan.shadow, body, r, r.shadow))
        retry = snap.cfg.retry
        client_usage = isinstance(body.get("stream_options"), dict) and bool(
            body["stream_options"].get("include_usage")
        )
        tried = 0
        last: UpstreamFailed | None = None
        for target in targets:
            if tried > retry.attempts:
                break
            lease = snap.router.acquire(target)
            if lease is None:  # saturated (max_in_flight) or breaker open: next target, no attempt spent
                r.timeline.mark("skipped", {"backend": target.backend, "why": skip_reason(snap.router, target)})
                continue
            if tried > 0:
                if not self.retry_budget.try_retry():
                    lease.release("neutral")
                    break
                r.retries += 1
                self.metrics.retries.labels(r.model, last.reason if last else "other").inc()
                await asyncio.sleep(backoff_s(tried, retry.backoff_s, retry.backoff_max_s))
            tried += 1
            r.timeline.mark(
                "attempt",
                attempt_event(tried, target, snap.router.load.outstanding(target.backend) - 1, self.engine_state),
            )
            try:
                resp = await self.attempt(request, snap, r, target, body, client_usage, lease)
                if target.public_model != r.model:
                    r.fallback = True
                    self.metrics.fallbacks.labels(r.model).inc()
                return resp
            except UpstreamFailed as f:
                last = f
                r.timeline.mark(
                    "failed",
                    {
                        "n": tried,
                        "backend": target.backend,
                        "cause": f.reason,
                        "status": f.error.status,
                        "code": f.error.code,
                    },
                )
                if not f.retry:
                    raise f.error from None
        if last is not None:
            raise last.error
        raise GatewayError(
            503,
            "the model is busy or temporarily unavailable, retry in 1 s",
            type="server_error",
            code="model_busy",
            retry_after_s=1.0,
        )

    def split_key(self, snap: Snapshot, request: web.Request, r: RequestState) -> str | None:
        """The key of the canary split / shadow draw: None (random per request) unless
        ``routing.session_header`` is set and sent, then HMAC-SHA256(session secret, key id + value)
        (config.RoutingSection): stable per session, not computable by the client."""
        header = snap.cfg.routing.session_header
        value = request.headers.get(header) if header else None
        if not value:
            return None
        secret = os.environ.get(snap.cfg.routing.session_secret_env, "").encode() or self.session_secret
        return hmac.new(secret, f"{r.key_id}\x00{value}".encode(), hashlib.sha256).hexdigest()

    def upstream_body(
        self,
        target: Target,
        body: dict[str, Any],
        stream: bool,
        r: RequestState | None = None,
        snap: Snapshot | None = None,
    ) -> bytes:
        """The bytes sent to ``target``: its model name and overrides, exactly one output bound in the
        field its kind reads, never above the request's reserved ``r.out_cap`` (lengths.for_backend), and
        only the engine fields its model allows, ``priority`` by the key's class (enginefields.apply)."""
        up = target.request_body(body)
        if snap is not None and r is not None:
            _engine_fields(up, snap, target, r)
        if r is not None and r.out_cap:
            up = lengths.for_backend(target.kind, r.endpoint, up, r.out_cap)
            r.sent_cap = next(
                (
                    v
                    for f in ("max_completion_tokens", "max_tokens")
                    if isinstance(v := up.get(f), int) and not isinstance(v, bool)
                ),
                r.out_cap,
            )
        if stream:
            so = up.get("stream_options")
            up["stream_options"] = {**(so if isinstance(so, dict) else {}), "include_usage": True}
        return orjson.dumps(up)

    async def attempt(
        self,
        request: web.Request,
        snap: Snapshot,
        r: RequestState,
        target: Target,
        body: dict[str, Any],
        client_usage: bool,
        lease: Any,
    ) -> web.StreamResponse:
        """One upstream try. Raises :class:`UpstreamFailed` when nothing reached the client yet."""
        assert self.session is not None
        backend = snap.backends[target.backend]
        api = r.api
        r.native = api is not None and api.source is not None and native.serves_natively(backend, api.native)
        headers = {"Content-Type": "application/json", "X-Request-ID": r.rid, **snap.auth_headers[target.backend]}
        if r.native and api is not None and api.native is not None and api.source is not None:
            # the engine serves the client's API itself: its body, with admission's decisions (apis/native.py)
            url = backend.base_url + native.NATIVE_PATH[api.native]
            up = native.native_body(api.source, target.request_body(body), target.upstream_model, r.out_cap, api.native)
            sent = up.get(native.CAP_FIELD[api.native])
            r.sent_cap = sent if isinstance(sent, int) else r.out_cap
            data = orjson.dumps(up)
            headers = native.native_headers(headers, api.native)
        else:
            url = backend.base_url + ENDPOINT_PATH[r.endpoint]
            data = self.upstream_body(target, body, r.stream, r, snap)
        if r.client_rid is not None:  # validated charset and length: safe to pass on, apart from ours
            headers["X-Client-Request-ID"] = r.client_rid
        if r.stream:
            headers["Accept"] = "text/event-stream"
        if r.trace is not None:  # W3C traceparent naming this attempt's span (servelab.gateway.tracing)
            headers.update(r.trace.headers(r.retries + 1))
        outcome = "failure"
        resp = None
        try:
            resp = await pooled.post(
                self.session, url, r.timeline, data=data, headers=headers, timeout=snap.timeouts[target.backend]
            )
            status = resp.status
            r.timeline.mark("headers", {"status": status})
            if status >= 300:
                raw = await resp.read()
                gerr = scrub.from_body(
                    raw,
                    status,
                    r.rid,
                    target.backend,
                    snap.hide,
                    _retry_after(resp),
                    caps_mod.prompt_text(r.endpoint, body) if status < 500 else None,
                )
                # 429: the engine is busy, not broken (retried/fallen back, but no breaker failure);
                # 501: the engine works but does not serve this endpoint (llama-server without --reranking)
                outcome = "neutral" if status in (429, 501) else ("failure" if status >= 500 else "success")
                raise UpstreamFailed(gerr, degrade.another_target(gerr), str(status))
            r.backend, r.upstream_model = target.backend, target.upstream_model
            r.model_field = b'"model":' + orjson.dumps(target.public_model)
            ctype = resp.headers.get("Content-Type", "")
            if r.native:
                out, ok = await native.pipe(self.metrics, self.relay, request, snap.hide, r, resp)
            elif r.stream and "text/event-stream" in ctype:
                out, ok = await self.relay.pipe_stream(request, snap.hide, r, resp, client_usage)
            else:
                out, ok = await self.relay.pipe_whole(snap.hide, r, resp)
            outcome = "neutral" if ok is None else ("success" if ok else "failure")
            return out
        except UpstreamFailed:
            raise
        except TimeoutError:
            outcome = "failure"
            if r.served:
                raise
            raise UpstreamFailed(
                GatewayError(
                    504,
                    "the model did not answer in time; retry, or lower max_tokens",
                    type="server_error",
                    code="upstream_timeout",
                ),
                True,
                "timeout",
            ) from None
        except asyncio.CancelledError:
            outcome = "neutral"
            raise
        except pooled.CONNECT_ERRORS as e:
            if is_local_resource_error(e):  # EMFILE/ENFILE here: our problem, never the engine's breaker
                outcome = "neutral"
                if r.served:
                    raise
                log.warning(
                    "request %s: no file descriptor or buffer left for an upstream connection (%s)", r.rid, reason(e)
                )
                raise UpstreamFailed(
                    GatewayError(
                        503,
                        "the gateway is overloaded, retry in 1 s",
                        type="server_error",
                        code="gateway_overloaded",
                        retry_after_s=1.0,
                    ),
                    False,
                    "local",
                ) from None
            if r.served:
                raise
            log.info("request %s: backend %s unreachable: %s", r.rid, target.backend, type(e).__name__)
            raise UpstreamFailed(
                GatewayError(
                    503,
                    "the model is temporarily unavailable, retry in 1 s",
                    type="server_error",
                    code="model_unavailable",
                    retry_after_s=1.0,
                ),
                True,
                "connect",
            ) from None
        finally:
            if resp is not None:
                close_upstream(resp, r.upstream_done)
            lease.release(outcome)

    async def shadow(
        self, snap: Snapshot, target: Target, body: dict[str, Any], r: RequestState, run: ShadowRun
    ) -> None:
        """Send a copy to the shadow target (same ``stream`` flag, answer never forwarded nor charged), wait
        for the primary to end and record the pair in :attr:`shadows` (servelab.gateway.shadow)."""
        async with self.shadow_sem:
            lease = snap.router.acquire(target)
            if lease is None:
                run.primary.cancel()
                return
            outcome = "neutral"
            try:
                assert self.session is not None
                up = target.request_body(body)
                _engine_fields(up, snap, target, r)  # as for the primary; the shadow backend's kind decides priority
                if r.out_cap:
                    up = lengths.for_backend(target.kind, r.endpoint, up, r.out_cap)
                up["stream"] = r.stream
                headers = {
                    "Content-Type": "application/json",
                    "X-Request-ID": r.rid + "-shadow",
                    **snap.auth_headers[target.backend],
                }
                if r.stream:
                    so = up.get("stream_options")
                    up["stream_options"] = {**(so if isinstance(so, dict) else {}), "include_usage": True}
                    headers["Accept"] = "text/event-stream"
                else:
                    up.pop("stream_options", None)
                url = snap.backends[target.backend].base_url + ENDPOINT_PATH[r.endpoint]
                side, text = await fetch_shadow(
                    self.session,
                    url,
                    orjson.dumps(up),
                    headers,
                    snap.timeouts[target.backend],
                    r.stream,
                    run.t0_ns,
                    target.backend,
                    target.upstream_model,
                )
                outcome = "failure" if side.status == 0 or side.status >= 500 else "success"
                self.metrics.requests.labels(r.model, target.backend, f"shadow_{side.status}").inc()
            finally:
                lease.release(outcome)
        primary, primary_text = await run.primary
        self.shadows.add(
            sample_of(
                primary,
                primary_text,
                side,
                text,
                ts=r.ts,
                request_id=r.rid,
                model=r.model,
                endpoint=r.endpoint,
                stream=r.stream,
            )
        )
