"""Pure checks: what in a pod spec the process kubelet cannot honour, each naming its field.

A pod asking for any of these fails (an Event, and its containers wait with
CreateContainerConfigError and a message naming the field) instead of running without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]

VOLUME_TYPES = frozenset(
    {"emptyDir", "hostPath", "configMap", "secret", "downwardAPI", "projected", "persistentVolumeClaim"}
)
PROJECTED_SOURCES = frozenset({"serviceAccountToken", "configMap", "secret", "downwardAPI"})
PROBE_KINDS = frozenset({"httpGet", "exec", "tcpSocket"})
# RuntimeDefault is the sandbox's filter (sandbox.py); a Localhost profile names a file this
# kubelet does not read.
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Unconfined"})
POD_SECURITY_FIELDS = frozenset(
    {
        "runAsUser",
        "runAsGroup",
        "runAsNonRoot",
        "fsGroup",
        "fsGroupChangePolicy",
        "supplementalGroups",
        "seccompProfile",
    }
)
CONTAINER_SECURITY_FIELDS = frozenset(
    {
        "runAsUser",
        "runAsGroup",
        "runAsNonRoot",
        "readOnlyRootFilesystem",
        "allowPrivilegeEscalation",
        "capabilities",
        "privileged",
        "seccompProfile",
    }
)


@dataclass(frozen=True)
class Refusal:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def refusals(pod: JSON) -> list[Refusal]:
    """Every field of `pod` the local kubelet cannot honour (empty: the pod can run)."""
    spec = pod.get("spec") or {}
    return list(_pod_level(spec)) + [
        r
        for kind in ("initContainers", "containers")
        for i, c in enumerate(spec.get(kind) or [])
        for r in _container(f"spec.{kind}[{i}]", c, spec)
    ]


def _pod_level(spec: JSON) -> Iterator[Refusal]:
    if spec.get("ephemeralContainers"):
        yield Refusal("spec.ephemeralContainers", "not supported by the local kubelet")
    yield from _security("spec.securityContext", spec.get("securityContext") or {}, POD_SECURITY_FIELDS)
    for i, vol in enumerate(spec.get("volumes") or []):
        where = f"spec.volumes[{i}]"
        kinds = [k for k in vol if k != "name"]
        unsupported = [k for k in kinds if k not in VOLUME_TYPES]
        if unsupported:
            yield Refusal(f"{where}.{unsupported[0]}", "volume type not supported by the local kubelet")
            continue
        if "emptyDir" in vol and (vol["emptyDir"] or {}).get("medium") not in (None, "", "Memory"):
            yield Refusal(f"{where}.emptyDir.medium", f"medium {vol['emptyDir']['medium']!r} not supported")
        for j, source in enumerate((vol.get("projected") or {}).get("sources") or []):
            for key in source:
                if key not in PROJECTED_SOURCES:
                    yield Refusal(f"{where}.projected.sources[{j}].{key}", "projected source not supported")
        host = vol.get("hostPath") or {}
        if host.get("type") in ("Socket", "CharDevice", "BlockDevice"):
            yield Refusal(f"{where}.hostPath.type", f"type {host['type']!r} not supported")


def _container(where: str, c: JSON, spec: JSON) -> Iterator[Refusal]:
    for i, port in enumerate(c.get("ports") or []):
        host_port = port.get("hostPort")
        if host_port and not (spec.get("hostNetwork") and host_port == port.get("containerPort")):
            yield Refusal(
                f"{where}.ports[{i}].hostPort", "host ports of pods on the pod network are not supported"
            )
    for key in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = c.get(key)
        if probe:
            kinds = [k for k in probe if k in PROBE_KINDS or k == "grpc"]
            if "grpc" in kinds:
                yield Refusal(f"{where}.{key}.grpc", "gRPC probes are not supported by the local kubelet")
    lifecycle = c.get("lifecycle") or {}
    for hook in ("postStart", "preStop"):
        if lifecycle.get(hook):
            yield Refusal(f"{where}.lifecycle.{hook}", "lifecycle hooks are not supported here")
    if c.get("volumeDevices"):
        yield Refusal(f"{where}.volumeDevices", "raw block volumes are not supported")
    for i, mount in enumerate(c.get("volumeMounts") or []):
        if mount.get("subPathExpr"):
            yield Refusal(f"{where}.volumeMounts[{i}].subPathExpr", "not supported (use subPath)")
        if mount.get("mountPropagation") not in (None, "None", "HostToContainer"):
            yield Refusal(
                f"{where}.volumeMounts[{i}].mountPropagation", f"{mount['mountPropagation']!r} not supported"
            )
    security = c.get("securityContext") or {}
    yield from _security(f"{where}.securityContext", security, CONTAINER_SECURITY_FIELDS)
    if security.get("privileged"):
        yield Refusal(f"{where}.securityContext.privileged", "privileged containers are not supported")


def _security(where: str, ctx: JSON, known: frozenset[str]) -> Iterator[Refusal]:
    for key, value in ctx.items():
        if value in (None, False, {}, []):
            continue
        if key not in known:
            yield Refusal(f"{where}.{key}", "not supported by the local kubelet")
    seccomp = (ctx.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in SECCOMP_TYPES:
        yield Refusal(f"{where}.seccompProfile.type", f"{seccomp!r} profiles are not supported")
