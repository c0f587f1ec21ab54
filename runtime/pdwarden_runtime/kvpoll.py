"""KV room status, with SGLang's values.

SGLang 0.5.23 declares ``KVPoll`` as a plain class of ints
(sglang/srt/disaggregation/base/conn.py:123). An IntEnum with the same values compares,
hashes and indexes exactly like those ints, so statuses flow both ways between SGLang and
pdwarden without conversion; ``coerce`` turns an int that SGLang hands us into a member.
"""

from __future__ import annotations

import enum
from typing import Final

import pdwarden_contract as contract


class KVPoll(enum.IntEnum):
    """Status of one KV room (a bootstrap_room). The order is SGLang's, not a lifecycle:
    Failed sorts lowest, which is why ``max()`` on these values can resurrect a failed room."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4

    @property
    def label(self) -> str:
        """The Prometheus label value for this state (``pdwarden_kv_rooms{state=...}``)."""
        return STATE_LABELS[self]


TERMINAL: Final = frozenset({KVPoll.Failed, KVPoll.Success})
# The only statuses that may start a room's lifecycle (as in SGLang's update_status):
# Bootstrapping normally, WaitingForInput for a dummy rank that never bootstraps.
OPENING: Final = frozenset({KVPoll.Bootstrapping, KVPoll.WaitingForInput})

STATE_LABELS: Final[dict[KVPoll, str]] = {
    KVPoll.Failed: contract.KV_STATE_FAILED,
    KVPoll.Bootstrapping: contract.KV_STATE_BOOTSTRAPPING,
    KVPoll.WaitingForInput: contract.KV_STATE_WAITING_FOR_INPUT,
    KVPoll.Transferring: contract.KV_STATE_TRANSFERRING,
    KVPoll.Success: contract.KV_STATE_SUCCESS,
}

# int (or KVPoll, which hashes as its int) -> member; one dict lookup on the hot path.
BY_VALUE: Final[dict[int, KVPoll]] = {int(member): member for member in KVPoll}


def coerce(status: int) -> KVPoll:
    """Return the KVPoll member for an int status; raise ValueError naming the bad value.
    Any value equal to 0..4 is accepted (a KVPoll, SGLang's plain ints)."""
    try:
        member = BY_VALUE.get(status)
    except TypeError:  # unhashable garbage
        member = None
    if member is None:
        raise ValueError(
            f"not a KV status: {status!r} (expected one of "
            + ", ".join(f"{m.name}={int(m)}" for m in KVPoll)
            + ")"
        )
    return member
