"""What the fleet's pods export: per role and mode, one real runtime state (the runtime's own
RoomRuntime, its status table, inflight tracker and metrics), driven by a clock of its own.

- `serving`: rooms open and conclude all the time (a few in flight, young, the transfer
  counter rising): a healthy pod.
- `wedged`: one room stuck in Transferring since the fleet started and nothing concluding,
  with no inflight deadline to cut it: the production wedge the watchdog exists for.
- `idle`: no room ever opened: a pod nobody sends requests to, whose body reads the same
  scrape after scrape.

Every pod of one role and mode shares that state's body (the contract has no per-pod series
the watchdog reads), rendered at most once per `BODY_TTL_S`, so ten thousand pods cost ten
thousand HTTP answers, not ten thousand registries.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Final, Literal

import pdwarden_contract as contract
from pdwarden_runtime.hardening.config import HardeningConfig
from pdwarden_runtime.hardening.runtime import RoomRuntime
from pdwarden_runtime.kvpoll import KVPoll
from pdwarden_runtime.metrics import exposition

Mode = Literal["serving", "wedged", "idle"]
MODES: Final[tuple[Mode, ...]] = ("serving", "wedged", "idle")
MODE_ANNOTATION: Final = "fleet.pdwarden.io/mode"  # on a pod: what it exports (default serving)
BODY_TTL_S: Final = 0.25
TICK_S: Final = 0.1
IN_FLIGHT: Final = 2  # rooms a serving pod holds at once
POOL_PAGES: Final = 4096
MAX_NAME_SETS: Final = 8  # bodies kept per state, one per set of requested names


def mode_of(annotations: dict[str, str] | None) -> Mode:
    value = (annotations or {}).get(MODE_ANNOTATION)
    return next((mode for mode in MODES if mode == value), "serving")


class _State:
    def __init__(self, role: str, mode: Mode) -> None:
        wedged = mode == "wedged"
        config = HardeningConfig(engine="synthetic", inflight_deadline=None if wedged else 60.0)
        self.runtime = RoomRuntime(config, role)
        self.runtime.pool_pages = POOL_PAGES
        self.runtime.pages_in_use = self._pages_in_use
        self.mode = mode
        self._rooms: Iterator[int] = itertools.count(1)
        self._open: list[int] = []
        self._lock = threading.Lock()
        # per requested names (the watchdog always asks for the same ones): when rendered, body
        self._bodies: dict[tuple[str, ...], tuple[float, bytes, str]] = {}
        if wedged:
            room = next(self._rooms)
            self.runtime.table.open(room, KVPoll.WaitingForInput)
            self.runtime.table.update(room, KVPoll.Transferring)
            self._open.append(room)

    def _pages_in_use(self) -> int:
        return 16 * len(self._open)

    def tick(self) -> None:
        if self.mode != "serving":
            return
        table = self.runtime.table
        room = next(self._rooms)
        table.open(room, KVPoll.WaitingForInput)
        table.update(room, KVPoll.Transferring)
        self._open.append(room)
        while len(self._open) > IN_FLIGHT:
            done = self._open.pop(0)
            table.update(done, KVPoll.Success)
            table.clear(done)
            self.runtime.metrics.add_bytes(16 * 65536)

    def body(self, now: float, names: tuple[str, ...] = ()) -> tuple[bytes, str]:
        with self._lock:
            cached = self._bodies.get(names)
            if cached is None or now - cached[0] >= BODY_TTL_S:
                if cached is None and len(self._bodies) >= MAX_NAME_SETS:
                    self._bodies.clear()  # a client asking for ever other names
                data, ctype = exposition(self.runtime.metrics.registry, names)
                cached = self._bodies[names] = (now, data, ctype)
            return cached[1], cached[2]


class FleetRuntimes:
    """The states every pod of the fleet exports, one per (role, mode)."""

    def __init__(self) -> None:
        self._states = {(role, mode): _State(role, mode) for role in contract.RUNTIME_ROLES for mode in MODES}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-runtimes", daemon=True)

    def start(self) -> FleetRuntimes:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            for state in self._states.values():
                state.tick()

    def body(self, role: str, mode: Mode, names: tuple[str, ...] = ()) -> tuple[bytes, str]:
        """What a pod of `role` in `mode` exports; `names`: only those metrics' families, as a
        runtime answers a scrape that names them."""
        state = self._states.get((role, mode))
        if state is None:
            raise KeyError(f"no runtime state for role {role!r}")
        return state.body(time.monotonic(), names)
