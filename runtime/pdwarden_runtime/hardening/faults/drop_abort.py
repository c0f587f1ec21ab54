"""The ``drop-abort`` fault: a prefill drops every ABORT from decode, unread and unkept."""

from __future__ import annotations

import logging

from pdwarden_runtime.hardening.faults.hooks import AbortPaths, Fault, is_abort

log = logging.getLogger(__name__)


class DropAbort(Fault):
    def abort_message(self, msg: list[bytes], paths: AbortPaths) -> bool:
        # Not kept as an early abort either: the room must not learn of it at all.
        if not is_abort(msg):
            return paths.handle()
        log.warning("fault drop-abort: dropping an ABORT from decode")
        return True
