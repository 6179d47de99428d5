"""How an engine that did not start is described: :class:`EngineStartError`, its exit code or signal in
words with a hint for known crashes, and the last lines of its log."""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["EngineStartError", "describe_exit", "start_failure_message", "tail_lines"]


class EngineStartError(RuntimeError):
    """The engine process exited, or did not become ready in time, during start.

    The message names the engine, the reason, the log path and quotes the last ~20 log lines.
    ``log_tail`` holds those lines; ``returncode`` the exit status (``None`` if it was still running
    when the wait gave up; it is then killed).
    """

    def __init__(self, message: str, log_tail: list[str] | None = None, returncode: int | None = None):
        super().__init__(message)
        self.log_tail = log_tail or []
        self.returncode = returncode
        #: the log says the port could not be bound (another process took it): worth a retry on a new port
        self.bind_failed = False
        #: what to do about a known failure (e.g. a crash with a known cause), set by :meth:`add_hint`
        self.hint: str | None = None

    def add_hint(self, hint: str) -> None:
        """Append ``hint`` (what to do) to the message's first line, which is the one a trial shows."""
        first, sep, rest = str(self).partition("\n")
        self.hint = hint
        self.args = (f"{first}; {hint}{sep}{rest}",)


def describe_exit(returncode: int | None) -> str:
    """How a process ended, in words: ``"exited with status 3"``, ``"crashed with SIGSEGV
    (segmentation fault)"`` (a negative ``returncode`` from :mod:`subprocess` is the signal), or, for
    128+N from a shell that ran it (``sh -c``, the guard script), ``"exited with status 139 (128+SIGSEGV:
    segmentation fault, as a shell reports a crash)"``."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        return (
            f"crashed with {_signal_words(-returncode)}"
            if -returncode != signal.SIGKILL
            else f"was killed with {_signal_words(-returncode)}"
        )
    if 128 < returncode < 128 + 65:
        try:
            name = signal.Signals(returncode - 128).name
        except ValueError:
            return f"exited with status {returncode}"
        why = (signal.strsignal(returncode - 128) or "").lower()
        return f"exited with status {returncode} (128+{name}: {why}, as a shell reports a crash)"
    return f"exited with status {returncode}"


def _signal_words(signum: int) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    why = (signal.strsignal(signum) or "").lower()
    return f"{name} ({why})" if why else name


#: hints for crashes by signal during start, whatever the engine
_SIGNAL_HINTS = {
    signal.SIGILL: "an instruction this CPU lacks: a binary built for another CPU (rebuild it on this host)",
    signal.SIGKILL: "SIGKILL during start is often the kernel's OOM killer (see `dmesg`): less memory "
    "(smaller context, fewer slots) or a bigger host",
}


def start_failure_message(name: str, returncode: int, elapsed_s: float, log_path: Path, tail: list[str]) -> str:
    """The message of an engine that ended during start: one first line that stands alone (how it
    ended, when, the last line the engine wrote, the log path), then its last log lines.

    servelab's own ``# servelab:`` header lines are not the engine's: when nothing else is in the
    log, the message says the engine wrote nothing before it died (a crash can lose buffered output)."""
    own = [ln for ln in tail if ln.strip() and not ln.startswith("# servelab:")]
    how = describe_exit(returncode)
    sig = -returncode if returncode < 0 else None
    last = f"last log line: {own[-1].strip()[:200]!r}" if own else "it wrote nothing to its log before it ended"
    first = f"{name} {how} during start ({elapsed_s:.1f} s after launch); {last}; log {log_path}"
    if sig is not None and sig in _SIGNAL_HINTS:
        first += f"; {_SIGNAL_HINTS[signal.Signals(sig)]}"
    return first + ("\nlast lines:\n" + "\n".join(tail) if own else "")


def tail_lines(path: str | os.PathLike[str], n: int = 20) -> list[str]:
    """The last ``n`` lines of a text file (decoded leniently); ``[]`` if it does not exist."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            data = f.read()
    except OSError:
        return []
    return [ln.rstrip("\r") for ln in data.decode("utf-8", "replace").splitlines()][-n:]
