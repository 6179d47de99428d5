"""Requests in flight per backend: :class:`LoadTracker` counts them (in this process, kept across config
reloads) and a :class:`Lease` holds one count, and a half-open breaker's probe slot, for one attempt until
it is released with its outcome. :meth:`servelab.gateway.routing.Router.acquire` hands them out."""

from __future__ import annotations

import asyncio
from typing import Any

from servelab.gateway.routespec import Target

__all__ = ["Lease", "LoadTracker"]


class LoadTracker:
    """Outstanding requests per backend name (in this process). Share one between Routers across reloads."""

    def __init__(self) -> None:
        self._n: dict[str, int] = {}

    def outstanding(self, backend: str) -> int:
        """Requests sent to ``backend`` and not yet released."""
        return self._n.get(backend, 0)

    def snapshot(self) -> dict[str, int]:
        return dict(self._n)

    def _inc(self, backend: str) -> None:
        self._n[backend] = self._n.get(backend, 0) + 1

    def _dec(self, backend: str) -> None:
        n = self._n.get(backend, 0) - 1
        if n > 0:
            self._n[backend] = n
        else:
            self._n.pop(backend, None)


class Lease:
    """One admitted attempt on ``target``: holds an outstanding slot (and a half-open probe slot) until
    released. Release exactly once with :meth:`release` (``"success"``, ``"failure"`` or ``"neutral"``),
    or use it as a context manager: leaving without an outcome records success, an exception records
    failure, except ``asyncio.CancelledError``/``GeneratorExit`` (client went away) which is neutral."""

    __slots__ = ("target", "_tracker", "_breaker", "_outcome", "released")

    def __init__(self, target: Target, tracker: LoadTracker, breaker: Any) -> None:
        self.target = target
        self._tracker = tracker
        self._breaker = breaker
        self._outcome: str | None = None
        self.released = False

    def success(self) -> None:
        """Mark the outcome (applied on context exit)."""
        self._outcome = "success"

    def fail(self) -> None:
        self._outcome = "failure"

    def neutral(self) -> None:
        self._outcome = "neutral"

    def release(self, outcome: str | None = None) -> None:
        """Free the slot and tell the breaker the outcome; later calls do nothing. Raises
        :class:`ValueError` on an unknown outcome."""
        if self.released:
            return
        outcome = outcome or self._outcome or "success"
        if outcome not in ("success", "failure", "neutral"):
            raise ValueError(f"lease outcome {outcome!r} must be success, failure or neutral")
        self.released = True
        self._tracker._dec(self.target.backend)
        if self._breaker is not None:
            {
                "success": self._breaker.on_success,
                "failure": self._breaker.on_failure,
                "neutral": self._breaker.on_neutral,
            }[outcome]()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.release()
        elif issubclass(exc_type, (asyncio.CancelledError, GeneratorExit)):
            self.release(self._outcome or "neutral")
        else:
            self.release(self._outcome or "failure")
