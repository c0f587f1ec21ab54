"""The watchdog's settings: when a pod is wedged, how often pods are scraped, what is done
about a wedge and how many remediations a window allows."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from pdwarden_operator.resource.rules import Part, Rule

WatchdogAction = Literal["alert", "restart", "evict", "drain"]  # spec.watchdog.action
WATCHDOG_ACTIONS: tuple[WatchdogAction, ...] = get_args(WatchdogAction)

# The runtime's self-heal comes first (default inflightDeadlineSeconds 300): the operator's
# threshold sits a minute above it, so a wedge the operator sees is one the runtime could not heal.
DEFAULT_STUCK_AFTER_S = 360
MIN_COOLDOWN_S = 60


class WatchdogSpec(Part):
    """How the operator finds and remediates wedged pods (inflight queue with no progress)."""

    RULES = (
        Rule(
            "self.stuckAfterSeconds >= 2 * self.scrapeIntervalSeconds",
            "stuckAfterSeconds must be at least two scrape intervals (a wedge needs two scrapes)",
            lambda w: w.stuck_after_seconds >= 2 * w.scrape_interval_seconds,
            ".stuckAfterSeconds",
        ),
        Rule(
            "self.budgetWindowSeconds >= self.stuckAfterSeconds",
            "budgetWindowSeconds must be at least stuckAfterSeconds",
            lambda w: w.budget_window_seconds >= w.stuck_after_seconds,
            ".budgetWindowSeconds",
        ),
        Rule(
            "self.action != 'drain' || self.drainSeconds >= 2 * self.scrapeIntervalSeconds",
            "drainSeconds must be at least two scrape intervals when action is drain (the default)",
            lambda w: w.action != "drain" or w.drain_seconds >= 2 * w.scrape_interval_seconds,
            ".drainSeconds",
        ),
    )

    stuck_after_seconds: int = Field(
        DEFAULT_STUCK_AFTER_S,
        description="A pod whose rooms in flight make no progress for this long, or whose oldest room "
        "stays in Transferring this long, is wedged. Must exceed transfer.inflightDeadlineSeconds: "
        "the runtime's own deadline fails a stuck room first; the operator acts only when it did not.",
        ge=2,
        le=86400,
    )
    scrape_interval_seconds: int = Field(
        10, description="How often each pod's metrics are scraped.", ge=1, le=3600
    )
    action: WatchdogAction = Field(
        "drain",
        description="What to do with a wedged pod: drain (the default: quarantine the pod out of its "
        "Deployment and the router so a replacement starts at once, wait until its healthy requests "
        "finished and the replacement is Ready, or drainSeconds, then delete it), evict (Eviction API, "
        "honours the PodDisruptionBudget), restart (delete the pod, bypassing the "
        "PodDisruptionBudget) or alert (Event and condition only).",
    )
    drain_seconds: int = Field(
        120,
        description="action drain: the longest a quarantined pod is kept for its healthy "
        "requests and its replacement; then what remains is aborted and the pod deleted.",
        ge=2,
        le=3600,
    )
    max_remediations: int = Field(
        3, description="At most this many remediations per budget window.", ge=0, le=1000
    )
    budget_window_seconds: int = Field(
        3600, description="Length of the remediation budget window.", ge=60, le=604800
    )
    max_unavailable: int = Field(
        1,
        description="At most this many pods of a role remediated (unavailable) at once; "
        "also the role's PodDisruptionBudget.",
        ge=1,
        le=512,
    )

    @property
    def cooldown_seconds(self) -> float:
        """After an action, no further action on any of the model's pods for this long: the
        replacement needs time to become Ready, and the pods of the OTHER role that were
        exchanging KV with the removed pod need time to let go of those rooms (measured: ~35 s
        for decode after its prefill vanished). Acting sooner would cascade."""
        return float(max(self.stuck_after_seconds, MIN_COOLDOWN_S))

    @property
    def scrape_timeout_seconds(self) -> float:
        """Per-request timeout: a slow pod must not delay the round past its interval."""
        return max(0.5, min(5.0, self.scrape_interval_seconds / 2))
