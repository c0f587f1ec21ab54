"""How the model is reached: the router's Service and the NetworkPolicies that admit only its
router, its own runtime pods and the metrics peers."""

from __future__ import annotations

import pdwarden_contract as contract
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.render.kinds import NETWORK_POLICY, SERVICE
from pdwarden_operator.render.meta import APP_NAME, Obj, Owner, child_metadata, child_name, selector_labels

NETWORK_POLICY_SUFFIX = "runtime"
# Pods allowed to scrape metrics when networkPolicy.metricsFrom is unset: the operator (the
# chart's labels) and Prometheus, in any namespace.
DEFAULT_METRICS_PEERS: tuple[Obj, ...] = (
    {
        "namespaceSelector": {},
        "podSelector": {
            "matchLabels": {contract.LABEL_APP_NAME: APP_NAME, contract.LABEL_APP_COMPONENT: "operator"}
        },
    },
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {contract.LABEL_APP_NAME: "prometheus"}}},
)


def router_service(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    return {
        **SERVICE.type_meta(),
        "metadata": child_metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name, role),
            "ports": [
                {
                    "name": contract.PORT_NAME_HTTP,
                    "port": contract.ROUTER_HTTP_PORT,
                    "targetPort": contract.PORT_NAME_HTTP,
                    "protocol": "TCP",
                },
                {
                    "name": contract.PORT_NAME_METRICS,
                    "port": contract.ROUTER_METRICS_PORT,
                    "targetPort": contract.PORT_NAME_METRICS,
                    "protocol": "TCP",
                },
            ],
        },
    }


def network_policy(owner: Owner, spec: DisaggregatedModelSpec) -> Obj:
    """Ingress to the model's prefill and decode pods: its router to HTTP, its own runtime pods
    to every port (bootstrap; NIXL, UCX and side channels use ephemeral ports), the metrics
    peers to metrics. A named port follows hostPortOffset."""
    runtime_pods = {
        "matchLabels": {contract.LABEL_MODEL: owner.name},
        "matchExpressions": [
            {
                "key": contract.LABEL_ROLE,
                "operator": "In",
                # a quarantined pod still finishes its healthy requests' transfers while it drains
                "values": [contract.ROLE_PREFILL, contract.ROLE_DECODE, contract.ROLE_QUARANTINED],
            }
        ],
    }
    router_pods = {"matchLabels": selector_labels(owner.name, contract.ROLE_ROUTER)}
    metrics_from = _metrics_peers(spec)
    suffix = NETWORK_POLICY_SUFFIX
    return {
        **NETWORK_POLICY.type_meta(),
        "metadata": child_metadata(owner, child_name(owner.name, suffix), suffix),
        "spec": {
            "podSelector": runtime_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": router_pods}],
                    "ports": [{"protocol": "TCP", "port": contract.PORT_NAME_HTTP}],
                },
                {"from": [{"podSelector": runtime_pods}]},
                {"from": metrics_from, "ports": [{"protocol": "TCP", "port": contract.PORT_NAME_METRICS}]},
            ],
        },
    }


def _metrics_peers(spec: DisaggregatedModelSpec) -> list[Obj]:
    peers = spec.network_policy.metrics_from
    return [dict(p) for p in (peers if peers is not None else DEFAULT_METRICS_PEERS)]


def router_network_policy(owner: Owner, spec: DisaggregatedModelSpec) -> Obj:
    """Ingress to the model's router pods: clients to its HTTP port, the metrics peers to its
    metrics port, nothing else."""
    role = contract.ROLE_ROUTER
    return {
        **NETWORK_POLICY.type_meta(),
        "metadata": child_metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(owner.name, role)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": contract.PORT_NAME_HTTP}]},
                {
                    "from": _metrics_peers(spec),
                    "ports": [{"protocol": "TCP", "port": contract.PORT_NAME_METRICS}],
                },
            ],
        },
    }
