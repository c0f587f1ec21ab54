"""The PD side channel's proof: HMACs keyed by a key derived from the model's worker key.

SGLang's NIXL side channel (the prefill's ZMQ bootstrap socket, the decode's status socket
and the prefill's bootstrap HTTP server) takes no key: whoever reaches a pod can register a
rank, name a decode's pages or kill the thread that reads them. Only the model's own pods hold
the worker key, so a proof derived from it tells their messages from a stranger's.

- ``SideKey.derive(worker_key)``: ``HMAC-SHA256(worker_key, SIDE_KEY_LABEL)``, so the key
  that the router presents in HTTP headers is never itself the MAC key.
- ZMQ: ``sign(frames)`` appends one frame, ``HMAC-SHA256(side_key, ZMQ_DOMAIN || for each
  frame: its length (8 bytes, big endian) || the frame)`` truncated to ``PROOF_BYTES``; the
  length prefixes make the encoding unambiguous, so a frame cut, joined, moved or changed
  changes the proof. ``verify(frames)`` returns the frames without it, or None.
- HTTP: ``http_proof(method, path, body)``, hex, over the same kind of encoding under
  ``HTTP_DOMAIN`` (a ZMQ proof is never an HTTP one).

A proof binds content, not freshness: whoever can read the pod network can replay a message
it saw (the same holds for the worker key on the HTTP port).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import Final

SIDE_KEY_LABEL: Final = b"pdwarden side channel v1"
ZMQ_DOMAIN: Final = b"pdwarden-zmq\x00"
HTTP_DOMAIN: Final = b"pdwarden-http\x00"
# 128 bits: a forger's chance per try is 2**-128; a frame's worth of bytes stays small.
PROOF_BYTES: Final = 16


class SideKey:
    """The side channel's MAC key; signs and verifies ZMQ messages and HTTP requests."""

    __slots__ = ("_base",)

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a side-channel key must be at least 16 bytes")
        # Keyed once: copy() per message skips HMAC's key schedule.
        self._base = hmac.new(key, digestmod=hashlib.sha256)

    @classmethod
    def derive(cls, worker_key: str) -> SideKey:
        return cls(hmac.new(worker_key.encode(), SIDE_KEY_LABEL, hashlib.sha256).digest())

    def __repr__(self) -> str:
        return "SideKey(<hidden>)"

    def _mac(self, domain: bytes, parts: Sequence[bytes]) -> bytes:
        mac = self._base.copy()
        mac.update(domain)
        for part in parts:
            mac.update(len(part).to_bytes(8, "big"))
            mac.update(part)
        return mac.digest()[:PROOF_BYTES]

    # --- ZMQ -----------------------------------------------------------------------
    def proof(self, frames: Sequence[bytes]) -> bytes:
        return self._mac(ZMQ_DOMAIN, frames)

    def sign(self, frames: Sequence[bytes]) -> list[bytes]:
        """``frames`` with their proof appended (a new list; ``frames`` is left alone)."""
        body = list(frames)
        body.append(self.proof(body))
        return body

    def verify(self, frames: Sequence[bytes]) -> list[bytes] | None:
        """The frames without their proof when it is valid; None otherwise (no proof, a
        proof of other frames or of another key, a malformed message)."""
        if len(frames) < 2:
            return None
        body, proof = list(frames[:-1]), frames[-1]
        if not isinstance(proof, bytes) or len(proof) != PROOF_BYTES:
            return None
        return body if hmac.compare_digest(self.proof(body), proof) else None

    # --- HTTP ----------------------------------------------------------------------
    def http_proof(self, method: str, path: str, body: bytes = b"") -> str:
        return self._mac(HTTP_DOMAIN, (method.upper().encode(), path.encode(), body)).hex()

    def http_verify(self, header: str | None, method: str, path: str, body: bytes = b"") -> bool:
        if not header:
            return False
        return hmac.compare_digest(header.strip().encode(), self.http_proof(method, path, body).encode())
