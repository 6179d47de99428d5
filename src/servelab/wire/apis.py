"""Anthropic Messages and OpenAI Responses on the bench's wire: each API's request body for a chat-shaped
:class:`RequestSpec`, and a parser of each API's event stream that fills the same :class:`RequestRecord` as
a chat stream, so the same metrics are computed from each API's own events.

What the bench measures, per API (docs/engine-wire.md, "Other APIs: Anthropic Messages and OpenAI Responses"):

- **first token** (TTFT): the first event that carries generated output — Messages ``content_block_delta``
  with a ``text_delta``, ``thinking_delta`` or ``input_json_delta``; Responses ``response.output_text.delta``,
  ``response.reasoning_text.delta``/``response.reasoning_summary_text.delta``, ``response.refusal.delta`` or
  ``response.function_call_arguments.delta``. Never ``message_start``/``ping``/``content_block_start`` or
  ``response.created``/``response.in_progress``/``response.output_item.added``: they come before any token
  (a translating gateway sends them with the first chunk, an engine may send them at once). As for chat,
  reasoning counts as a token and ``first_answer_ns`` is the first *text* delta (``text_delta``,
  ``response.output_text.delta``).
- **inter-token gaps**: between those delta events (each one token-carrying chunk).
- **usage**: the API's own fields — Messages ``message_start.message.usage`` updated by the cumulative
  ``message_delta.usage`` (``output_tokens``; prompt tokens = ``input_tokens`` + ``cache_read_input_tokens``
  + ``cache_creation_input_tokens``, cached = ``cache_read_input_tokens``); Responses the ``usage`` of
  ``response.completed``/``response.incomplete`` (``input_tokens``, ``output_tokens``,
  ``input_tokens_details.cached_tokens``). ``rec.usage`` keeps them as sent; :func:`usage_counts` reads them.
- **finish**: Messages ``stop_reason`` (``end_turn``/``stop_sequence`` -> ``stop``, ``max_tokens`` ->
  ``length``, ``tool_use`` -> ``tool_calls``, ``refusal`` -> ``content_filter``); Responses ``completed``
  -> ``stop`` (``tool_calls`` when it called a function), ``incomplete`` with ``max_output_tokens`` ->
  ``length`` (also when a ``response.completed`` event carries ``status: "incomplete"``, as vLLM sends a
  response cut by its bound: vllm/entrypoints/openai/responses/serving.py). ``finish_reason_raw`` is the
  API's own value.
- **end and failures**: a stream ends well at ``message_stop`` / ``response.completed`` or
  ``response.incomplete`` (``saw_done``); without it the request is ``cut_off``. An ``error`` event
  (either API) or ``response.failed`` is a ``stream_error``.
"""

from __future__ import annotations

from typing import Any

from servelab.wire.errors import ConfigError, error_from_event
from servelab.wire.stream import StreamParser, _apply_parts, _count_token_chunk
from servelab.wire.types import FailureClass, RequestSpec, ToolCall, WireError

__all__ = [
    "API_ENDPOINTS",
    "ANTHROPIC_VERSION",
    "MessagesStreamParser",
    "ResponsesStreamParser",
    "api_headers",
    "messages_body",
    "responses_body",
    "usage_counts",
]

#: the request endpoints spoken in another API's shape, and their paths under the API root
API_ENDPOINTS = {"messages": "/messages", "responses": "/responses"}
#: the ``anthropic-version`` header the bench sends (the one the Anthropic SDKs send)
ANTHROPIC_VERSION = "2023-06-01"

_MESSAGES_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "model_context_window_exceeded": "length",
}
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


# --------------------------------------------------------------------------------------------- request bodies


def _split_system(spec: RequestSpec, api: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(the system messages' text joined, the other messages) of a chat-shaped spec; ConfigError for a
    message the API's text form cannot carry."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for m in spec.messages or ():
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "developer", "user", "assistant") or not isinstance(content, str | list):
            raise ConfigError(
                f"--endpoint {api}: a {role!r} message cannot be sent as {api}; the bench sends "
                "system, user and assistant messages with text content (use --endpoint chat)"
            )
        if isinstance(content, list):
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise ConfigError(f"--endpoint {api}: only text content is sent as {api} (use --endpoint chat)")
            content = "".join(p["text"] for p in content)
        if role in ("system", "developer"):
            system.append(content)
        else:
            turns.append({"role": role, "content": content})
    if not turns:
        raise ConfigError(f"--endpoint {api}: a request needs a user message")
    return ("\n\n".join(system) if system else None), turns


def _unsupported(api: str, key: str) -> ConfigError:
    return ConfigError(
        f"--endpoint {api}: {key!r} is not a field of the {api} API (the bench sends only what "
        f"the API defines); leave it out (--ignore-eos, --set extra=..., a structured or tools "
        "workload) or use --endpoint chat"
    )


def messages_body(model: str, spec: RequestSpec, stream: bool = True) -> dict[str, Any]:
    """The Anthropic ``/v1/messages`` body for a chat-shaped ``spec``: system messages -> ``system``,
    ``max_tokens`` (required: ConfigError without one), ``stop`` -> ``stop_sequences``,
    ``temperature``/``top_p``/``top_k`` as they are; any other ``extra`` key raises ConfigError (one line)."""
    if spec.max_tokens is None:
        raise ConfigError(
            "--endpoint messages: the Messages API needs max_tokens on every request; give each "
            "dataset entry a max_tokens"
        )
    system, turns = _split_system(spec, "messages")
    body: dict[str, Any] = {"model": model, "max_tokens": spec.max_tokens, "messages": turns, "stream": stream}
    if system is not None:
        body["system"] = system
    for k, v in spec.extra.items():
        if k in ("temperature", "top_p", "top_k"):
            body[k] = v
        elif k == "stop":
            body["stop_sequences"] = [v] if isinstance(v, str) else list(v)
        else:
            raise _unsupported("messages", k)
    return body


def responses_body(model: str, spec: RequestSpec, stream: bool = True) -> dict[str, Any]:
    """The OpenAI ``/v1/responses`` body for a chat-shaped ``spec``: system messages -> ``instructions``, the
    rest as ``input`` message items, ``max_tokens`` -> ``max_output_tokens``, ``store: false`` (stateless,
    as agents send it), ``response_format`` -> ``text.format``, ``temperature``/``top_p`` as they are; any
    other ``extra`` key raises ConfigError (one line)."""
    system, turns = _split_system(spec, "responses")
    body: dict[str, Any] = {
        "model": model,
        "input": [{"type": "message", **t} for t in turns],
        "stream": stream,
        "store": False,
    }
    if system is not None:
        body["instructions"] = system
    if spec.max_tokens is not None:
        body["max_output_tokens"] = spec.max_tokens
    for k, v in spec.extra.items():
        if k in ("temperature", "top_p"):
            body[k] = v
        elif k == "response_format" and isinstance(v, dict):
            if v.get("type") == "json_schema" and isinstance(v.get("json_schema"), dict):
                body["text"] = {"format": {"type": "json_schema", **v["json_schema"]}}
            else:
                body["text"] = {"format": dict(v)}
        else:
            raise _unsupported("responses", k)
    return body


def api_headers(endpoint: str, headers: dict[str, str]) -> dict[str, str]:
    """``headers`` for a request to ``endpoint``: a Messages request also carries ``anthropic-version`` and
    the Bearer key as ``x-api-key`` (how the Anthropic SDKs send it; ``Authorization`` stays for servers
    that read only that)."""
    if endpoint != "messages":
        return headers
    out = {**headers, "anthropic-version": ANTHROPIC_VERSION}
    auth = headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        out["x-api-key"] = auth[7:]
    return out


# --------------------------------------------------------------------------------------------- usage


def usage_counts(u: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(prompt tokens, output tokens, cached prompt tokens) of a usage object of any of the three APIs:
    chat (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``), Messages
    (``input_tokens`` + ``cache_read_input_tokens`` + ``cache_creation_input_tokens``, ``output_tokens``,
    ``cache_read_input_tokens``), Responses (``input_tokens``, ``output_tokens``,
    ``input_tokens_details.cached_tokens``). A count the object does not hold is None (unknown, never 0)."""

    def num(k: str) -> int | None:
        v = u.get(k)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    if "prompt_tokens" in u or "completion_tokens" in u:
        prompt, out, details = num("prompt_tokens"), num("completion_tokens"), u.get("prompt_tokens_details")
    else:
        prompt, out, details = num("input_tokens"), num("output_tokens"), u.get("input_tokens_details")
        read, made = num("cache_read_input_tokens"), num("cache_creation_input_tokens")
        if prompt is not None and (read is not None or made is not None):
            prompt += (read or 0) + (made or 0)
        if read is not None:
            return prompt, out, read
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return prompt, out, cached if isinstance(cached, int) and not isinstance(cached, bool) else None


# --------------------------------------------------------------------------------------------- stream parsers


class _ApiStreamParser(StreamParser):
    """A :class:`StreamParser` whose events are another API's typed events (``type`` in each data payload;
    the SSE ``event:`` line repeats it and is not needed). Subclasses implement :meth:`_typed`."""

    __slots__ = ()

    def _event(self, payload: bytes, t_ns: int) -> None:
        rec = self.rec
        if rec.first_event_ns is None:
            rec.first_event_ns = t_ns
        ev = self._decoded(payload)
        if ev is not None and rec.failure is None:
            self._typed(ev, str(ev.get("type") or ""), t_ns)

    def _typed(self, ev: dict[str, Any], kind: str, t_ns: int) -> None:
        raise NotImplementedError

    def close(self, t_ns: int) -> None:
        """As :meth:`StreamParser.close`, but a stream ends well only at its API's last event."""
        super().close(t_ns)
        rec = self.rec
        if rec.failure is None and not rec.saw_done:
            rec.failure = FailureClass.CUT_OFF

    def _error(self, err: WireError | None) -> None:
        self.rec.failure = FailureClass.STREAM_ERROR
        self.rec.error = err or WireError(status=self.rec.status, message="error event without a message")

    def _token(self, t_ns: int, text: str = "", reasoning: str = "") -> None:
        """A delta event that carried generated output (answer ``text`` or ``reasoning``; neither: a
        tool-call fragment, joined by the caller)."""
        part = {"reasoning": reasoning} if reasoning else {}
        _apply_parts(self.rec, part, t_ns, text)
        _count_token_chunk(self.rec, None, t_ns, None)

    def _finish(self, raw: str, normalized: str) -> None:
        self.rec.finish_reason_raw = raw
        self.rec.finish_reason = normalized


class MessagesStreamParser(_ApiStreamParser):
    """Anthropic Messages stream events into a :class:`RequestRecord` (module doc)."""

    __slots__ = ()

    def _typed(self, ev: dict[str, Any], kind: str, t_ns: int) -> None:
        rec = self.rec
        if kind == "content_block_delta":
            d = ev.get("delta")
            if not isinstance(d, dict):
                return
            dt = d.get("type")
            if dt == "text_delta" and isinstance(d.get("text"), str) and d["text"]:
                self._token(t_ns, text=d["text"])
            elif dt == "thinking_delta" and isinstance(d.get("thinking"), str) and d["thinking"]:
                self._token(t_ns, reasoning=d["thinking"])
            elif dt == "input_json_delta" and isinstance(d.get("partial_json"), str) and d["partial_json"]:
                call = rec.tool_calls.get(_int(ev.get("index")))
                if call is not None:
                    call.arguments += d["partial_json"]
                    self._token(t_ns)
            # signature_delta and other deltas carry no generated token
        elif kind == "content_block_start":
            block = ev.get("content_block")
            if isinstance(block, dict) and block.get("type") in ("tool_use", "server_tool_use"):
                i = _int(ev.get("index"))
                rec.tool_calls[i] = ToolCall(index=i, id=_str(block.get("id")), name=_str(block.get("name")))
        elif kind == "message_start":
            msg = ev.get("message")
            if isinstance(msg, dict):
                if rec.response_model is None and msg.get("model"):
                    rec.response_model = msg["model"]
                if isinstance(msg.get("usage"), dict):
                    rec.usage = dict(msg["usage"])
        elif kind == "message_delta":
            d = ev.get("delta")
            stop = d.get("stop_reason") if isinstance(d, dict) else None
            if isinstance(stop, str) and stop:
                self._finish(stop, _MESSAGES_STOP.get(stop, "other"))
            u = ev.get("usage")
            if isinstance(u, dict):  # cumulative: its counts replace message_start's
                rec.usage = {**(rec.usage or {}), **{k: v for k, v in u.items() if v is not None}}
        elif kind == "message_stop":
            rec.saw_done = True
            rec.done_ns = t_ns
        elif kind == "error" or "error" in ev:
            self._error(error_from_event(ev, rec.status))


class ResponsesStreamParser(_ApiStreamParser):
    """OpenAI Responses stream events into a :class:`RequestRecord` (module doc). Function-call arguments
    are joined per output item (``output_index``)."""

    __slots__ = ()

    def _typed(self, ev: dict[str, Any], kind: str, t_ns: int) -> None:
        rec = self.rec
        delta = ev.get("delta")
        if kind == "response.output_text.delta" or kind == "response.refusal.delta":
            if isinstance(delta, str) and delta:
                self._token(t_ns, text=delta)
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            if isinstance(delta, str) and delta:
                self._token(t_ns, reasoning=delta)
        elif kind == "response.function_call_arguments.delta":
            call = rec.tool_calls.get(_int(ev.get("output_index")))
            if call is not None and isinstance(delta, str) and delta:
                call.arguments += delta
                self._token(t_ns)
        elif kind == "response.output_item.added":
            item = ev.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                i = _int(ev.get("output_index"))
                rec.tool_calls[i] = ToolCall(index=i, id=_str(item.get("call_id")), name=_str(item.get("name")))
        elif kind in ("response.created", "response.in_progress"):
            resp = ev.get("response")
            if rec.response_model is None and isinstance(resp, dict) and resp.get("model"):
                rec.response_model = resp["model"]
        elif kind in ("response.completed", "response.incomplete"):
            resp = ev.get("response")
            resp = resp if isinstance(resp, dict) else {}
            if isinstance(resp.get("usage"), dict):
                rec.usage = resp["usage"]
            if kind == "response.completed" and resp.get("status") != "incomplete":
                self._finish("completed", "tool_calls" if rec.tool_calls else "stop")
            else:
                det = resp.get("incomplete_details")
                why = det.get("reason") if isinstance(det, dict) else None
                self._finish(str(why or "incomplete"), _INCOMPLETE.get(str(why), "other"))
            rec.saw_done = True
            rec.done_ns = t_ns
        elif kind == "response.failed":
            resp = ev.get("response")
            err = resp.get("error") if isinstance(resp, dict) else None
            if isinstance(err, dict):
                self._error(
                    WireError(
                        status=rec.status,
                        message=str(err.get("message", "")),
                        type="response.failed",
                        code=err.get("code"),
                    )
                )
            else:
                self._error(None)
        elif kind == "error":
            self._error(
                WireError(status=rec.status, message=str(ev.get("message", "")), type="error", code=ev.get("code"))
                if "message" in ev
                else error_from_event(ev, rec.status)
            )


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else -1


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None
