"""The dialect table (servelab.wire.dialects) is the one list of backend kinds and their wire facts: the
gateway's kinds, the mock's dialects and every reader agree with it, and docs/engine-wire.md (which code
cites) has every case code cites."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import orjson

from servelab.engines.mock import DIALECTS as MOCK_DIALECTS
from servelab.engines.mock import REASONING_FIELD
from servelab.engines.mock.info import info_routes
from servelab.engines.registry import get as get_kind
from servelab.gateway import lengths, logprobs
from servelab.gateway.config import BACKEND_KINDS, SCHEMA_PATH, Backend
from servelab.gateway.enginefields import PRIORITY_KINDS
from servelab.gateway.health import HEALTH_PATHS
from servelab.wire.dialects import DIALECTS, ENGINE_DIALECTS, KINDS, Kind, stream_rules

ROOT = Path(__file__).resolve().parents[2]


def _literal_values(tp: object) -> list[str]:
    out: list[str] = []
    for a in typing.get_args(tp):
        out += _literal_values(a) if typing.get_origin(a) is typing.Literal else [a]
    return out


def test_the_gateway_kinds_are_the_tables() -> None:
    assert BACKEND_KINDS == KINDS == tuple(_literal_values(Kind))
    assert tuple(_literal_values(typing.get_type_hints(Backend)["kind"])) == KINDS
    schema = orjson.loads(SCHEMA_PATH.read_bytes())
    assert tuple(schema["$defs"]["Backend"]["properties"]["kind"]["enum"]) == KINDS
    assert {"vllm", "sglang", "tgi", "llamacpp", "ollama", "mock", "openai", "embedder"} == set(KINDS)


def test_the_mock_speaks_every_engine_dialect_of_the_table() -> None:
    assert MOCK_DIALECTS == ENGINE_DIALECTS == ("vllm", "sglang", "tgi", "llamacpp", "ollama")
    for d in MOCK_DIALECTS:
        assert DIALECTS[d].stream is not None and DIALECTS[d].error_shape is not None
        assert REASONING_FIELD[d] == DIALECTS[d].reasoning_field
        served = {(m, p) for m, p, _ in info_routes(d, "m", 512)} | {("GET", "/v1/models")}
        assert {tuple(r.split(" ", 1)) for r in DIALECTS[d].identity} <= served, d
    assert all(DIALECTS[k].stream is None for k in KINDS if k not in ENGINE_DIALECTS)


def test_every_reader_covers_every_kind() -> None:
    assert set(HEALTH_PATHS) == set(KINDS) and HEALTH_PATHS["ollama"] == "/" and HEALTH_PATHS["openai"] == "/v1/models"
    assert set(lengths.FORWARDERS) == set(KINDS)
    assert {"vllm", "sglang"} == PRIORITY_KINDS
    assert {(w, n) for w, n, _ in logprobs.COUNT_FIELDS} == {f.field for d in DIALECTS.values() for f in d.logprobs}
    assert stream_rules("llamacpp").overload_status is None and stream_rules("tgi").overflow_status == 422


def test_engine_kinds_name_their_dialect() -> None:
    assert get_kind("vllm").dialect is DIALECTS["vllm"]
    assert get_kind("llamacpp").dialect is DIALECTS["llamacpp"]
    assert get_kind("url").dialect is None


def test_code_cites_the_wire_page_in_the_repository() -> None:
    page = (ROOT / "docs" / "engine-wire.md").read_text(encoding="utf-8")
    cases = {int(n) for n in re.findall(r"^(\d+)\. ", page, re.M)}
    assert cases == set(range(1, 25))
    cited: set[int] = set()
    for p in (ROOT / "src" / "servelab").rglob("*.py"):
        text = p.read_text(encoding="utf-8")
        assert "ENGINE_WIRE" not in text, p
        for m in re.finditer(r"docs/engine-wire\.md cases? ([\d, -]+)", text):
            for part in re.findall(r"\d+(?:-\d+)?", m.group(1)):
                lo, _, hi = part.partition("-")
                cited |= set(range(int(lo), int(hi or lo) + 1))
    assert cited and cited <= cases
