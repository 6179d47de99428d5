"""Turning on uvloop for servers."""

from __future__ import annotations

import asyncio

__all__ = ["install_uvloop"]


def install_uvloop() -> bool:
    """Make uvloop the asyncio event loop policy when it is installed (the ``fast`` extra); returns
    whether it did. Call before ``asyncio.run``."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
