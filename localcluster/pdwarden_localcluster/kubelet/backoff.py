"""The kubelet's container restart back-off: 10 s doubling to 300 s, reset after 10 min of running."""

from __future__ import annotations

from dataclasses import dataclass

BASE_S = 10.0
CAP_S = 300.0
RESET_AFTER_S = 600.0


@dataclass(frozen=True)
class BackOff:
    base: float = BASE_S
    cap: float = CAP_S
    reset_after: float = RESET_AFTER_S

    def next(self, failures_before: int, ran_for: float) -> tuple[float, int]:
        """(delay before the next start, failures counted so far) after an exit.

        A container that ran longer than `reset_after` starts the count again.
        """
        count = 0 if ran_for > self.reset_after else failures_before
        return min(self.cap, self.base * (2**count)), count + 1
