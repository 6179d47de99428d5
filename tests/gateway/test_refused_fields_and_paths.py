"""Break-it report on 4b30bb7, lesser defects, through a real gateway process:
``grammar`` (and other constrained-decoding fields) passed a model whose capabilities say json_schema
false; the admin API created keys with allowed_models the tenant cannot use; ``POST
/v1/chat%2fcompletions`` answered "takes POST requests, not POST"."""

from __future__ import annotations

from typing import Any

import orjson
from conftest import ADMIN_TOKEN, gateway_key
from gateway.test_server import post


def _gw(gateway: Any, mock_engine: Any) -> tuple[Any, str]:
    eng = mock_engine("--dialect", "vllm")
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "backends": [{"name": "b", "kind": "vllm", "base_url": eng.root, "models": ["m", "x"]}],
            "models": {
                "m": {"targets": [{"backend": "b"}], "capabilities": {"json_schema": False}},
                "x": {"targets": [{"backend": "b"}]},
            },
            "tenants": {"t": {"allowed_models": ["m"]}},
            "keys": [entry],
        }
    )
    return gw, key


def test_constrained_decoding_fields_refused_without_json_schema(gateway: Any, mock_engine: Any) -> None:
    gw, key = _gw(gateway, mock_engine)
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for field, value in (
        ("grammar", 'root ::= "yes"'),
        ("guided_regex", "a+"),
        ("guided_choice", ["a", "b"]),
        ("json_schema", {"type": "object"}),
        ("structured_outputs", {"regex": "a"}),
        ("regex", "a+"),
        ("ebnf", 'root ::= "a"'),
    ):
        st, _, raw = post(gw.url + "/chat/completions", {**base, field: value}, key)
        err = orjson.loads(raw)["error"]
        assert st == 400 and err["code"] == "json_schema_not_supported" and err["param"] == field, (field, raw)
    st, _, raw = post(gw.url + "/chat/completions", base, key)
    assert st == 200, raw


def test_encoded_slash_path_is_named(gateway: Any, mock_engine: Any) -> None:
    gw, key = _gw(gateway, mock_engine)
    st, _, raw = post(gw.root + "/v1/chat%2fcompletions", {"model": "m"}, key)
    msg = orjson.loads(raw)["error"]["message"]
    assert st == 404 and "not POST" not in msg and "encoded '/'" in msg and "/v1/chat/completions" in msg, raw


def test_admin_refuses_key_models_the_tenant_cannot_use(gateway: Any, mock_engine: Any) -> None:
    gw, _ = _gw(gateway, mock_engine)
    adm = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for models in (["x"], ["m", "x"], ["*"]):
        st, _, raw = post(gw.admin_url + "/admin/keys", {"tenant": "t", "allowed_models": models}, headers=adm)
        assert st == 400 and "not allowed for tenant 't'" in orjson.loads(raw)["error"]["message"], (models, raw)
    st, _, raw = post(gw.admin_url + "/admin/keys", {"tenant": "t", "allowed_models": ["m"]}, headers=adm)
    assert st == 201, raw
