"""What the mock engine did for one request: :class:`MockRecord`, with the ``time.monotonic_ns()`` at which
it wrote every token-carrying chunk, so a client's measurements can be checked against what the server really
did. These are the items of ``GET /mock/records``; :data:`INJECTED_KINDS` are the failure kinds a record (and
``/mock/stats``) names, :data:`SAMPLING_FIELDS` the body fields a chat or completions record keeps.
"""

from __future__ import annotations

from typing import Any

__all__ = ["INJECTED_KINDS", "SAMPLING_FIELDS", "MockRecord"]

#: Injected failure kinds, as counted in ``/mock/stats``.
INJECTED_KINDS = ("http_status", "stream_error", "cut_off", "hang", "overload")

#: body fields a :class:`MockRecord` keeps in ``sampling`` (OpenAI's plus common engine extensions)
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "seed",
    "max_tokens",
    "max_completion_tokens",
)


class MockRecord:
    """What the mock did for one request; all times are ``time.monotonic_ns()`` values.

    ``token_write_ns[i]`` is taken right before the write of the i-th token-carrying chunk, which carried
    ``token_counts[i]`` tokens. ``headers_ns`` is when the status line and headers were handed to the
    transport (with held headers, together with the first token). ``injected`` is ``None`` or one of
    :data:`INJECTED_KINDS`. ``request_id``: the ``X-Request-Id`` header (the servelab gateway's own id)
    or a sequence number; ``client_request_id``: the ``X-Client-Request-ID`` header the gateway passes on
    (the client's id), or None. ``sampling``: the sampling fields of the request body as received
    (:data:`SAMPLING_FIELDS` present in it), so what a gateway forwarded can be checked.
    """

    __slots__ = (
        "request_id",
        "client_request_id",
        "endpoint",
        "stream",
        "model",
        "recv_ns",
        "headers_ns",
        "token_write_ns",
        "token_counts",
        "done_ns",
        "injected",
        "status",
        "output_tokens",
        "prompt_tokens",
        "finish_reason",
        "sampling",
        "cached_tokens",
        "traceparent",
    )

    def __init__(self, request_id: str, recv_ns: int) -> None:
        self.request_id = request_id
        self.client_request_id: str | None = None
        self.recv_ns = recv_ns
        self.endpoint = ""
        self.stream = True
        self.model: str | None = None
        self.headers_ns: int | None = None
        self.token_write_ns: list[int] = []
        self.token_counts: list[int] = []
        self.done_ns: int | None = None
        self.injected: str | None = None
        self.status: int | None = None
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.finish_reason: str | None = None
        self.sampling: dict[str, Any] = {}
        #: prompt words found in the prefix cache (--prefix-cache-blocks; 0 without one)
        self.cached_tokens = 0
        #: the W3C ``traceparent`` header received (a tracing gateway's attempt span), or None
        self.traceparent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (the shape of one ``/mock/records`` item)."""
        return {k: getattr(self, k) for k in self.__slots__}
