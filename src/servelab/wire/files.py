"""Turning on uvloop for servers. (:func:`read_yaml_file` moved to :mod:`servelab.wire.config`; it is
re-exported here for old imports.)"""

from __future__ import annotations

import asyncio

from servelab.wire.config import read_yaml_file as read_yaml_file

__all__ = ["install_uvloop", "read_yaml_file"]


def install_uvloop() -> bool:
    """Make uvloop the asyncio event loop policy when it is installed (the ``fast`` extra); returns
    whether it did. Call before ``asyncio.run``."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
