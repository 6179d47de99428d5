"""Which factors differ between two candidates' identities, and whether their token counts compare.

000 §10.3 asks to change one factor at a time: :func:`compare_identities` names the factors that
differ (engine build, weights, every setting; values that differ between any two launches, such as the
port, left out) and says whether the comparison isolates one cause. :func:`comparability` says whether
output tok/s compare across candidates (000 §10.2: tokenizers differ across models).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from pydantic import JsonValue

from servelab.engines.registry import EngineIdentity
from servelab.trial.decide.fmt import short
from servelab.trial.results import CandidateIdentity, Comparability, Comparison

VOLATILE_KEYS = frozenset(
    {
        "port",
        "pid",
        "base_url",
        "url",
        "log_path",
        "log_dir",
        "started_at",
        "argv",
        "host",
        "out_dir",
        "cache_dir",
        "started_unix_s",
        "finished_unix_s",
        "ready_timeout_s",
    }
)
"""Leaf names ignored when comparing identities: they differ between any two launches."""


#: comparable identity factors as dotted keys (``engine.version``, ``settings.parallel``) -> value
Factors = dict[str, JsonValue]


def _flatten(d: JsonValue, prefix: str) -> Factors:
    out: Factors = {}
    if isinstance(d, dict):
        for k, v in d.items():
            # a command candidate's declared argv (``{port}``/``{host}`` placeholders, not the values) is
            # its configuration: two that differ only in ``--parallel`` differ in that factor
            if str(k) in VOLATILE_KEYS and not (prefix == "settings" and k == "argv"):
                continue
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = d
    return out


class EngineFacts(NamedTuple):
    """The comparable facts of a launcher identity: the engine's own name (``llama.cpp``), version
    and binary (or image) sha256; ``None`` where not recorded."""

    kind: str | None
    version: str | None
    binary_sha256: str | None


def engine_facts(engine: EngineIdentity | None) -> EngineFacts:
    """:class:`EngineFacts` of a launcher identity: ``kind`` is its ``engine`` (the engine's own name,
    e.g. ``llama.cpp``, as records of schema version 1 hold it), ``version`` and ``binary_sha256`` its
    own. Older shapes are turned into an :class:`EngineIdentity` when the record is read
    (:func:`servelab.trial.results.migrate`), so there is one spelling here."""
    if engine is None:
        return EngineFacts(None, None, None)
    return EngineFacts(engine.engine, engine.version, engine.binary_sha256)


def identity_factors(identity: CandidateIdentity | None) -> Factors:
    """The comparable factors of one candidate identity as dotted keys: ``engine.kind``,
    ``engine.version``, ``engine.binary_sha256``, ``model.sha256`` (``model.format`` when known),
    every ``settings.*`` leaf, volatile keys (:data:`VOLATILE_KEYS`) left out, and ``server.url`` for a
    server servelab did not start: its address is what tells it from another one (a launched engine's
    address is volatile, a port picked at launch)."""
    ident = identity or CandidateIdentity()
    out: Factors = {f"engine.{k}": v for k, v in engine_facts(ident.engine)._asdict().items()}
    if ident.url and ident.engine is None:
        out["server.url"] = ident.url.rstrip("/")
    model = ident.model or {}
    if not model and ident.engine is not None and isinstance(ident.engine.model, dict):
        model = ident.engine.model
    # a converted model (vLLM's HF folder from the same GGUF) names its source weights; the format
    # (quantized GGUF vs dequantized safetensors) is a factor of its own
    out["model.sha256"] = model.get("sha256") or model.get("source_gguf_sha256")
    meta = model.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    fmt = model.get("format") or (f"gguf {meta['file_type_name']}" if meta.get("file_type_name") else None)
    if fmt is not None:
        out["model.format"] = fmt
    out.update(_flatten(ident.settings, "settings"))
    return out


def compare_identities(
    a: CandidateIdentity | None, b: CandidateIdentity | None, a_name: str = "a", b_name: str = "b"
) -> Comparison:
    """Which factors differ between two identities: a :class:`Comparison` with ``a``/``b`` the names,
    ``details`` mapping every differing key to ``[a_value, b_value]`` and ``differs_in`` the
    *factors*: a different engine kind subsumes its version and binary, a different version subsumes
    the binary sha256, so one engine upgrade counts as one factor."""
    if not a or not b:
        missing = ", ".join(n for n, i in ((a_name, a), (b_name, b)) if not i)
        return Comparison(a=a_name, b=b_name, note=f"cannot compare: no identity recorded for {missing}")
    fa, fb = identity_factors(a), identity_factors(b)
    details: dict[str, list[JsonValue]] = {
        k: [fa.get(k), fb.get(k)] for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)
    }
    factors = list(details)
    if "engine.kind" in details:
        factors = [k for k in factors if k not in ("engine.version", "engine.binary_sha256")]
    elif "engine.version" in details:
        factors = [k for k in factors if k != "engine.binary_sha256"]
    # the server first, then the engine, the model, the settings
    rank = {"server": 0, "engine": 1, "model": 2, "settings": 3}
    factors.sort(key=lambda k: (rank.get(k.split(".", 1)[0], 4), k))
    if not factors:
        note = "no factor differs: same engine build, weights and settings"
    elif factors == ["server.url"]:
        va, vb = details["server.url"]
        note = (
            f"different servers ({short(va)} vs {short(vb)}) with nothing else recorded that differs: what "
            "runs behind each address (engine, weights, hardware) is not known here, so the comparison does "
            "not isolate one cause"
        )
    elif len(factors) == 1:
        k = factors[0]
        va, vb = details[k]
        note = f"one factor differs: {k} ({short(va)} vs {short(vb)}): the difference is attributable to it"
    else:
        note = f"{len(factors)} factors differ ({', '.join(factors)}): the comparison does not isolate one cause"
    return Comparison(a=a_name, b=b_name, differs_in=factors, details=details, note=note)


def tokenizer_key(identity: CandidateIdentity | None) -> str | None:
    """What decides a candidate's token counts: its weights' sha256 (a GGUF embeds its tokenizer;
    a converted folder names its source GGUF), else the served model name; ``None`` when unknown."""
    f = identity_factors(identity)
    sha = f.get("model.sha256")
    if sha:
        return f"sha256 {str(sha)[:12]}"
    name = (identity.model or {}).get("name") if identity is not None else None
    return f"model {name}" if name else None


def comparability(names: Sequence[str], identities: Mapping[str, CandidateIdentity]) -> Comparability:
    """:class:`Comparability` of token counts across ``names`` (000 §10.2: tokenizers differ across
    models, so tok/s may not compare): the same when every candidate's :func:`tokenizer_key` is equal
    (unknown everywhere counts as the same, and says so)."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(tokenizer_key(identities.get(n)) or "not recorded", []).append(n)
    same = len(groups) <= 1
    if same:
        key = next(iter(groups), "not recorded")
        note = (
            "same tokenizer for every candidate (weights " + key + "): output tok/s compare directly"
            if key != "not recorded"
            else "tokenizers not recorded (no local weights): output tok/s are compared as if the same; "
            "check that every candidate serves the same model"
        )
    else:
        note = (
            "tokenizers differ ("
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in groups.items())
            + "): token/s are per-tokenizer and not compared; candidates are ranked on completed "
            "requests/s for the same prompts, with success rate and time per request"
        )
    return Comparability(same_tokenizer=same, groups=groups, note=note)
