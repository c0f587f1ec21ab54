"""`spec.watchdog` as the watchdog reads it: typed, defaulted, validated.

Reads the raw (camelCase) mapping kopf hands over, so the watchdog depends on the CRD's field
names only, not on the Python model's attribute spelling. Defaults match the CRD's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Action = Literal["alert", "restart", "evict"]
ACTIONS: tuple[Action, ...] = ("alert", "restart", "evict")


MIN_DEFAULT_COOLDOWN_S = 60.0


class SettingsError(ValueError):
    """spec.watchdog holds a value the watchdog cannot use; the message names the field."""


@dataclass(frozen=True)
class WatchdogSettings:
    stuck_after_seconds: float = 120.0
    scrape_interval_seconds: float = 10.0
    action: Action = "restart"
    max_remediations: int = 3
    budget_window_seconds: float = 3600.0
    max_unavailable: int = 1
    # After an action, no further action on any of the model's pods for this long: the
    # replacement needs time to become Ready, and the pods of the OTHER role that were
    # exchanging KV with the removed pod need time to let go of those rooms (measured here:
    # ~35 s for decode after its prefill vanished). Acting sooner would cascade.
    cooldown_seconds: float | None = None

    @property
    def cooldown(self) -> float:
        """cooldownSeconds, else max(stuckAfterSeconds, MIN_DEFAULT_COOLDOWN_S)."""
        if self.cooldown_seconds is not None:
            return self.cooldown_seconds
        return max(self.stuck_after_seconds, MIN_DEFAULT_COOLDOWN_S)

    @property
    def scrape_timeout_seconds(self) -> float:
        """Per-request timeout: a slow pod must not delay the round past its interval."""
        return max(0.5, min(5.0, self.scrape_interval_seconds / 2))


_FIELDS: dict[str, tuple[str, type]] = {
    "stuckAfterSeconds": ("stuck_after_seconds", float),
    "scrapeIntervalSeconds": ("scrape_interval_seconds", float),
    "action": ("action", str),
    "maxRemediations": ("max_remediations", int),
    "budgetWindowSeconds": ("budget_window_seconds", float),
    "maxUnavailable": ("max_unavailable", int),
    "cooldownSeconds": ("cooldown_seconds", float),
}


def settings_from_spec(watchdog: Mapping[str, Any] | None) -> WatchdogSettings:
    """Build settings from `spec.watchdog` (None or {} -> defaults). Unknown keys are ignored."""
    values: dict[str, Any] = {}
    for key, (attr, kind) in _FIELDS.items():
        raw = (watchdog or {}).get(key)
        if raw is None:
            continue
        if kind is str:
            if raw not in ACTIONS:
                raise SettingsError(f"spec.watchdog.{key}: expected one of {ACTIONS}, got {raw!r}")
            values[attr] = raw
        else:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise SettingsError(f"spec.watchdog.{key}: expected a number, got {raw!r}")
            values[attr] = kind(raw)
    settings = WatchdogSettings(**values)
    _validate(settings)
    return settings


def _validate(s: WatchdogSettings) -> None:
    if s.stuck_after_seconds <= 0:
        raise SettingsError("spec.watchdog.stuckAfterSeconds must be > 0")
    if s.scrape_interval_seconds <= 0:
        raise SettingsError("spec.watchdog.scrapeIntervalSeconds must be > 0")
    if s.max_remediations < 0:
        raise SettingsError("spec.watchdog.maxRemediations must be >= 0")
    if s.budget_window_seconds <= 0:
        raise SettingsError("spec.watchdog.budgetWindowSeconds must be > 0")
    if s.max_unavailable < 1:
        raise SettingsError("spec.watchdog.maxUnavailable must be >= 1")
    if s.cooldown_seconds is not None and s.cooldown_seconds < 0:
        raise SettingsError("spec.watchdog.cooldownSeconds must be >= 0")
