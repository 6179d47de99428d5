"""Waking an event loop at a monotonic instant with sub-millisecond precision, without spinning.

asyncio and uvloop wait for timers with ``epoll_wait``'s millisecond timeout (libuv rounds a timer to
whole milliseconds), so an ordinary ``asyncio.sleep`` until an arrival time wakes up to ~1 ms late.
Spinning through the last milliseconds (``sleep(0)`` until due) removes that lag but burns the CPU
it spins on: at 100 arrivals/s a 1.5 ms spin is ~15 % of a core, and with several load-generator
processes on one core a spinning process also holds the core the others need. So the loop sleeps on a
timerfd until ``_TAIL_NS`` (1 ms) before the instant and yield-spins only that last part.

On Linux a ``timerfd`` (``timerfd_create(2)``, ``CLOCK_MONOTONIC``, absolute expiry) becomes readable
at the instant itself — the kernel's high-resolution timers, precise to microseconds — and the event
loop's ``epoll`` wakes on it like on any socket: :func:`sleep_until_ns` arms one and awaits it
(``loop.add_reader``). Python 3.11 has no ``os.timerfd_create`` (3.13 added it), so it is called
through ``ctypes`` from the C library. Where that is not available (not Linux, no libc symbol) the
wait falls back to a sleep until 1.5 ms before, then yield-spinning (``sleep(0)``, so I/O keeps flowing)
until due. :data:`MODE` says which is in use.

Sources: timerfd_create(2), https://man7.org/linux/man-pages/man2/timerfd_create.2.html (read
2026-12-01); Python's ``time.monotonic_ns`` is ``CLOCK_MONOTONIC`` on Linux
(https://docs.python.org/3/library/time.html#time.monotonic, read 2026-12-01).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
import time

_now = time.monotonic_ns
_SPIN_NS = 1_500_000  # fallback: event loops wake timers on a 1 ms grid, so yield-spin through the last 1.5 ms
#: the timerfd wakes this long before the instant and the rest is yield-spun (I/O keeps flowing). A
#: sleeping process needs the scheduler, and on a VM the host, to run it again, and a loop busy with a
#: response when the timerfd fires runs it only after that work. The lateness and CPU of each tail
#: against the box's floor: ``benches/replay_lateness.py`` (its figures and command in benches/README.md).
_TAIL_NS = 1_000_000

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_create.restype = ctypes.c_int
        libc.timerfd_settime.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Itimerspec),
            ctypes.POINTER(_Itimerspec),
        ]
        libc.timerfd_settime.restype = ctypes.c_int
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            return None
        os.close(fd)
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()
#: ``"timerfd"`` (precise, no spinning) or ``"spin"`` (the fallback)
MODE = "timerfd" if _LIBC is not None else "spin"


def _arm(t_ns: int) -> int:
    """A non-blocking timerfd that becomes readable at monotonic ``t_ns``; raises OSError."""
    assert _LIBC is not None
    fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    spec = _Itimerspec(_Timespec(0, 0), _Timespec(t_ns // 1_000_000_000, t_ns % 1_000_000_000))
    if _LIBC.timerfd_settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, os.strerror(err))
    return fd


async def _spin_until_ns(t_ns: int) -> None:
    delay = t_ns - _now()
    if delay > _SPIN_NS:
        await asyncio.sleep((delay - _SPIN_NS) / 1e9)
    while _now() < t_ns:
        await asyncio.sleep(0)


async def sleep_until_ns(t_ns: int) -> None:
    """Return once ``time.monotonic_ns() >= t_ns`` (a monotonic instant in ns), a few microseconds past
    it when the loop is free: a timerfd on Linux wakes the loop 1 ms before (``_TAIL_NS``) and the
    rest is yield-spun, else the spin fallback (see the module docstring). Returns at once for an
    instant already past. Cancellable (the timerfd is closed)."""
    if t_ns <= _now():
        return
    if _LIBC is None:
        await _spin_until_ns(t_ns)
        return
    loop = asyncio.get_running_loop()
    if t_ns - _now() <= _TAIL_NS:
        await _spin_until_ns(t_ns)
        return
    try:
        fd = _arm(t_ns - _TAIL_NS)
    except OSError:  # out of descriptors: still wait, the old way
        await _spin_until_ns(t_ns)
        return
    done = loop.create_future()

    def _ready() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, _ready)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    while _now() < t_ns:  # the last _TAIL_NS: yield-spin (I/O keeps flowing)
        await asyncio.sleep(0)
