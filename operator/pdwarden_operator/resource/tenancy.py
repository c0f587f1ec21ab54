"""Who may reach the model's workers: its NetworkPolicies and its worker key (tenancy.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pdwarden_operator.resource.rules import Part


class NetworkPolicySpec(Part):
    """NetworkPolicies for the model's pods (enforced by the cluster's network plugin). Prefill
    and decode (<name>-runtime): the model's router may reach their HTTP port, the model's own
    prefill and decode pods reach each other on any port (bootstrap, and the NIXL/UCX and
    side-channel ports, which are ephemeral), and `metricsFrom` reaches the metrics port; nothing
    else gets in, so no one but the router can hand a worker a PD request. The router
    (<name>-router): its HTTP port from anywhere (the model's front door), its metrics port from
    `metricsFrom`."""

    enabled: bool = Field(True, description="Create the NetworkPolicies <name>-runtime and <name>-router.")
    metrics_from: list[dict[str, Any]] | None = Field(
        None,
        description="NetworkPolicyPeers (podSelector, namespaceSelector, ipBlock) allowed to scrape "
        "metrics. Unset: pods labelled app.kubernetes.io/component=operator, "
        "app.kubernetes.io/name=pdwarden (the operator) or app.kubernetes.io/name=prometheus, "
        "in any namespace.",
        max_length=16,
    )


class WorkerKeySpec(Part):
    """A key of the model's own between its router and its workers. The operator creates a
    Secret `<name>-worker-key-<random>` (owned by the model; the operator may create Secrets but
    never read one) and mounts it into the router and every prefill and decode pod. A worker then
    answers 401 to any HTTP request without it, except /health* and /metrics: only the model's
    router can hand it a PD request, read its state or reach SGLang's other endpoints, even on a
    cluster that does not enforce NetworkPolicies. The router presents the key itself; its
    clients need none. Raising `rotation` replaces the key without a refused request. Deleting
    the Secret makes the operator create a new one at the model's next change or the operator's
    next start, and roll every pod onto it at once."""

    enabled: bool = Field(True, description="Require the model's worker key on the workers' HTTP port.")
    rotation: int = Field(
        0,
        ge=0,
        le=2**31 - 1,
        description="Raise it (by one) to rotate the key: the operator creates a new Secret and moves "
        "the router and every pod onto it through windows in which the old key and the new are both "
        "accepted, so that no request is refused. Lowering it does nothing.",
    )
