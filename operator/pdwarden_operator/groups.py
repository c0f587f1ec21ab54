"""Multi-node replicas: one StatefulSet per group, a headless Service naming the leaders.

A role with `nodesPerReplica` N > 1 runs each replica as a group of N pods: the StatefulSet
`<model>-<role>-<g>` (group g, `podManagementPolicy: Parallel` so the ranks start together;
ordinal = rank, rank 0 is the leader) and, for the whole role, the headless Service
`<model>-<role>-ranks`, which gives every leader a stable DNS name before it is ready
(`publishNotReadyAddresses`: the leader is ready only once all its ranks joined, and they
need its name to join). Pure functions over plain dicts, like the render package, whose
render/runtime.py calls them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pdwarden_contract as contract

Obj = dict[str, Any]
RANKS_SUFFIX = "ranks"
HOSTNAME_KEY = "kubernetes.io/hostname"


def group_name(model: str, role: str, group: int) -> str:
    """The group's StatefulSet; its pods are `<group_name>-<rank>`."""
    return f"{model}-{role}-{group}"


def ranks_service_name(model: str, role: str) -> str:
    return f"{model}-{role}-{RANKS_SUFFIX}"


def leader_host(model: str, role: str, group: int) -> str:
    """The leader's DNS name, relative to the pod's namespace (the resolver's search path adds
    `<namespace>.svc.<cluster domain>`, whatever the cluster domain is)."""
    return f"{group_name(model, role, group)}-0.{ranks_service_name(model, role)}"


def dist_init_addr(model: str, role: str, group: int, port: int) -> str:
    return f"{leader_host(model, role, group)}:{port}"


def group_selector(model: str, role: str, group: int) -> dict[str, str]:
    return {contract.LABEL_MODEL: model, contract.LABEL_ROLE: role, contract.LABEL_GROUP: str(group)}


def group_args(model: str, role: str, group: int, nodes: int, port: int) -> list[str]:
    """The runtime's multi-node flags (the same as SGLang's); the rank comes from the pod's env."""
    flag = contract.ServeFlag
    return [
        str(flag.NNODES),
        str(nodes),
        str(flag.NODE_RANK),
        f"$({contract.ENV_NODE_RANK})",
        str(flag.DIST_INIT_ADDR),
        dist_init_addr(model, role, group, port),
    ]


def rank_env() -> Obj:
    """The rank from the StatefulSet controller's pod-index label (its ordinal)."""
    path = f"metadata.labels['{contract.LABEL_POD_INDEX}']"
    return {"name": contract.ENV_NODE_RANK, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _anti_affinity(model: str, role: str, group: int) -> Obj:
    """The ranks of one group never share a node (required, as on a real cluster: N ranks on one
    node would oversubscribe its GPUs)."""
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": group_selector(model, role, group)},
                    "topologyKey": HOSTNAME_KEY,
                }
            ]
        }
    }


def _with_affinity(pod_spec: Obj, extra: Obj) -> Obj:
    affinity = dict(pod_spec.get("affinity") or {})
    anti = dict(affinity.get("podAntiAffinity") or {})
    required = list(anti.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    required.extend(extra["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"])
    anti["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["podAntiAffinity"] = anti
    return {**pod_spec, "affinity": affinity}


def statefulset(
    metadata: Mapping[str, Any],
    template: Mapping[str, Any],
    *,
    model: str,
    role: str,
    group: int,
    nodes: int,
) -> Obj:
    """One group: `template` is the role's rendered pod template for this group (its command
    already holds the group's flags); the group label, the rank env and the anti-affinity are
    added here."""
    selector = group_selector(model, role, group)
    tmpl = copy.deepcopy(dict(template))
    tmpl["metadata"] = {**tmpl.get("metadata", {})}
    tmpl["metadata"]["labels"] = {**tmpl["metadata"].get("labels", {}), **selector}
    tmpl["spec"] = _with_affinity(tmpl["spec"], _anti_affinity(model, role, group))
    meta = copy.deepcopy(dict(metadata))
    meta["name"] = group_name(model, role, group)
    meta["labels"] = {**meta.get("labels", {}), contract.LABEL_GROUP: str(group)}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "replicas": nodes,
            "serviceName": ranks_service_name(model, role),
            # Ranks start together: the leader waits for all of them, they wait for it.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            "template": tmpl,
        },
    }


def ranks_service(metadata: Mapping[str, Any], *, model: str, role: str, port: int) -> Obj:
    meta = copy.deepcopy(dict(metadata))
    meta["name"] = ranks_service_name(model, role)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "clusterIP": "None",
            # Ranks resolve their leader before it is ready (it is ready once they joined).
            "publishNotReadyAddresses": True,
            "selector": {contract.LABEL_MODEL: model, contract.LABEL_ROLE: role},
            "ports": [
                {
                    "name": contract.PORT_NAME_DIST,
                    "port": port,
                    "targetPort": contract.PORT_NAME_DIST,
                    "protocol": "TCP",
                }
            ],
        },
    }


def group_index(obj: Mapping[str, Any]) -> int | None:
    """A group child's index from its labels (None: not a group's)."""
    raw = ((obj.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_GROUP)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None
