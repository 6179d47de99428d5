"""Real Redis and PostgreSQL 15 servers for tests, each on a free port, torn down afterwards.

Usage (``tests/`` is on pytest's pythonpath, so any test module can ``import services``)::

    import pytest
    from services import postgres_cluster, redis_server

    @pytest.fixture(scope="module")
    def redis_url():
        with redis_server() as r:          # r.url == "redis://127.0.0.1:<port>/0"
            yield r.url

    @pytest.fixture(scope="module")
    def pg_dsn():
        with postgres_cluster() as pg:     # pg.dsn == "postgresql://postgres@127.0.0.1:<port>/postgres"
            yield pg.dsn

Redis: ``/usr/bin/redis-server`` with no persistence (~0.1 s to start). PostgreSQL: a throw-away Debian
cluster (``pg_createcluster 15 NAME -p PORT -- --auth=trust``, ~3-4 s), stopped and dropped on exit,
also at interpreter exit if a test run is interrupted. Both need the Debian packages that
``scripts/setup.sh`` installs (redis-server, postgresql-15); a missing one raises ``RuntimeError`` with
the fix rather than skipping, so a CI box without them fails visibly. PostgreSQL's wrappers need root
(CI runs as root) or the ``postgres`` user.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["PostgresCluster", "RedisServer", "free_port", "postgres_cluster", "redis_server"]

PG_VERSION = "15"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


@dataclass
class RedisServer:
    """A running ``redis-server``: ``url`` (``redis://127.0.0.1:PORT/0``), ``port``, ``proc``."""

    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Terminate (SIGTERM, then SIGKILL after 5 s) and reap the process."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_redis(timeout_s: float = 10.0) -> RedisServer:
    """Start ``redis-server`` on a free port without persistence; raise ``RuntimeError`` if it cannot."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found; install it with scripts/setup.sh (apt-get install -y redis-server)")
    last = ""
    for _ in range(3):  # the free port may be taken between free_port() and bind
        port = free_port()
        proc = subprocess.Popen(
            [
                exe,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        if _wait_port(port, timeout_s, proc):
            server = RedisServer(port, proc)
            atexit.register(server.stop)
            return server
        server = RedisServer(port, proc)
        server.stop()
        last = proc.stdout.read().decode(errors="replace")[-500:] if proc.stdout else ""
    raise RuntimeError(f"redis-server did not start: {last}")


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    """Context manager: a fresh :class:`RedisServer`, stopped on exit."""
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class PostgresCluster:
    """A running throw-away PostgreSQL cluster: ``dsn``, ``port``, ``name`` (Debian cluster name)."""

    name: str
    port: int
    dropped: bool = False

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def drop(self) -> None:
        """Stop (fast mode) and drop the cluster with its data directory. Idempotent."""
        if self.dropped:
            return
        self.dropped = True
        subprocess.run(["pg_ctlcluster", PG_VERSION, self.name, "stop", "-m", "fast"], capture_output=True, timeout=60)
        subprocess.run(["pg_dropcluster", "--stop", PG_VERSION, self.name], capture_output=True, timeout=60)


def start_postgres(timeout_s: float = 60.0) -> PostgresCluster:
    """Create and start a PostgreSQL 15 cluster with ``trust`` auth on a free port on 127.0.0.1.

    Raises ``RuntimeError`` with the command's output if the Debian wrappers are missing or fail.
    """
    if shutil.which("pg_createcluster") is None or not os.path.exists(f"/usr/lib/postgresql/{PG_VERSION}/bin"):
        raise RuntimeError(
            f"PostgreSQL {PG_VERSION} server not found; install it with scripts/setup.sh "
            f"(apt-get install -y postgresql-{PG_VERSION})"
        )
    name = f"sltest_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    port = free_port()
    cluster = PostgresCluster(name, port)
    atexit.register(cluster.drop)
    steps = (
        ["pg_createcluster", PG_VERSION, name, "-p", str(port), "--", "--auth=trust"],
        ["pg_ctlcluster", PG_VERSION, name, "start"],
    )
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if r.returncode != 0:
            cluster.drop()
            raise RuntimeError(f"{' '.join(cmd[:3])} failed ({r.returncode}): {(r.stderr or r.stdout)[-800:]}")
    if not _wait_port(port, timeout_s):
        cluster.drop()
        raise RuntimeError(f"PostgreSQL cluster {name} did not listen on port {port}")
    return cluster


@contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """Context manager: a fresh :class:`PostgresCluster`, dropped on exit."""
    cluster = start_postgres()
    try:
        yield cluster
    finally:
        cluster.drop()
