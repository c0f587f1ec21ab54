"""The router in front (smg, SGLang's router): its replicas, policy, image, resources, and the
arguments of smg's that the router pod owns."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field

from pdwarden_operator.resource.containers import ResourceRequirements, RouterPodTemplate
from pdwarden_operator.resource.rules import Part, Rule

# The router's requests and limits unless router.resources says otherwise (key by key).
ROUTER_DEFAULT_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "64Mi"},
    "limits": {"cpu": "2", "memory": "2Gi"},
}

# smg's options the router pod owns: where smg listens (loopback, behind the gate: on another
# address its control plane would face clients) and its keys.
ROUTER_LISTEN_ARGS: Final = ("--host", "--port", "--api-key", "--control-plane-api-keys")
# ... and its health checks and removal of workers (render/router.py, ROUTER_HEALTH_ARGS: off),
# every spelling smg 1.13.0 takes: whether a worker serves is its pod's readiness and the
# watchdog's to say, never smg's.
ROUTER_HEALTH_OWNED_ARGS: Final = (
    "--disable-health-check",
    "--health-check-interval-secs",
    "--health-check-timeout-secs",
    "--health-check-endpoint",
    "--health-failure-threshold",
    "--health-success-threshold",
    "--remove-unhealthy-workers",
    "--no-remove-unhealthy-workers",
    "--worker-auto-recovery",
    "--no-worker-auto-recovery",
)
# ... and its retries and circuit breaker (render/router.py, ROUTER_RESILIENCE_ARGS), every
# spelling smg 1.13.0 takes: a request caught in a wedged room is answered by another pair only
# with them.
ROUTER_RESILIENCE_OWNED_ARGS: Final = (
    "--retry-max-retries",
    "--retry-initial-backoff-ms",
    "--retry-max-backoff-ms",
    "--retry-backoff-multiplier",
    "--retry-jitter-factor",
    "--disable-retries",
    "--cb-failure-threshold",
    "--cb-success-threshold",
    "--cb-timeout-duration-secs",
    "--cb-window-duration-secs",
    "--disable-circuit-breaker",
)
# argparse takes any unambiguous prefix of an option, so a prefix of one of these is refused too.
ROUTER_OWNED_ARGS: Final = (*ROUTER_LISTEN_ARGS, *ROUTER_HEALTH_OWNED_ARGS, *ROUTER_RESILIENCE_OWNED_ARGS)


def _router_args_not_owned(args: list[str]) -> list[str]:
    for arg in args:
        name = arg.partition("=")[0]
        if len(name) < 3 or not name.startswith("--"):
            continue
        owned = [flag for flag in ROUTER_OWNED_ARGS if flag.startswith(name)]
        if owned:
            if owned[0] in ROUTER_HEALTH_OWNED_ARGS:
                why = (
                    "smg takes no worker out of routing on its own judgement: the pods' readiness "
                    "and the watchdog decide"
                )
            elif owned[0] in ROUTER_RESILIENCE_OWNED_ARGS:
                why = "retries and the circuit breaker send a request caught in a wedge to another pair"
            else:
                why = "smg listens on loopback behind the model's gate, with keys of the gate's own"
            raise ValueError(f"{name} is set by the router pod ({owned[0]}: {why}); leave it out")
    return args


class RouterSpec(Part):
    """SGLang's router (smg) in front: discovers prefill and decode pods and routes requests."""

    RULES = (
        Rule(
            "self.nodesPerReplica == 1",
            "the router runs as single pods: nodesPerReplica must be 1 (only prefill and decode "
            "replicas span several nodes)",
            lambda r: r.nodes_per_replica == 1,
            ".nodesPerReplica",
        ),
    )

    replicas: int = Field(1, description="Number of router pods.", ge=0, le=64)
    nodes_per_replica: int = Field(
        1, description="Always 1: a router replica is one pod (prefill and decode may span nodes).", ge=1
    )
    policy: Literal["random", "round_robin", "cache_aware", "power_of_two"] = Field(
        "cache_aware", description="Load-balancing policy for both prefill and decode."
    )
    image: str | None = Field(
        None,
        description="Router image (with smg, SGLang's router). Defaults to the runtime image.",
        min_length=1,
        max_length=512,
    )
    resources: ResourceRequirements | None = Field(
        None,
        description="CPU and memory per router pod, merged key by key over the defaults: "
        + ", ".join(f"{part} {vals}" for part, vals in ROUTER_DEFAULT_RESOURCES.items())
        + ".",
    )
    args: Annotated[list[Annotated[str, Field(max_length=4096)]], AfterValidator(_router_args_not_owned)] = (
        Field(
            default_factory=list,
            description="Extra arguments of the router (smg launch_router); not "
            + ", ".join(ROUTER_OWNED_ARGS)
            + " (the router pod sets them).",
            max_length=64,
        )
    )
    pod_template: RouterPodTemplate | None = Field(None)
