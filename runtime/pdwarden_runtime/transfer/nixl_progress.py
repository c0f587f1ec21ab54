"""How long NIXL's progress thread may sleep when no transfer event arrives.

NIXL 1.5.1's Python agent (``nixl_agent``) sets its agent's ``pthrDelay`` to 0, and the UCX
backend's progress thread then polls its workers' event fds with a zero timeout: one core
per process stays busy while nothing moves. On a GPU node that is a core among many; on the
local cluster's 2-core machine a few runtime pods starve everything else. The thread sleeps
in ``poll()`` on those fds, so an event (an incoming write, a notification, a completion)
wakes it at once whatever the delay; the delay only bounds a sleep with no event.

Every NIXL agent a pdwarden process creates gets the same delay (stock and hardened alike,
so that a comparison between them stays fair): ``DEFAULT_POLL_US``, 1 ms, the backend's
own floor for a non-zero delay; 0 restores NIXL's busy polling.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Final

DEFAULT_POLL_US: Final = 1000
MAX_POLL_US: Final = 1_000_000

_lock = threading.Lock()
_poll_us = DEFAULT_POLL_US
_installed = False


def set_poll_us(micros: int) -> None:
    """Give every NIXL agent created from now on in this process ``micros`` of idle poll delay."""
    global _poll_us
    if not 0 <= micros <= MAX_POLL_US:
        raise ValueError(f"the NIXL progress poll delay must be 0..{MAX_POLL_US} us, not {micros}")
    with _lock:
        _poll_us = micros
    install()


def install() -> None:
    """Make NIXL agents created from now on in this process get the delay last set (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        # nixl_agent builds its agent from the bindings module's nixlAgent at call time; a
        # subclass there sets the delay on the config it is handed (NIXL's Python API has no
        # parameter for it).
        bindings: Any = importlib.import_module("nixl._api").nixlBind
        base: Any = bindings.nixlAgent

        class _DelayedAgent(base):  # type: ignore[misc, valid-type]
            def __init__(self, name: str, config: Any) -> None:
                config.pthrDelay = _poll_us
                super().__init__(name, config)

        bindings.nixlAgent = _DelayedAgent
        _installed = True
