"""Admission: who is calling, whether the body and model are acceptable, which policy, degrade rule and
limits apply, before anything is sent upstream.

Order (each step's refusal is an OpenAI error the client gets; nothing is reserved before the last):
auth (key -> tenant, 401) -> body size (413), encoding (415/400), JSON and depth (400) -> model resolution
(task header, ``auto``; 404 unknown, 403 not allowed for the key/tenant) -> sampling policy per model/task
(servelab.gateway.policy) -> field types and capabilities (servelab.gateway.capabilities; logprobs caps) ->
degrade rule under pressure by the key's priority (servelab.gateway.degrade: pause, route to a cheaper
model, cap max_tokens, refuse a long prompt) -> engine fields the model does not allow (priority,
kv_transfer_params, chat_template, ...: 400 or dropped, servelab.gateway.enginefields) -> the output
bound (``max_tokens`` x sequences against ``server.max_tokens_limit``, the default fitted to the context)
-> the client IP limits count (trusted proxies only, servelab.gateway.clientip) and the key's application
(servelab.gateway.scopes) -> limits (:meth:`Admitter.reserve`: RPM, TPM, concurrency, budgets per key,
tenant, application, model and IP; 429 with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from servelab.gateway import bodies, clientip, degrade, enginefields, lengths, logprobs, policy, scopes
from servelab.gateway import capabilities as caps_mod
from servelab.gateway.apis import ApiAdapter
from servelab.gateway.errors import GatewayError, bad_request, echo
from servelab.gateway.keys import KeyInfo
from servelab.gateway.leases import LoadTracker
from servelab.gateway.limits import Admission, Limiter, LimitExceeded, Limits
from servelab.gateway.metrics import GatewayMetrics
from servelab.gateway.reqstate import RequestState
from servelab.gateway.served import ServedCount, choices_per_prompt
from servelab.gateway.snapshot import Snapshot

__all__ = ["Admitted", "Admitter", "may_use_model", "read_json"]


@dataclass(slots=True)
class Admitted:
    """A request that passed every check: its caller, its body (the output bound canonicalised), the
    task header's value, the tokens to reserve (prompt estimate + output bound x sequences) and the
    extra limit scopes (application, model, IP) that apply."""

    key: KeyInfo
    body: dict[str, Any]
    task: str | None
    reserve_tokens: int
    extra: list[tuple[str, str, Limits]]
    #: the route has output tokens (chat, completions; not embeddings, rerank): a 429's advice names max_tokens
    outputs: bool = True


def may_use_model(snap: Snapshot, key: KeyInfo, model: str) -> bool:
    """The key's own list (already intersected with its tenant's by the key store) and the tenant's
    list in the config in force."""
    if key.allowed_models is not None and model not in key.allowed_models:
        return False
    return snap.cfg.tenant_may_use(key.tenant, model)


async def read_json(request: web.Request, limit: int, max_depth: int = 64, compressed: bool = False) -> dict[str, Any]:
    """The body as a JSON object. Raises GatewayError 413 above ``limit`` bytes (also once inflated),
    415/400 for a Content-Encoding refused or corrupt (``compressed``: server.request_compression;
    servelab.gateway.bodies), 400 ``invalid_json`` for bad JSON or a non-object, 400
    ``json_too_deep`` when nested deeper than ``max_depth``."""
    raw = await bodies.read_body(request, limit, compressed)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(
            f"the body is not valid JSON ({str(e).split(':')[0]}); send a JSON object", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object", code="invalid_json")
    caps_mod.check_depth(raw, body, max_depth)
    return body


class Admitter:
    """The admission steps (module doc). ``keystore`` and ``limiter`` are set by the gateway at start
    (injected or built from the config); ``degrader`` keeps its TTFT window across reloads; ``load``:
    requests in flight per backend (degrade thresholds)."""

    def __init__(self, metrics: GatewayMetrics, degrader: degrade.Degrader, load: LoadTracker) -> None:
        self.metrics = metrics
        self.degrader = degrader
        self.load = load
        self.keystore: Any = None
        self.limiter: Limiter | None = None

    async def authenticate(self, request: web.Request, api: ApiAdapter | None = None) -> KeyInfo:
        """The caller of ``request`` (its ``Authorization`` header; ``api``: the translated API's own key
        header, servelab.gateway.apis); raises GatewayError 401."""
        info = self.keystore.authenticate(
            request.headers.get("Authorization") if api is None else api.key_header(request)
        )
        if asyncio.iscoroutine(info):
            info = await info
        return info

    async def check(self, request: web.Request, snap: Snapshot, r: RequestState, endpoint: str) -> Admitted:
        """Every step before the limits (module doc); fills ``r`` (key, model, policy, degrade, output
        bound, client IP, application). A request of another API (``r.api``) is translated to a chat body
        right after it is read, so every later step sees chat completions. Raises :class:`GatewayError`
        with the client's answer."""
        key = await self.authenticate(request, r.api)
        r.key_id, r.tenant = key.key_id, key.tenant
        body = await read_json(
            request, snap.cfg.server.max_body_bytes, snap.cfg.server.max_json_depth, snap.cfg.server.request_compression
        )
        if r.api is not None:
            body = r.api.translate(body, snap.cfg.server.max_tokens_limit)
        model = body.get("model")
        task = request.headers.get(snap.cfg.routing.task_header)
        if model in (None, "", "auto") and task and task in snap.cfg.routing.tasks:
            model = snap.cfg.routing.tasks[task]
        if not isinstance(model, str) or not model:
            raise bad_request(
                "'model' must be a model name (GET /v1/models lists yours)", param="model", code="invalid_type"
            )
        model = snap.router.resolve_model(model, task)
        entry = snap.cfg.models.get(model)
        if entry is None:
            raise GatewayError(
                404,
                f"the model '{echo(model)}' does not exist; GET /v1/models lists the models you can use",
                code="model_not_found",
                param="model",
            )
        r.model = model
        if not may_use_model(snap, key, model):
            raise GatewayError(
                403,
                f"this API key may not use the model '{echo(model)}'; GET /v1/models lists the models it may use",
                code="model_not_allowed",
                param="model",
            )
        server = snap.cfg.server
        pol = policy.apply(body, policy.bounds_for(snap.cfg, model, task), endpoint)  # sampling per model/task
        want = caps_mod.validate_request(endpoint, body, server.max_tokens_limit, server.engine_length_fields)
        logprobs.check_logprobs(endpoint, body, server.max_top_logprobs, server.max_logprobs)  # 400 above caps
        asked = want.max_tokens  # the LARGEST bound over every dialect's length fields (lengths.py)
        seqs = caps_mod.output_sequences(endpoint, body)
        r.prompt_est = caps_mod.estimate_prompt_tokens(endpoint, body)
        r.tally = ServedCount(choices_per_prompt(endpoint, body, seqs), seqs)
        deg = self.degrade_hook(snap, key, r)  # under pressure, by the key's priority class
        model, entry = r.model, snap.cfg.models[r.model]
        # engine scheduling/transport/template fields: refused or dropped unless the model allows them
        dropped = enginefields.screen(body, entry.engine_fields, model, endpoint)
        out_cap = 0
        if endpoint not in caps_mod.POOLED:
            limit = server.max_tokens_limit
            if seqs > limit or (asked is not None and asked * seqs > limit):
                which = "n" if seqs > limit or "n" in body else "prompt"
                raise bad_request(
                    f"{seqs} sequences x max_tokens {asked or 1} is above this gateway's limit of {limit} "
                    f"output tokens per request (max_tokens applies to each of the {seqs} sequences: n choices"
                    f"{' per prompt' if endpoint == 'completions' else ''}); lower n or max_tokens",
                    param=which,
                    code="max_tokens_too_large",
                )
            default_cap = max(1, (server.default_max_tokens or limit) // seqs)
            ctx = entry.capabilities.context_tokens
            if ctx:  # the injected default must still fit the context
                default_cap = max(1, min(default_cap, ctx - r.prompt_est))
            out_cap = asked if asked is not None else default_cap
            if want.unbounded:  # n_predict/num_predict -1: "no limit" = the gateway's default
                out_cap = max(out_cap, default_cap)
            out_cap = pol.output_cap(out_cap, asked, max(1, limit // seqs))  # policy, then degrade
            r.policy = pol.log_record()
            out_cap = degrade.cap(out_cap, deg)
        if dropped:
            r.policy = {**(r.policy or {}), "engine_fields_dropped": dropped}
        caps_mod.check_request(entry, endpoint, body, r.prompt_est, model_name=model, max_tokens=out_cap)
        if endpoint not in caps_mod.POOLED:  # one bound, in the gateway's form; each attempt maps it (lengths.py)
            lengths.canonicalise(body, out_cap, want.min_tokens)
        r.out_cap = out_cap
        r.stream = endpoint not in caps_mod.POOLED and body.get("stream") is True
        tenant_cfg = snap.cfg.tenants.get(key.tenant)
        if tenant_cfg is not None and tenant_cfg.log_prompts:
            text = caps_mod.prompt_text(endpoint, body)
            for pat in snap.redact.get(key.tenant, ()):
                text = pat.sub("[REDACTED]", text)
            r.prompt_text = text
        r.client_ip = clientip.client_ip(
            request.remote,
            request.headers.getall("X-Forwarded-For", ()),
            clientip.trusted_networks(tuple(server.trusted_proxies)),
        )
        r.application = scopes.application_of(snap.cfg, key.key_id)
        extra = scopes.extra_scopes(snap.cfg, key.key_id, key.tenant, model, r.client_ip)
        return Admitted(key, body, task, r.prompt_est + out_cap * seqs, extra, endpoint in ("chat", "completions"))

    async def reserve(self, adm: Admitted, model: str) -> Admission:
        """Admit ``adm`` against the limits of every scope (reserving its tokens); raises GatewayError
        429 (counted in ``limit_rejections_total``) naming the limit."""
        assert self.limiter is not None
        key = adm.key
        try:
            return await self.limiter.admit(
                key.key_id,
                key.tenant,
                model,
                adm.reserve_tokens,
                key.limits,
                key.tenant_limits,
                **({"extra": adm.extra} if adm.extra else {}),
            )
        except GatewayError as e:
            if e.status == 429:
                self.metrics.limit_rejections.labels(getattr(e, "limit", "other")).inc()
            if isinstance(e, LimitExceeded) and not adm.outputs:
                raise e.without_outputs() from None
            raise

    def degrade_hook(self, snap: Snapshot, key: KeyInfo, r: RequestState) -> degrade.Decision | None:
        """The degrade decision for request ``r`` of ``key`` (servelab.gateway.degrade): sets ``r.degraded``
        and ``r.model`` (a ``route_to``), raises its refusal; None when no rule applies."""
        deg = self.degrader.decide(
            snap.cfg, key, r.model, r.prompt_est, self.load.outstanding, lambda m: may_use_model(snap, key, m)
        )
        if deg is None:
            return None
        r.degraded = deg.log_record()
        if deg.refusal is not None:
            raise deg.refusal
        r.model = deg.model
        return deg
