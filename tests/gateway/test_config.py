"""The gateway config file: the example loads, the published schema is current, errors name the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from servelab.gateway.config import SCHEMA_PATH, GatewayConfig, json_schema, load_config, parse_config
from servelab.wire.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"


def _base() -> dict[str, Any]:
    return {
        "backends": [
            {"name": "a", "kind": "vllm", "base_url": "http://127.0.0.1:8001/v1/", "models": ["m1"]},
            {"name": "b", "kind": "llamacpp", "base_url": "http://127.0.0.1:8002", "models": ["m2"], "pool": "canary"},
        ],
        "models": {
            "big": {"targets": [{"backend": "a"}], "fallback": [{"model": "small", "max_tokens": 64}]},
            "small": {"targets": [{"backend": "b", "model": "m2"}]},
        },
        "tenants": {"t": {"allowed_models": ["big"], "rpm": 10}},
        "keys": [{"id": "k1", "tenant": "t", "sha256": "a" * 64}],
        "routing": {"tasks": {"summarize": "small"}},
    }


def test_example_loads_with_every_section() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.server.port == 8080 and cfg.server.admin_port == 8081 and cfg.server.max_tokens_limit == 4096
    assert cfg.models["gemma"].capabilities.context_tokens == 8192
    assert cfg.models["gemma"].fallback[0].model == "small" and cfg.models["gemma"].fallback[0].max_tokens == 256
    assert [t.weight for t in cfg.models["gemma"].targets] == [95, 5]
    assert cfg.tenants["team-a"].tpm == 200000 and cfg.keys[0].tenant == "team-a"
    assert cfg.routing.tasks == {"summarize": "gemma"} and cfg.retry.attempts == 2 and cfg.breaker.open_s == 5
    # a relative SQLite path is resolved next to the config file
    assert cfg.ledger.sqlite_path == str(EXAMPLE.parent / "gateway-usage.db")


def test_defaults_and_normalisation() -> None:
    cfg = parse_config(_base())
    assert cfg.backends[0].base_url == "http://127.0.0.1:8001"  # trailing /v1/ dropped
    assert cfg.upstream_model(cfg.models["big"].targets[0]) == "m1"  # default: the backend's first model
    assert cfg.ledger.sqlite_path == "gateway-usage.db" and cfg.state.redis_url is None
    assert cfg.tenant_may_use("t", "big") and not cfg.tenant_may_use("t", "small")
    assert not cfg.tenant_may_use("nobody", "big")
    with pytest.raises(ValidationError, match="frozen"):
        cfg.server.port = 1  # type: ignore[misc]  # frozen: a snapshot cannot change under a request


def test_schema_file_is_current_and_validates_the_example() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    committed = json.loads(SCHEMA_PATH.read_text())
    assert committed == json_schema(), "run: servelab schema write"
    jsonschema.Draft202012Validator.check_schema(committed)
    v = jsonschema.Draft202012Validator(committed)
    assert not list(v.iter_errors(yaml.safe_load(EXAMPLE.read_text())))
    bad = yaml.safe_load(EXAMPLE.read_text())
    bad["server"]["prot"] = 1
    assert list(v.iter_errors(bad)), "the schema accepts an unknown field"


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda c: c["backends"][0].update(url="x"), "backends[0].url: unknown field"),
        (
            lambda c: c["backends"][0].update(base_url="ftp://x"),
            "backends[0].base_url: 'ftp://x' is not an http(s) URL",
        ),
        (lambda c: c["backends"][0].update(kind="trt"), "backends[0].kind"),
        (lambda c: c["backends"].append(dict(c["backends"][0])), "backends[2].name: 'a' is used twice"),
        (
            lambda c: c["models"]["big"]["targets"][0].update(backend="zz"),
            "models.big.targets[0].backend: 'zz' is not a backend",
        ),
        (
            lambda c: c["models"]["big"]["targets"][0].update(model="m9"),
            "models.big.targets[0].model: backend 'a' does not serve 'm9'",
        ),
        (
            lambda c: c["models"]["big"]["fallback"][0].update(model="huge"),
            "models.big.fallback[0].model: 'huge' is not a model",
        ),
        (lambda c: c["models"]["big"]["fallback"][0].update(model="big"), "cannot fall back to itself"),
        (
            lambda c: c["models"]["big"].update(capabilities={"context_tokens": 0}),
            "models.big.capabilities.context_tokens",
        ),
        (
            lambda c: c["models"]["big"].update(shadow={"target": {"backend": "q"}, "sample_rate": 0.1}),
            "models.big.shadow.target.backend",
        ),
        (
            lambda c: c["tenants"]["t"].update(allowed_models=["nope"]),
            "tenants.t.allowed_models[0]: 'nope' is not a model",
        ),
        (lambda c: c["tenants"]["t"].update(pools=["gpu"]), "tenants.t.pools[0]: no backend is in pool 'gpu'"),
        (
            lambda c: c["tenants"]["t"].update(redact=["(unclosed"]),
            "tenants.t.redact: redact[0] '(unclosed' is not a valid regular expression",
        ),
        (lambda c: c["keys"][0].update(tenant="x"), "keys[0].tenant: 'x' is not a tenant"),
        (lambda c: c["keys"][0].update(sha256="xyz"), "keys[0].sha256"),
        (lambda c: c["keys"][0].update(id="bad-id"), "keys[0].id"),
        (lambda c: c["routing"]["tasks"].update(chat="nope"), "routing.tasks.chat: 'nope' is not a model"),
        (lambda c: c.update(ledger={"sqlite_path": "a.db", "postgres_dsn": "postgresql://x@h/db"}), "not both"),
        (lambda c: c.update(state={"redis_url": "http://x"}), "state.redis_url"),
        (lambda c: c.update(server={"max_tokens_limit": 10, "default_max_tokens": 20}), "above max_tokens_limit"),
        (lambda c: c.update(backends=[]), "backends: needs at least 1 item, got 0; add one"),
        (lambda c: c.update(health={"metrics_max_bytes": 100}), "health.metrics_max_bytes"),
    ],
)
def test_errors_name_the_field(mutate: Any, expected: str) -> None:
    c = _base()
    mutate(c)
    with pytest.raises(ConfigError) as ei:
        parse_config(c, "gw.yaml")
    msg = str(ei.value)
    assert msg.startswith("gw.yaml: ") and expected in msg, msg
    assert "\n" not in msg


def test_file_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such gateway config file"):
        load_config(tmp_path / "missing.yaml")
    p = tmp_path / "g.yaml"
    p.write_text("server:\n  port: [1,\n")
    with pytest.raises(ConfigError, match=r"line \d+ column \d+: invalid YAML"):
        load_config(p)
    p.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_config(p)
    p.write_text("- 1\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(p)


def test_schema_is_published(tmp_path: Path) -> None:
    from servelab.gateway.config import PUBLISHED_SCHEMA

    assert PUBLISHED_SCHEMA.path == SCHEMA_PATH and PUBLISHED_SCHEMA.problem() is None
    assert isinstance(GatewayConfig.model_json_schema(), dict)
