"""The API port's small endpoints (a mixin of :class:`servelab.gateway.server.Gateway`): ``/health``
(readiness), ``/health/live``, ``/metrics`` (only with ``server.public_metrics``; always on the admin port),
``GET /v1/models`` (the models the key may use), the 404/405 answer naming the routes, and the answer
helpers the per-request pipeline shares with them (the gateway's request id, an OpenAI error response, the
"starting" refusal).
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson
from aiohttp import web

from servelab.gateway.admission import Admitter, may_use_model
from servelab.gateway.apis.messages import anthropic_error_body
from servelab.gateway.breaker import BreakerBoard
from servelab.gateway.errors import GatewayError
from servelab.gateway.listener import GuardedRunner
from servelab.gateway.metrics import CONTENT_TYPE_LATEST, GatewayMetrics
from servelab.gateway.snapshot import Snapshot

__all__ = ["ROUTES", "Endpoints", "error_response", "request_id", "starting"]

#: the public routes and their method (for the 404/405 answers)
ROUTES = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/embeddings": "POST",
    "/v1/rerank": "POST",
    "/rerank": "POST",
    "/v1/messages": "POST",
    "/v1/messages/count_tokens": "POST",
    "/v1/responses": "POST",
    "/v1/models": "GET",
    "/health": "GET",
    "/health/live": "GET",
    "/metrics": "GET",
}


def request_id(request: web.Request) -> str:
    """A fresh id made by the gateway (24 hex characters, 96 random bits): the ``X-Request-ID`` of every
    answer, the access log's and ledger's ``request_id``. Never the client's own ``X-Request-ID``, which
    a client can repeat or choose to steer anything keyed on it (see
    :func:`servelab.gateway.server._client_request_id`)."""
    return secrets.token_hex(12)


def error_response(e: GatewayError, rid: str) -> web.Response:
    """``e`` as an OpenAI-shaped JSON answer with the request id ``rid`` and its headers (Retry-After)."""
    return web.Response(
        status=e.status, body=e.body(), content_type="application/json", headers={"X-Request-ID": rid, **e.headers()}
    )


def starting() -> GatewayError:
    """The answer to requests while the replica is not ready (PostgreSQL down at start): nothing internal."""
    return GatewayError(
        503,
        "the service is starting and cannot take requests yet; retry in 2 s",
        type="server_error",
        code="service_starting",
        retry_after_s=2.0,
    )


class Endpoints:
    """The small endpoints (module doc); the attributes they read are the gateway's."""

    snap: Snapshot
    metrics: GatewayMetrics
    breakers: BreakerBoard
    admitter: Admitter
    not_ready: str | None
    not_ready_public: str
    _health: Any
    _readiness: Any
    _redis: Any
    _ledger: Any
    _runner: web.AppRunner | None
    _admin_runner: web.AppRunner | None

    async def _unknown_path(self, request: web.Request) -> web.Response:
        """404/405 naming the routes, as an OpenAI error (the SDK parses it), or as an Anthropic error
        under ``/v1/messages`` (the Anthropic SDK's paths: ``GET /v1/messages``, ``/v1/messages/batches``);
        a path that lacks ``/v1`` (the usual base_url mistake) is told so."""
        path = request.path[:200]
        allowed = ROUTES.get(path)
        if allowed is not None and allowed == request.method:
            # routed by the raw path, decoded only here: /v1/chat%2Fcompletions (break-it report on 4b30bb7)
            e = GatewayError(
                404,
                f"no such endpoint: {request.raw_path[:200]} (an encoded '/' is not a path "
                f"separator); send {request.method} {path} with plain slashes",
                code="unknown_path",
            )
        elif allowed is not None:
            e = GatewayError(405, f"{path} takes {allowed} requests, not {request.method}", code="method_not_allowed")
        else:
            hint = ""
            if "/v1" + path in ROUTES:
                hint = f"; did you mean /v1{path}? set the client's base_url to end in /v1"
            served = ", ".join(f"{m} {p}" for p, m in ROUTES.items())
            e = GatewayError(
                404,
                f"no such endpoint: {request.method} {path}{hint} (this gateway serves {served})",
                code="unknown_path",
            )
        rid = request_id(request)
        headers = {"X-Request-ID": rid, **({"Allow": allowed} if e.status == 405 and allowed else {})}
        anthropic = path == "/v1/messages" or path.startswith("/v1/messages/")
        body = anthropic_error_body(e, rid) if anthropic else e.body()
        return web.Response(status=e.status, body=body, content_type="application/json", headers=headers)

    async def _health_ep(self, request: web.Request) -> web.Response:
        """Readiness (:mod:`servelab.gateway.readiness`): 200 ``ok``/``degraded`` when this replica can
        serve, 503 ``unavailable`` with ``reasons`` when no backend is up or Redis (``state.redis_url``)
        does not answer; ``checks`` shows Redis and ledger state."""
        names = [b.name for b in self.snap.cfg.backends]
        up = [
            n for n in names if self.breakers.get(n).state != "open" and (self._health is None or self._health.is_up(n))
        ]
        if self._readiness is None:
            from servelab.gateway.readiness import Readiness

            self._readiness = Readiness(self._redis, self._ledger)
        checks = await self._readiness.checks()
        reasons = [] if up else ["no backend is up"]
        if self.not_ready is not None:  # the field, not the address (the public port names none)
            reasons.append(f"starting: {self.not_ready_public}; requests get 503 until it answers")
        if checks.get("redis", "ok") != "ok":
            reasons.append(f"Redis (state.redis_url) is {checks['redis']}: limits cannot be checked")
        degraded = (
            [f"ledger is {checks['ledger']}: usage is kept locally until it is back"]
            if checks.get("ledger", "ok") != "ok"
            else []
        )
        status = "unavailable" if reasons else ("degraded" if degraded else "ok")
        return web.Response(
            status=503 if reasons else 200,
            content_type="application/json",
            body=orjson.dumps(
                {
                    "status": status,
                    "reasons": reasons + degraded,
                    "checks": checks,
                    "backends_up": len(up),
                    "backends": len(names),
                    "config_version": self.snap.version,
                }
            ),
        )

    async def _live_ep(self, request: web.Request) -> web.Response:
        """Liveness: 200 while the process and its event loop run (checks nothing else)."""
        return web.Response(content_type="application/json", body=b'{"status":"alive"}')

    async def _public_metrics_ep(self, request: web.Request) -> web.Response:
        """``/metrics`` on the API port: only with ``server.public_metrics`` (it names backends and breaker
        states); otherwise 404 pointing to the admin port."""
        if self.snap.cfg.server.public_metrics:
            return await self._metrics_ep(request)
        e = GatewayError(
            404,
            "no such endpoint: /metrics is served on the admin port (with the admin token); "
            "set server.public_metrics: true to serve it here",
            code="unknown_path",
        )
        return error_response(e, request_id(request))

    def _conn_event(self, port: str, reason: str) -> None:
        self.metrics.connection_events.labels(port, reason).inc()

    def _set_gauges(self) -> None:
        self.metrics.set_breakers({n: s["state"] for n, s in self.breakers.snapshot().items()})
        for port, runner in (("api", self._runner), ("admin", self._admin_runner)):
            if isinstance(runner, GuardedRunner):
                self.metrics.connections.labels(port).set(runner.connections())

    async def _metrics_ep(self, request: web.Request) -> web.Response:
        self._set_gauges()
        resp = web.Response(body=self.metrics.expose())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        rid = request_id(request)
        try:
            if self.not_ready is not None:
                raise starting()
            key = await self.admitter.authenticate(request)
        except GatewayError as e:
            return error_response(e, rid)
        snap = self.snap
        data = [card for name, card in snap.model_cards.items() if may_use_model(snap, key, name)]
        return web.Response(
            body=orjson.dumps({"object": "list", "data": data}),
            content_type="application/json",
            headers={"X-Request-ID": rid},
        )
