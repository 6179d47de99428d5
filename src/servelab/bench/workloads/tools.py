"""Tool calling, tested seriously (seed 003 §11, seed 000 §5): the built-in tool set of the ``tools``
workload and the per-request gate that checks every tool call against the tool it names.

:data:`TOOLS` are four OpenAI-format function tools with nested parameter schemas (objects in objects,
arrays of objects, enums, integer bounds). Request ``i`` of the ``tools`` workload offers all four and
sets ``tool_choice`` in turn to ``"auto"``, ``"required"`` and a named function (:func:`tool_choice_for`).

:func:`tool_call_failures` is the gate: for a request that offered tools, each tool call (joined from its
stream fragments by :mod:`servelab.wire.stream`) must name an offered tool (the named one, when
``tool_choice`` names one), carry JSON arguments, and those arguments must validate against that tool's
``parameters`` JSON Schema (jsonschema, the schema's own draft); ``"required"`` or a named choice with no
tool call at all fails too. ``"auto"`` may answer in text. Reasons are short stable strings:
``tool_call_missing``, ``tool_call_unknown_name``, ``tool_call_wrong_name``, ``tool_args_invalid_json``,
``tool_args_schema_mismatch``. Tool-call request format: https://platform.openai.com/docs/api-reference/chat/create
(``tools``, ``tool_choice``; read 2026-12-01).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from servelab.wire.types import RequestRecord, RequestSpec

__all__ = ["TOOLS", "tool_call_failures", "tool_choice_for", "tool_names"]


def _fn(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


_LOCATION = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "city name"},
        "country": {"type": "string", "description": "ISO 3166-1 alpha-2 code"},
    },
    "required": ["city", "country"],
    "additionalProperties": False,
}

TOOLS: list[dict[str, Any]] = [
    _fn(
        "get_weather",
        "Current weather at a place.",
        {
            "type": "object",
            "properties": {"location": _LOCATION, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location", "unit"],
            "additionalProperties": False,
        },
    ),
    _fn(
        "search_flights",
        "Search flights between two airports.",
        {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "description": "IATA airport code"},
                "destination": {"type": "string", "description": "IATA airport code"},
                "date": {"type": "string", "description": "departure date, YYYY-MM-DD"},
                "passengers": {
                    "type": "object",
                    "properties": {
                        "adults": {"type": "integer", "minimum": 1, "maximum": 9},
                        "children": {"type": "integer", "minimum": 0, "maximum": 9},
                    },
                    "required": ["adults", "children"],
                    "additionalProperties": False,
                },
                "cabin": {"type": "string", "enum": ["economy", "premium", "business", "first"]},
            },
            "required": ["origin", "destination", "date", "passengers", "cabin"],
            "additionalProperties": False,
        },
    ),
    _fn(
        "create_event",
        "Create a calendar event and invite people.",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "start": {"type": "string", "description": "ISO 8601 date-time"},
                "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 1440},
                "attendees": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
                        "required": ["name", "email"],
                        "additionalProperties": False,
                    },
                },
                "reminders": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            },
            "required": ["title", "start", "duration_minutes", "attendees"],
            "additionalProperties": False,
        },
    ),
    _fn(
        "convert_currency",
        "Convert an amount between currencies.",
        {
            "type": "object",
            "properties": {
                "amount": {"type": "number", "minimum": 0},
                "source": {"type": "string", "enum": ["USD", "EUR", "CNY", "JPY", "GBP"]},
                "target": {"type": "string", "enum": ["USD", "EUR", "CNY", "JPY", "GBP"]},
            },
            "required": ["amount", "source", "target"],
            "additionalProperties": False,
        },
    ),
]

#: one user request per tool, in the order of :data:`TOOLS`
ASKS = (
    "What is the weather in Lyon, France, in celsius?",
    "Find me an economy flight from PEK to CDG on 2027-03-14 for two adults and one child.",
    "Book a 30 minute meeting called 'Design review' tomorrow at 10:00 with Ana (ana@example.com).",
    "How much is 250 euros in Chinese yuan?",
)


def tool_names(tools: Any) -> list[str]:
    """The function names offered in an OpenAI ``tools`` list (entries without a name are skipped)."""
    out = []
    for t in tools if isinstance(tools, list) else []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out.append(fn["name"])
    return out


def tool_choice_for(i: int, tool_index: int) -> Any:
    """``tool_choice`` of request ``i`` of the ``tools`` workload: ``"auto"``, ``"required"``, then the
    named function ``TOOLS[tool_index]``, in turn."""
    k = i % 3
    if k == 0:
        return "auto"
    if k == 1:
        return "required"
    return {"type": "function", "function": {"name": TOOLS[tool_index]["function"]["name"]}}


def _schema(tools: Any, name: str) -> dict[str, Any] | None:
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            p = fn.get("parameters")
            return p if isinstance(p, dict) else {}
    return None


def tool_call_failures(rec: RequestRecord, spec: RequestSpec) -> list[str]:
    """The gate's reasons for ``rec`` (a succeeded request of ``spec``); ``[]`` when it passes or when
    ``spec`` offered no tools. Each reason appears once, in the order met (see the module doc)."""
    tools = spec.extra.get("tools")
    if not isinstance(tools, list) or not tools:
        return []
    choice = spec.extra.get("tool_choice", "auto")
    named = None
    if isinstance(choice, dict):
        fn = choice.get("function")
        named = fn.get("name") if isinstance(fn, dict) else None
    calls = [rec.tool_calls[k] for k in sorted(rec.tool_calls)]
    out: list[str] = []

    def fail(reason: str) -> None:
        if reason not in out:
            out.append(reason)

    if not calls and (choice == "required" or named is not None):
        fail("tool_call_missing")
    for tc in calls:
        schema = _schema(tools, tc.name or "")
        if schema is None:
            fail("tool_call_unknown_name")
            continue
        if named is not None and tc.name != named:
            fail("tool_call_wrong_name")
        try:
            args = json.loads(tc.arguments) if tc.arguments.strip() else {}
        except ValueError:
            fail("tool_args_invalid_json")
            continue
        try:
            jsonschema.validators.validator_for(schema)(schema).validate(args)
        except jsonschema.ValidationError:
            fail("tool_args_schema_mismatch")
        except jsonschema.SchemaError:
            fail("tool_args_schema_mismatch")  # a tool schema that cannot validate anything
    return out
