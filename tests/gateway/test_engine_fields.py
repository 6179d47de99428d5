"""Engine scheduling, transport and template fields (issue 21 item 3): a client's ``priority``,
``kv_transfer_params``, ``chat_template``, ``vllm_xargs``, SGLang's ``bootstrap_*``/``rid``/
``custom_logit_processor``... never reach an engine unless the model's ``engine_fields.allow`` names them;
``priority`` is the gateway's, from the key's priority class, on vLLM/SGLang backends; the shadow copy
gets the same treatment. Through the real gateway process, in front of spy engines that record every
body they receive."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from conftest import gateway_key
from gateway.test_server import post

from servelab.gateway.config import parse_config
from servelab.gateway.enginefields import ENGINE_FIELDS
from servelab.wire.errors import ConfigError

#: what the attacking client sends beside its messages (issue 21 item 3, plus SGLang's and TGI's)
HOSTILE = {
    "priority": -1000,
    "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "10.0.0.9"},
    "chat_template": "{{ 'owned' }}",
    "chat_template_kwargs": {"enable_thinking": False},
    "vllm_xargs": {"x": 1},
    "rid": "victim-request",
    "bootstrap_host": "10.0.0.9",
    "bootstrap_room": 7,
    "custom_logit_processor": "gASV...",
    "return_hidden_states": True,
    "logits_processors": ["os.system"],
    "cache_salt": "other-team",
    "request_id": "victim",
    "lora_path": "/tmp/x",
    "tool_prompt": "x",
    "id_slot": 0,
}


class SpyEngine:
    """An OpenAI-compatible engine in a thread of the test process that answers every completion with
    "ok" and keeps each request body it received (``bodies``), in arrival order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "spy engine did not start"

    def _run(self) -> None:
        from aiohttp import web

        async def chat(request: web.Request) -> web.StreamResponse:
            body = orjson.loads(await request.read())
            self.bodies.append(body)
            usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
            if body.get("stream"):
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                chunk = {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "model": body.get("model"),
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                }
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
                await resp.write(b"data: " + orjson.dumps({**chunk, "choices": [], "usage": usage}) + b"\n\n")
                await resp.write(b"data: [DONE]\n\n")
                return resp
            return web.json_response(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                    ],
                    "usage": usage,
                }
            )

        async def health(request: web.Request) -> web.Response:
            return web.json_response({})

        async def start() -> None:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", chat)
            app.router.add_get("/health", health)
            app.router.add_get("/v1/models", health)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            self._ready.set()

        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def wait_for(self, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """The bodies once ``n`` have arrived (the shadow copy comes beside the primary's)."""
        deadline = time.monotonic() + timeout_s
        while len(self.bodies) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.bodies) >= n, self.bodies
        return self.bodies

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture
def spies() -> Iterator[Any]:
    made: list[SpyEngine] = []

    def factory() -> SpyEngine:
        made.append(SpyEngine())
        return made[-1]

    yield factory
    for s in made:
        s.stop()


def _config(
    primary: SpyEngine,
    shadow: SpyEngine,
    entries: list[dict[str, str]],
    fields: dict[str, Any] | None,
    shadow_kind: str = "sglang",
) -> dict[str, Any]:
    """Model m on a vLLM-kind primary, mirrored (every request) to a ``shadow_kind`` backend."""
    model: dict[str, Any] = {
        "targets": [{"backend": "v"}],
        "shadow": {"target": {"backend": "s", "model": "m-new"}, "sample_rate": 1.0},
    }
    if fields is not None:
        model["engine_fields"] = fields
    return {
        "backends": [
            {"name": "v", "kind": "vllm", "base_url": primary.url, "models": ["m-old"]},
            {"name": "s", "kind": shadow_kind, "base_url": shadow.url, "models": ["m-new"]},
        ],
        "models": {"m": model},
        "tenants": {"batchers": {"priority": "batch"}, "people": {"priority": "interactive"}},
        "keys": entries,
    }


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **extra}


def test_default_refuses_every_engine_field_with_one_line(gateway: Any, spies: Any) -> None:
    """No engine_fields in the config: each hostile field alone gets 400 engine_field_not_allowed naming
    it; neither engine receives anything; a plain request still passes."""
    v, s = spies(), spies()
    key, entry = gateway_key("kb", "batchers")
    gw = gateway(_config(v, s, [entry], None))
    for name, value in HOSTILE.items():
        st, _, raw = post(gw.url + "/chat/completions", _chat(**{name: value}), key)
        err = orjson.loads(raw)["error"]
        assert st == 400 and err["code"] == "engine_field_not_allowed" and err["param"] == name, (name, raw)
        assert f"'{name}'" in err["message"] and "engine_fields.allow" in err["message"], err
    assert v.bodies == [] and s.bodies == []
    st, _, raw = post(gw.url + "/chat/completions", _chat(), key)
    assert st == 200, raw
    primary, shadow = v.wait_for(1), s.wait_for(1)
    assert not set(primary[0]) & set(ENGINE_FIELDS) and not set(shadow[0]) & set(ENGINE_FIELDS)


def test_drop_strips_them_and_priority_comes_from_the_key_class(gateway: Any, spies: Any) -> None:
    """action drop, priority {batch: 10, interactive: -5}: the batch key's -1000 and every other hostile
    field reach neither the vLLM primary nor the SGLang shadow, both get priority 10; an interactive key's
    request gets -5; the access log names what was dropped."""
    v, s = spies(), spies()
    kb, eb = gateway_key("kb", "batchers")
    ki, ei = gateway_key("ki", "people")
    gw = gateway(_config(v, s, [eb, ei], {"action": "drop", "priority": {"batch": 10, "interactive": -5}}))
    for stream in (False, True):
        st, _, raw = post(gw.url + "/chat/completions", _chat(stream=stream, **HOSTILE), kb)
        assert st == 200, raw
    primary, shadow = v.wait_for(2), s.wait_for(2)
    for got, prio in ((primary[0], 10), (primary[1], 10), (shadow[0], 10), (shadow[1], 10)):
        assert got["priority"] == prio, got
        assert not (set(got) & set(ENGINE_FIELDS)) - {"priority"}, got
        assert got["messages"] == [{"role": "user", "content": "hi"}]
    st, _, raw = post(gw.url + "/chat/completions", _chat(priority=-1000), ki)
    assert st == 200, raw
    primary, shadow = v.wait_for(3), s.wait_for(3)
    assert primary[2]["priority"] == -5 and shadow[2]["priority"] == -5
    deadline = time.monotonic() + 10
    while len([r for r in gw.access_records() if r.get("status") == 200]) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    recs = [r for r in gw.access_records() if r.get("status") == 200]
    assert recs[0]["policy"]["engine_fields_dropped"] == sorted(HOSTILE), recs[0]
    assert recs[2]["policy"]["engine_fields_dropped"] == ["priority"]


def test_allow_list_forwards_only_what_it_names(gateway: Any, spies: Any) -> None:
    """allow [chat_template_kwargs, priority]: both reach the vLLM primary and the shadow as sent (no
    priority mapping); any other engine field is still refused, and dropped with action drop."""
    v, s = spies(), spies()
    kb, eb = gateway_key("kb", "batchers")
    gw = gateway(_config(v, s, [eb], {"allow": ["chat_template_kwargs", "priority"]}))
    st, _, raw = post(
        gw.url + "/chat/completions", _chat(chat_template_kwargs={"enable_thinking": False}, priority=3), kb
    )
    assert st == 200, raw
    primary, shadow = v.wait_for(1), s.wait_for(1)
    assert primary[0]["chat_template_kwargs"] == {"enable_thinking": False} and primary[0]["priority"] == 3
    assert shadow[0]["chat_template_kwargs"] == {"enable_thinking": False} and shadow[0]["priority"] == 3
    st, _, raw = post(gw.url + "/chat/completions", _chat(kv_transfer_params={"x": 1}), kb)
    assert st == 400 and orjson.loads(raw)["error"]["param"] == "kv_transfer_params", raw
    assert len(v.bodies) == 1


def test_priority_is_not_sent_to_kinds_without_priority_scheduling(gateway: Any, spies: Any) -> None:
    """A mapped class on a TGI-kind shadow: no priority in its copy (TGI has no such field)."""
    v, s = spies(), spies()
    kb, eb = gateway_key("kb", "batchers")
    gw = gateway(_config(v, s, [eb], {"priority": {"batch": 10}}, shadow_kind="tgi"))
    st, _, raw = post(gw.url + "/chat/completions", _chat(), kb)
    assert st == 200, raw
    assert v.wait_for(1)[0]["priority"] == 10
    assert "priority" not in s.wait_for(1)[0]


def test_config_names_an_unknown_engine_field() -> None:
    cfg = {
        "backends": [{"name": "v", "kind": "vllm", "base_url": "http://127.0.0.1:1", "models": ["m"]}],
        "models": {"m": {"targets": [{"backend": "v"}], "engine_fields": {"allow": ["priorty"]}}},
    }
    with pytest.raises(ConfigError) as ei:
        parse_config(cfg)
    line = str(ei.value)
    assert "\n" not in line and "models.m.engine_fields.allow" in line and "'priorty'" in line, line
