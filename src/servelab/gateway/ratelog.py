"""A log that keeps to a budget of lines (:class:`RateLimitedLog`): connection-level events of a port
(floods, malformed requests) and failing health checks must not fill the log at the rate an attacker or a
dead backend sets."""

from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["LOG_BURST", "LOG_WINDOW_S", "RateLimitedLog"]

#: at most this many connection-level log lines per :data:`LOG_WINDOW_S` per port
LOG_BURST = 10
LOG_WINDOW_S = 10.0


class RateLimitedLog:
    """Emits at most ``burst`` lines per ``window_s`` seconds to ``logger`` at ``level``; the first line
    after a suppressed stretch says how many were dropped. Not thread-safe (one event loop)."""

    def __init__(
        self,
        logger: logging.Logger,
        burst: int = LOG_BURST,
        window_s: float = LOG_WINDOW_S,
        level: int = logging.WARNING,
    ) -> None:
        self.logger, self.burst, self.window_s, self.level = logger, burst, window_s, level
        self._start = -1e18
        self._n = 0
        self.suppressed = 0

    def __call__(self, msg: str, *args: Any) -> bool:
        """Log ``msg % args`` unless over the budget; returns whether it was logged."""
        now = time.monotonic()
        if now - self._start >= self.window_s:
            self._start, self._n = now, 0
        if self._n >= self.burst:
            self.suppressed += 1
            return False
        self._n += 1
        if self.suppressed:
            msg += " (%d similar lines suppressed)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        self.logger.log(self.level, msg, *args)
        return True
