"""The state of one gateway request, shared by admission, upstream, relay, accounting and the access log.

:class:`RequestState` is made when a request arrives (:mod:`servelab.gateway.server`) and filled as it
goes: who sent it (admission), which backend answered (upstream), TTFT and tokens (relay); the access-log
line, metrics, ledger row and limits settle are all read from it at the end (accounting, accesslog).
:class:`UpstreamFailed` is how one upstream attempt says it failed before any byte reached the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servelab.gateway.errors import GatewayError
from servelab.gateway.served import ServedCount
from servelab.gateway.shadow import ShadowRun
from servelab.gateway.timeline import Timeline

if TYPE_CHECKING:
    from servelab.gateway.apis import ApiAdapter

__all__ = ["RequestState", "UpstreamFailed"]


@dataclass(slots=True)
class RequestState:
    """Per-request state kept for the access log, metrics, ledger and settle."""

    rid: str
    endpoint: str
    t0_ns: int
    ts: float
    key_id: str = "-"
    tenant: str = "-"
    model: str = "-"
    backend: str | None = None
    upstream_model: str | None = None
    status: int = 0
    outcome: str = "ok"
    error_code: str | None = None
    ttft_ns: int | None = None
    #: the engine's stream ended well (its last event read): what follows in its body may be read in the
    #: background so its connection is kept (servelab.gateway.relay.close_upstream)
    upstream_done: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_est: int = 0
    token_events: int = 0
    served: bool = False
    retries: int = 0
    fallback: bool = False
    stream: bool = False
    prompt_text: str | None = None
    #: ``"model":"<public name>"`` as JSON bytes: replaces the engine's own model name in what is forwarded
    model_field: bytes = b""
    #: the engine's own ``"model":...`` member as last seen (exact bytes), for the fast replace
    model_seen: bytes = b""
    #: the client's own X-Request-ID (validated), logged apart from ``rid``
    client_rid: str | None = None
    #: the output bound per sequence this request reserved (tokens); what is forwarded never exceeds it
    out_cap: int = 0
    #: what a degrade rule did (degrade.Decision.log_record), for the access log
    degraded: dict[str, Any] | None = None
    #: the client IP limits count (servelab.gateway.clientip) and the key's application
    client_ip: str | None = None
    application: str | None = None
    #: sampling defaults applied and values clamped (policy.Applied.log_record)
    policy: dict[str, Any] | None = None
    #: usage per choice and request-wide (servelab.gateway.served): what n > 1 / prompt lists served
    tally: ServedCount | None = None
    #: the output bound forwarded to the engine on the attempt that answered (tokens per sequence)
    sent_cap: int = 0
    #: set when this request is mirrored to a shadow target: captures the answer sent (shadow.py)
    shadow: ShadowRun | None = None
    #: the API the client speaks when it is not chat completions (Anthropic Messages, OpenAI Responses):
    #: translated to chat at admission and back as relayed (servelab.gateway.apis); None = as forwarded
    api: ApiAdapter | None = None
    #: the attempt that answered sent the client's own API body to an engine serving it natively
    #: (servelab.gateway.apis.native), not its chat translation
    native: bool = False
    #: what happened when (servelab.gateway.timeline), for the access log and `servelab gateway explain`
    timeline: Timeline = field(default_factory=Timeline)
    #: its OpenTelemetry trace while tracing is on (servelab.gateway.tracing.RequestTrace), else None
    trace: Any = None


class UpstreamFailed(Exception):
    """An attempt failed before any byte reached the client; ``retry`` says whether another target may
    be tried (connection failure, timeout, engine 429/5xx or an error answer: degrade.another_target),
    ``error`` is what the client gets if none is left."""

    def __init__(self, error: GatewayError, retry: bool, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry = retry
        self.reason = reason
