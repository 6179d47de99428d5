"""``servelab gateway``: run the OpenAI-compatible gateway from a config file until SIGINT/SIGTERM.

Prints ``servelab gateway listening on http://HOST:PORT/v1 (admin http://HOST:PORT2)`` once both ports are
bound (tests and scripts wait for that line). SIGHUP or saving the file reloads the config atomically.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from pathlib import Path

import typer

from servelab.wire.errors import ConfigError
from servelab.wire.files import install_uvloop

__all__ = ["gateway_command", "serve"]


def serve(config_path: str | Path, host: str | None = None, port: int | None = None,
          admin_port: int | None = -1, no_admin: bool = False, admin_host: str | None = None) -> None:
    """Load ``config_path`` and serve until SIGINT/SIGTERM (blocking; uvloop when installed).

    ``admin_port`` -1 = from the file; ``no_admin`` runs no admin app; ``admin_host`` None = the file's
    ``server.admin_host`` (default 127.0.0.1, whatever ``host`` is). Raises :class:`ConfigError` for a
    bad config, a missing admin token or a port that cannot be bound.
    """
    from servelab.gateway.config import load_config
    from servelab.gateway.server import Gateway

    cfg = load_config(config_path)
    uv = install_uvloop()

    async def main() -> None:
        gw = Gateway(cfg, config_path, host=host, port=port, admin_port=None if no_admin else admin_port,
                     admin_host=admin_host)
        try:
            await gw.start()
        except OSError as e:
            await gw.close()
            raise ConfigError(f"cannot listen on {gw.host}:{gw.port} or the admin port {gw.admin_host}:"
                              f"{gw.admin_port}: {e.strerror or e}; pick a free port with --port/--admin-port "
                              "and an address of this host with --host/--admin-host") from None
        except ConfigError:
            await gw.close()
            raise
        # everything loaded so far (modules, config, app) lives as long as the process: move it out of the
        # cyclic GC's generations so collections during streaming stay short (a full collection otherwise
        # walks every imported module's objects) — https://docs.python.org/3/library/gc.html#gc.freeze
        gc.collect()
        gc.freeze()
        stop = asyncio.Event()
        gw.install_signal_handlers(stop.set)
        admin = f" (admin http://{gw.admin_host}:{gw.admin_port})" if gw.admin_port is not None else ""
        print(f"servelab gateway listening on http://{gw.host}:{gw.port}/v1{admin}"
              f"{' [uvloop]' if uv else ''}", flush=True)
        try:
            await stop.wait()
        finally:
            await gw.close()

    asyncio.run(main())


def gateway_command(
    config: Path = typer.Option(..., "--config", "-c", help="Gateway YAML file (example: examples/gateway.yaml)."),
    host: str | None = typer.Option(None, "--host", help="Address to bind [default: server.host of the file]."),
    port: int | None = typer.Option(None, "--port", help="API port; 0 = a free port [default: server.port]."),
    admin_port: int | None = typer.Option(None, "--admin-port", help="Admin API port [default: server.admin_port]."),
    admin_host: str | None = typer.Option(None, "--admin-host", help="Address the admin API binds [default: "
                                          "server.admin_host, 127.0.0.1; --host does not change it]."),
    no_admin: bool = typer.Option(False, "--no-admin", help="Run without the admin API."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error (stderr)."),
) -> None:
    """Run the OpenAI-compatible gateway over the engines in --config (SIGHUP or a saved file reloads it)."""
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise ConfigError(f"--log-level {log_level!r} is not one of debug, info, warning, error")
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(config, host, port, -1 if admin_port is None else admin_port, no_admin, admin_host)
