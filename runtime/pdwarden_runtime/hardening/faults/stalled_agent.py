"""The decode-side transfer stall fault (``stall-kv-receive``): a NIXL agent that never progresses.

A decode whose NIXL agent or NIC stalls keeps answering HTTP while prefills' WRITEs into it
never complete. To reproduce that for real, the faulty decode builds a second NIXL agent
over the same KV memory with no progress thread, and names it (instead of its own agent) in
the registration and metadata messages of rooms it opens while the fault is on. Prefills
then post real WRITEs to an agent that never makes progress (over UCX's TCP transport the
target side must progress for a WRITE to complete), so their handles stay in progress until
their transfer deadline: the stall is in the transport, not simulated in the prefill.

Only for tests and the demo (``--allow-fault-injection``); the agent is kept for the life of
the process (prefills may still hold handles to it).
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from pdwarden_runtime.hardening.faults.hooks import Fault

log = logging.getLogger(__name__)


class StalledAgent:
    """A NIXL agent over ``kv_args``' memory that is never progressed."""

    def __init__(self, kv_args: Any) -> None:
        from nixl._api import nixl_agent, nixl_agent_config

        self.agent = nixl_agent(
            f"pdwarden-stalled-{uuid.uuid4()}", nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
        )
        by_kind: dict[str, list[tuple[int, int, int, str]]] = {}
        kinds = getattr(kv_args, "kv_data_mem_kinds", None) or ["DRAM"] * len(kv_args.kv_data_ptrs)
        for ptr, length, kind in zip(kv_args.kv_data_ptrs, kv_args.kv_data_lens, kinds, strict=True):
            device = int(kv_args.gpu_id) if kind == "VRAM" else 0
            by_kind.setdefault(kind, []).append((int(ptr), int(length), device, ""))
        self._descs = [self.agent.register_memory(addrs, kind) for kind, addrs in by_kind.items()]
        aux = [
            (int(p), int(n), 0, "") for p, n in zip(kv_args.aux_data_ptrs, kv_args.aux_data_lens, strict=True)
        ]
        if aux:
            self._descs.append(self.agent.register_memory(aux, "DRAM"))
        self.name: str = self.agent.name
        self.metadata: bytes = self.agent.get_agent_metadata()
        log.warning(
            "fault stall-kv-receive: new rooms' KV goes to NIXL agent %s, which never progresses", self.name
        )


class StallKvReceive:
    """The fault's state in one decode KV manager: the stalled agent, built once when the
    fault is first on, and whether it was on when a receiver last looked."""

    def __init__(self, kv_args: Any) -> None:
        self._kv_args = kv_args
        self._agent: StalledAgent | None = None
        self._lock = threading.Lock()
        self._seen_on = False

    def agent(self) -> StalledAgent:
        """The never-progressing agent (built on first use, kept for the process's life)."""
        with self._lock:
            if self._agent is None:
                self._agent = StalledAgent(self._kv_args)
            return self._agent

    def switched(self, on: bool) -> bool:
        """True when the fault was switched on or off since the last look: SGLang registers
        with each prefill once, so the registrations must be forgotten for the next receiver
        to register the agent it will name."""
        with self._lock:
            if on == self._seen_on:
                return False
            self._seen_on = on
            return True


class StallKvReceiveFault(Fault):
    """The fault's hooks on a decode: the registration and metadata messages of rooms opened
    while it is on name the stalled agent."""

    names_stalled_agent = True

    def __init__(self, state: StallKvReceive) -> None:
        self.state = state

    def registration_message(self, message: list[bytes]) -> list[bytes]:
        stalled = self.state.agent()
        message[4], message[5] = stalled.name.encode("ascii"), stalled.metadata  # name, metadata
        return message

    def metadata_message(self, message: list[bytes]) -> list[bytes]:
        message[4] = self.state.agent().name.encode("ascii")  # agent name (SGLang's layout)
        return message
