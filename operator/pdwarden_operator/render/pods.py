"""What every pod the operator renders shares: its security contexts, the writable /tmp,
container resources, identity from the downward API, HTTP probes, the spread over nodes."""

from __future__ import annotations

import pdwarden_contract as contract
from pdwarden_operator import podtemplate
from pdwarden_operator.render.meta import Obj, selector_labels
from pdwarden_operator.resource.containers import GPU_RESOURCE, ResourceRequirements

# The runtime image's non-root USER (runtime/Dockerfile); pods run as it unless a podTemplate
# says otherwise (an image that needs root: securityContext {runAsNonRoot: false, runAsUser: 0}).
NON_ROOT_UID = 1000
TMP_DIR = "/tmp"  # an emptyDir: the root filesystem is read-only


def field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def pod_identity_env() -> list[Obj]:
    """POD_IP, POD_NAME, POD_NAMESPACE from the downward API (runtime and router pods)."""
    return [
        field_env(contract.ENV_POD_IP, "status.podIP"),
        field_env(contract.ENV_POD_NAME, "metadata.name"),
        field_env(contract.ENV_POD_NAMESPACE, "metadata.namespace"),
    ]


def container_resources(
    res: ResourceRequirements | None, gpus: int = 0, extra: dict[str, int] | None = None
) -> Obj:
    out: Obj = {}
    if res is not None:
        if res.requests:
            out["requests"] = {k: str(v) for k, v in res.requests.items()}
        if res.limits:
            out["limits"] = {k: str(v) for k, v in res.limits.items()}
    devices = {**({GPU_RESOURCE: gpus} if gpus > 0 else {}), **(extra or {})}
    if devices:
        # Extended resources are requested through limits (requests default to them).
        out["limits"] = {**out.get("limits", {}), **{k: str(v) for k, v in devices.items()}}
    return out


def pod_security_context() -> Obj:
    """Restricted Pod Security level: non-root, RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        # A volume of weights is large: change its ownership only when its root does not match.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(add: tuple[str, ...] = ()) -> Obj:
    capabilities: Obj = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = list(add)
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": capabilities}


def tmp_volume() -> tuple[Obj, Obj]:
    """(volume, mount) of the writable /tmp of a pod whose root filesystem is read-only."""
    return {"name": podtemplate.TMP_VOLUME, "emptyDir": {}}, {
        "name": podtemplate.TMP_VOLUME,
        "mountPath": TMP_DIR,
    }


def spread_constraints(model: str, role: str) -> list[Obj]:
    """Same-role replicas prefer different nodes (a preference: never leaves a pod Pending)."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector_labels(model, role)},
        }
    ]


def http_probe(path: str, port: str, period: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }
