"""The other APIs the gateway speaks besides OpenAI chat completions: Anthropic Messages
(:mod:`servelab.gateway.apis.messages`: ``POST /v1/messages``, ``/v1/messages/count_tokens``) and OpenAI
Responses (:mod:`servelab.gateway.apis.responses`: ``POST /v1/responses``).

Each is translated to a chat-completions request at admission and its answer translated back as it is
relayed, so the request goes through the one per-request pipeline of chat completions (keys, tenant
permissions, limits and budgets, the output cap, sampling policy, degrade rules, fallbacks, shadow, the
ledger's exact usage, scrubbed errors). An :class:`ApiAdapter` is made per request (it keeps the stream's
state); the gateway's admission, relay and error answer call its hooks when ``RequestState.api`` is set.

An API that some engines serve themselves (:attr:`ApiAdapter.native`) keeps the client's body
(:attr:`ApiAdapter.source`): a target whose backend serves it natively gets that body unchanged but for the
gateway's decisions (:mod:`servelab.gateway.apis.native`), the others the translation.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from servelab.gateway.apis.chatstream import Part, chunk_events, chunk_parts
from servelab.gateway.errors import GatewayError


class RequestState(Protocol):
    """What an adapter reads of a request (:class:`servelab.gateway.reqstate.RequestState` has it): the
    gateway's request id, the model asked for and the usage counted so far (tokens). A protocol, so that
    reqstate (which holds the adapter) and this package do not import each other."""

    rid: str
    model: str
    prompt_tokens: int | None
    completion_tokens: int | None


__all__ = ["ApiAdapter", "RequestState", "StreamingApi"]


class ApiAdapter:
    """One request of a translated API (module doc). Subclasses set :attr:`name` (the access log's
    ``api``) and implement the hooks; every hook that answers bytes answers the client's wire format."""

    #: the API's name: ``messages``, ``count_tokens``, ``responses``
    name = "chat"
    #: the API name a backend may serve natively (``servelab.wire.dialects.Dialect.native_apis``), None = always
    #: translated
    native: str | None = None
    #: the client's body as received (set by :meth:`translate` of an API with :attr:`native`)
    source: dict[str, Any] | None = None

    def key_header(self, request: web.Request) -> str | None:
        """The credential to check, in ``Authorization`` header form (``Bearer ...`` or a bare key)."""
        return request.headers.get("Authorization")

    def translate(self, body: dict[str, Any], max_tokens_limit: int) -> dict[str, Any]:
        """The chat-completions body for the API's ``body``; ``max_tokens_limit``: ``server.max_tokens_limit``
        (tokens), checked here under the API's own field name. Raises GatewayError 400 naming the field."""
        raise NotImplementedError

    def whole(self, answer: dict[str, Any], r: RequestState) -> bytes:
        """The API's answer (JSON bytes) for a whole chat completion ``answer``; usage is ``r``'s (the
        ledger's) numbers."""
        raise NotImplementedError

    def stream(self, block: bytes, r: RequestState) -> bytes:
        """The API's SSE events for ``block`` (complete chat-completion SSE events, already inspected by
        the relay: usage is in ``r``)."""
        raise NotImplementedError

    def stream_end(self, r: RequestState) -> bytes:
        """The closing events of a stream that ended well (nothing when already sent)."""
        raise NotImplementedError

    def stream_error(self, e: GatewayError, r: RequestState) -> bytes:
        """The API's in-stream error for a stream that broke after its first byte."""
        raise NotImplementedError

    def error_response(self, e: GatewayError, rid: str) -> web.Response:
        """The HTTP error answer in the API's shape (default: OpenAI's, as chat completions)."""
        return web.Response(
            status=e.status,
            body=e.body(),
            content_type="application/json",
            headers={"X-Request-ID": rid, **e.headers()},
        )


class StreamingApi(ApiAdapter):
    """An API whose stream is made from the chat stream's parts (servelab.gateway.apis.chatstream): the
    driver is here, the API's events in :meth:`opening` (before the first part), :meth:`on_part` (one
    reasoning/text/tool part), :meth:`closing` (after the last; the finish reason is in :attr:`finish`)
    and :meth:`failure` (a stream that broke)."""

    def __init__(self) -> None:
        self.started = False
        self.ended = False
        #: the chat finish reason (``stop``, ``length``, ``tool_calls``), "" until the engine sent it
        self.finish = ""

    def opening(self, r: RequestState) -> bytes:
        """The events that open the stream."""
        raise NotImplementedError

    def on_chunk(self, ev: dict[str, Any]) -> None:
        """Look at one chat chunk before its parts (e.g. for the stop string that ended it)."""

    def on_part(self, p: Part, r: RequestState) -> bytes:
        """The events for one reasoning, text or tool part."""
        raise NotImplementedError

    def closing(self, r: RequestState) -> bytes:
        """The events that close a stream that ended well (usage is ``r``'s)."""
        raise NotImplementedError

    def failure(self, e: GatewayError, r: RequestState) -> bytes:
        """The events of a stream that broke after its first byte."""
        raise NotImplementedError

    def _begin(self, r: RequestState) -> bytes:
        if self.started:
            return b""
        self.started = True
        return self.opening(r)

    def stream(self, block: bytes, r: RequestState) -> bytes:
        out = self._begin(r)
        for ev in chunk_events(block):
            if ev is None:  # data: [DONE]
                out += self.stream_end(r)
                continue
            self.on_chunk(ev)
            for p in chunk_parts(ev):
                if p.kind == "finish":
                    self.finish = p.text
                else:
                    out += self.on_part(p, r)
        return out

    def stream_end(self, r: RequestState) -> bytes:
        if self.ended:
            return b""
        self.ended = True
        return self._begin(r) + self.closing(r)

    def stream_error(self, e: GatewayError, r: RequestState) -> bytes:
        self.ended = True
        return self._begin(r) + self.failure(e, r)
