"""ZMQ sockets of the PD side channel that sign what they send and check what they receive.

SGLang's NIXL threads read their bound PULL socket (``server_socket``) and act on whatever
arrives; the hardened manager hands them a ``CheckingSocket`` instead, whose
``recv_multipart`` returns only messages that carry a proof the pod accepts (when it requires
one: ``SideKeys``) and pass the role's shape check, proof removed. Anything else is dropped there and reported
to ``on_drop`` (counted, logged at most once per ``DropLog.interval``), so no message can make
SGLang's reading thread raise and die. Sending sockets are wrapped in a ``SigningSocket``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from pdwarden_runtime.hardening.side_channel import UNKEYED, SideKeys

log = logging.getLogger(__name__)

REASON_NO_PROOF: Final = "no valid side-channel proof"
# A shape check: None for a message SGLang's reader can take, else why not (no remote
# bytes in it: it is logged).
ShapeCheck = Callable[[list[bytes]], str | None]


class SigningSocket:
    """A ZMQ socket whose ``send_multipart`` appends the side channel's proof."""

    def __init__(self, inner: Any, keys: SideKeys) -> None:
        self._inner = inner
        self._keys = keys

    def send_multipart(self, msg_parts: Sequence[bytes], *args: Any, **kwargs: Any) -> Any:
        return self._inner.send_multipart(self._keys.sign(msg_parts), *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CheckingSocket:
    """A bound ZMQ socket whose ``recv_multipart`` returns only checked messages."""

    def __init__(
        self,
        inner: Any,
        keys: SideKeys | None,
        on_drop: Callable[[str], None],
        shape: ShapeCheck | None = None,
    ) -> None:
        self._inner = inner
        self._keys = keys or UNKEYED
        self._on_drop = on_drop
        self._shape = shape

    @property
    def inner(self) -> Any:
        return self._inner

    def check(self, frames: list[bytes]) -> tuple[list[bytes] | None, str | None]:
        """(the message SGLang gets, None) or (None, why it is dropped)."""
        opened = self._keys.open(frames)
        if opened is None:
            return None, REASON_NO_PROOF
        frames = opened
        if self._shape is not None:
            try:
                problem = self._shape(frames)
            except Exception as err:  # a check that fails drops the message, never the thread
                problem = f"shape check failed ({type(err).__name__})"
            if problem is not None:
                return None, problem
        return frames, None

    def recv_multipart(self, *args: Any, **kwargs: Any) -> list[bytes]:
        while True:
            frames = self._inner.recv_multipart(*args, **kwargs)
            message, problem = self.check(frames)
            if message is not None:
                return message
            try:
                self._on_drop(problem or "dropped")
            except Exception:  # reporting a drop must not be what ends the reader
                log.exception("reporting a dropped side-channel message failed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class DropLog:
    """Logs dropped messages at most once per ``interval`` seconds, with how many since."""

    def __init__(
        self,
        what: str,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        events: str = "message(s) dropped on the PD side channel",
    ) -> None:
        self._what = what
        self._events = events
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._next = 0.0
        self._since = 0

    def dropped(self, reason: str) -> bool:
        """Note one drop; True when this one was logged."""
        with self._lock:
            self._since += 1
            now = self._clock()
            if now < self._next:
                return False
            count, self._since = self._since, 0
            self._next = now + self._interval
        log.warning("%s: %d %s; latest: %s", self._what, count, self._events, reason)
        return True
