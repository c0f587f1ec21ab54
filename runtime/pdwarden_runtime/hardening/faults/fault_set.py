"""The fault switch, read as hooks: ``FaultSet.active()`` is the ``Faults`` of the fault on now.

The switch flips at run time (``POST /debug/fault``), so the hardened classes ask for the
active fault at each hook; with none on they get ``NO_FAULTS``, which does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pdwarden_contract import (
    FAULT_DROP_ABORT,
    FAULT_EMULATED_PORT_RACE,
    FAULT_NONE,
    FAULT_STALL,
    FAULT_STALL_KV_RECEIVE,
    ROLE_DECODE,
)
from pdwarden_runtime.hardening.config import HardeningConfig
from pdwarden_runtime.hardening.faults.drop_abort import DropAbort
from pdwarden_runtime.hardening.faults.hooks import NO_FAULTS, Fault, Faults
from pdwarden_runtime.hardening.faults.port_race import PortRace, PortRaceFault
from pdwarden_runtime.hardening.faults.stall_transfers import StallTransfers
from pdwarden_runtime.hardening.faults.stalled_agent import StallKvReceive, StallKvReceiveFault


class FaultSet:
    """Each fault's hooks in one KV manager, and which one the config's switch names now."""

    def __init__(
        self, config: HardeningConfig, role: str, kv_args: Any, forget_registrations: Callable[[], None]
    ) -> None:
        self._config = config
        self._forget_registrations = forget_registrations
        self._stall_kv = StallKvReceive(kv_args)
        self.port_race = PortRace()
        # stall-kv-receive acts on a decode's messages only; a prefill just sees a fault on.
        stall_kv: Faults = StallKvReceiveFault(self._stall_kv) if role == ROLE_DECODE else Fault()
        self._by_name: dict[str, Faults] = {
            FAULT_NONE: NO_FAULTS,
            FAULT_STALL: StallTransfers(),
            FAULT_DROP_ABORT: DropAbort(),
            FAULT_EMULATED_PORT_RACE: PortRaceFault(self.port_race, lambda: config.race_window),
            FAULT_STALL_KV_RECEIVE: stall_kv,
        }

    def active(self) -> Faults:
        return self._by_name[self._config.fault.active]

    def receiver_starting(self) -> None:
        """A decode receiver is about to register: if the stalled agent was switched on or off
        since the last one, forget the prefills' registrations (SGLang registers with each
        prefill once) so that this one registers the agent it will name."""
        if self._stall_kv.switched(self.active().names_stalled_agent):
            self._forget_registrations()
