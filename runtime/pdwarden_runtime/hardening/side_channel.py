"""The PD side channel's proof: HMACs keyed by a key derived from the model's worker key.

SGLang's NIXL side channel (the prefill's ZMQ bootstrap socket, the decode's status socket
and the prefill's bootstrap HTTP server) takes no key: whoever reaches a pod can register a
rank, name a decode's pages or kill the thread that reads them. Only the model's own pods hold
the worker key, so a proof derived from it tells their messages from a stranger's.

- ``SideKey.derive(worker_key)``: ``HMAC-SHA256(worker_key, SIDE_KEY_LABEL)``, so the key
  that the router presents in HTTP headers is never itself the MAC key.
- ZMQ: ``sign(frames)`` appends one frame, ``PROOF_MARK`` then ``HMAC-SHA256(side_key,
  ZMQ_DOMAIN || for each frame: its length (8 bytes, big endian) || the frame)`` truncated to
  ``PROOF_BYTES``; the length prefixes make the encoding unambiguous, so a frame cut, joined,
  moved or changed changes the proof. ``verify(frames)`` returns the frames without it, or
  None. The mark lets a pod that checks no proof (no key, or a key's rollout) drop the frame
  without knowing the key.
- HTTP: ``http_proof(method, path, body)``, hex, over the same kind of encoding under
  ``HTTP_DOMAIN`` (a ZMQ proof is never an HTTP one).
- ``SideKeys``: what one pod signs with and accepts. While a key rolls out or rotates, pods
  of two configurations serve side by side (the operator's ``worker_key_secret`` orders the
  steps): a pod accepts its own key and the next or the previous one, and during a key's
  switch on or off also messages without a proof (``lenient``).

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
# Starts a proof frame: no frame of SGLang's is these bytes followed by 16 more.
PROOF_MARK: Final = b"pdw-proof\x00"
PROOF_FRAME_BYTES: Final = len(PROOF_MARK) + PROOF_BYTES


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
        """The proof frame of ``frames``: ``PROOF_MARK`` and the MAC."""
        return PROOF_MARK + self._mac(ZMQ_DOMAIN, frames)

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
        if not is_proof_frame(proof):
            return None
        return body if hmac.compare_digest(self.proof(body), proof) else None

    # --- HTTP ----------------------------------------------------------------------
    def http_proof(self, method: str, path: str, body: bytes = b"") -> str:
        return self._mac(HTTP_DOMAIN, (method.upper().encode(), path.encode(), body)).hex()

    def http_verify(self, header: str | None, method: str, path: str, body: bytes = b"") -> bool:
        if not header:
            return False
        return hmac.compare_digest(header.strip().encode(), self.http_proof(method, path, body).encode())


def is_proof_frame(frame: object) -> bool:
    """Whether ``frame`` has a proof's shape (the mark and a MAC's length; not whose it is)."""
    return isinstance(frame, bytes) and len(frame) == PROOF_FRAME_BYTES and frame.startswith(PROOF_MARK)


class SideKeys:
    """The side-channel keys of one pod: the one it signs with (None: it signs nothing), the
    ones whose proofs it accepts, and whether it also takes a message or request without a
    valid proof (``lenient``: while the key is switched on or off; a pod that accepts no key
    takes everything, as SGLang does).

    A message that carries a proof frame nobody here can check (no key, or lenient) has it
    dropped before SGLang reads it, so a signing peer and a pod that checks nothing still
    understand each other while a key rolls out.
    """

    __slots__ = ("accepted", "lenient", "signer")

    def __init__(
        self, signer: SideKey | None = None, accepted: Sequence[SideKey] = (), lenient: bool = False
    ) -> None:
        if signer is not None and signer not in accepted:
            accepted = (signer, *accepted)
        self.signer = signer
        self.accepted: tuple[SideKey, ...] = tuple(accepted)
        self.lenient = lenient or not self.accepted

    @classmethod
    def derive(cls, sign: str | None, accept: Sequence[str] = (), lenient: bool = False) -> SideKeys:
        """From worker keys: the one the pod signs with (None: none) and others it accepts."""
        signer = SideKey.derive(sign) if sign is not None else None
        others = [SideKey.derive(k) for k in dict.fromkeys(accept) if k != sign]
        return cls(signer, others, lenient)  # __init__ puts the signer first

    def __repr__(self) -> str:
        return (
            f"SideKeys(signs={self.signer is not None}, accepts={len(self.accepted)}, lenient={self.lenient})"
        )

    @property
    def keyed(self) -> bool:
        """Whether this pod signs or checks anything at all."""
        return self.signer is not None or bool(self.accepted)

    @property
    def required(self) -> bool:
        """Whether every message and request must carry a proof this pod accepts."""
        return not self.lenient

    # --- ZMQ -----------------------------------------------------------------------
    def sign(self, frames: Sequence[bytes]) -> list[bytes]:
        """``frames`` with this pod's proof appended (a new list; unchanged without a signer)."""
        return list(frames) if self.signer is None else self.signer.sign(frames)

    def open(self, frames: Sequence[bytes]) -> list[bytes] | None:
        """The frames SGLang may read (proof removed), or None: no proof this pod accepts
        where one is required."""
        for key in self.accepted:
            body = key.verify(frames)
            if body is not None:
                return body
        if not self.lenient:
            return None
        body = list(frames)
        if len(body) > 1 and is_proof_frame(body[-1]):
            body.pop()  # a peer's proof this pod cannot or need not check
        return body

    # --- HTTP ----------------------------------------------------------------------
    def http_accepts(self, header: str | None, method: str, path: str, body: bytes = b"") -> bool:
        """Whether a request or answer with ``header`` may be taken."""
        if self.lenient:
            return True
        return any(key.http_verify(header, method, path, body) for key in self.accepted)


UNKEYED: Final = SideKeys()
