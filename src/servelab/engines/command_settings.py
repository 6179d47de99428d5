"""The settings of the engine kind ``command`` (:class:`CommandSettings`, with its HTTP readiness probe
:class:`ReadyProbe`): what an experiment or gateway config writes under ``engine: command``. Apart from
:mod:`servelab.engines.command` (the launcher and the kind) so that the identity
(:mod:`servelab.engines.command_identity`), which reads them, and the launcher, which uses the identity,
import them without a cycle.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from servelab.engines.envsettings import EnvSettings
from servelab.engines.kind import PortSetting
from servelab.wire.config import StrictModel

__all__ = ["CommandSettings", "ReadyProbe"]


class ReadyProbe(StrictModel):
    """Readiness by HTTP: ``GET path`` (on the server root) answers ``status``. Connection refused and
    other statuses are waited out (vLLM binds its port before ``/health`` answers; llama-server answers
    503 while it loads)."""

    path: str = Field("/health", pattern=r"^/", description="path on the server root, e.g. /health")
    status: int = Field(200, ge=100, le=599, description="HTTP status that means ready")


class CommandSettings(EnvSettings):
    """``engine: command`` settings (the single definition; :class:`CommandLauncher` reads them).

    ``argv``: the command line, a list (no shell; ``{port}`` and ``{host}`` are replaced, also in ``env``
    values); ``env``:
    variables added to (``inherit_env: true``) or making up (``false``) the environment; ``secret_env``:
    names of ``env`` variables whose values are secret besides those whose names look secret (a dump of
    these settings — the record, the report, the copied experiment, the console — holds their values as
    fingerprints only, :mod:`servelab.engines.secrets`; ``model_dump(context={"secrets": "reveal"})``
    gives the values); ``cwd``: the
    working directory (``None``: the candidate's log folder); ``host``/``port``: where it listens
    (``port: null`` = a free port, which ``argv`` must then carry as ``{port}``); ``api_root``: the
    OpenAI API root's path; ``ready``: a :class:`ReadyProbe` or ``first_token``; ``ready_timeout_s``;
    ``stop_signal`` and ``stop_grace_s`` (then SIGKILL); ``after_ready``: commands run once the server
    is ready (``ollama pull MODEL``), each within ``after_ready_timeout_s``; ``guard``: a small guard
    process in front of the engine that kills its whole process group if servelab dies without
    stopping it (engines whose worker processes outlive their parent, e.g. vLLM's EngineCore).
    """

    argv: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, description="command line as a list (no shell); {port} and {host} are replaced"
    )
    inherit_env: bool = Field(True, description="start from servelab's environment (false: only env, plus PATH)")
    cwd: str | None = Field(None, min_length=1, description="working directory; null = the candidate's log folder")
    host: str = Field("127.0.0.1", min_length=1, description="address the engine listens on")
    port: PortSetting = None
    api_root: str = Field("/v1", pattern=r"^/", description="path of the OpenAI API root")
    ready: ReadyProbe | Literal["first_token"] = Field(
        default_factory=ReadyProbe, description="readiness probe: {path, status} or first_token"
    )
    ready_timeout_s: float = Field(600.0, gt=0, description="seconds to wait for readiness")
    stop_signal: Literal["SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGKILL"] = Field(
        "SIGTERM", description="signal sent to the process group to stop it"
    )
    stop_grace_s: float = Field(10.0, ge=0, description="seconds to wait after stop_signal before SIGKILL")
    after_ready: list[list[Annotated[str, Field(min_length=1)]]] = Field(
        default_factory=list, description="commands run once the server is ready (e.g. ollama pull MODEL)"
    )
    after_ready_timeout_s: float = Field(1800.0, gt=0, description="seconds each after_ready command may take")
    model_name: str | None = Field(None, min_length=1, description="served model id; null = first of GET /v1/models")
    guard: bool = Field(False, description="guard process: kill the engine's group if servelab dies")

    @model_validator(mode="after")
    def _port_placement(self) -> CommandSettings:
        has = any("{port}" in a for a in [*self.argv, *self.env.values()])
        if self.port is None and not has:
            raise ValueError(
                "argv has no {port} and port is null: write {port} where the engine takes its "
                "port (e.g. --port {port}, or in env: OLLAMA_HOST: 127.0.0.1:{port}), or set a fixed port"
            )
        return self
