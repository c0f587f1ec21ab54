"""The installation's pod policy: what a model author may make the operator's pods do beyond
what pdwarden renders.

Granting `create` on DisaggregatedModels must not grant more than it says. The operator
creates the model's pods with its own rights, so without this check a model's `podTemplate`
would run pods as any ServiceAccount of the namespace, mount any of its Secrets, pick a node,
or (where the namespace's Pod Security level allows it) run privileged on the host. Each such
field belongs to one `Allowance`; the installation allows some of them (for every namespace or
for named ones: the chart's `podPolicy`), and a model that uses another is refused with the
field named and the allowance it needs. Nothing is applied for a refused model.

"The model's own" Secrets are `<model>` and `<model>.<anything>`: a model author can read and
use them anyway through the model. The separator is a dot because a model's name cannot hold
one (a DNS-1035 label), so no other model's own Secret starts with `<model>.`: with a dash,
model `llama` would own `llama-70b-hf-token`, a Secret of model `llama-70b`. The operator's
own worker-key Secret (`<model>-worker-key-<random>`) is not judged here: the operator mounts
it itself; this policy judges only what the model's author wrote.

This module is pure: `violations` reads a parsed spec and returns messages.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

import pdwarden_contract as contract
from pdwarden_operator.models import DisaggregatedModelSpec


class Allowance(StrEnum):
    """One kind of power a pod template can take; the installation grants each separately."""

    SERVICE_ACCOUNT = "serviceAccount"  # run as another ServiceAccount, or with a token
    SERVICE_ACCOUNT_TOKEN = "serviceAccountToken"  # a projected ServiceAccount token volume
    HOST_NAMESPACES = "hostNamespaces"  # hostNetwork, hostPID, hostIPC (transfer.hostNetwork too), hostPort
    # privileged, privilege escalation, unmasked /proc, host processes, seccomp or AppArmor
    # Unconfined, sysctls
    PRIVILEGED = "privileged"
    CAPABILITIES = "capabilities"  # capabilities added beyond pdwarden's own
    # directories of the node (model.hostPath and the cache's too); storage the node mounts
    # for the pod with its own network and identity (in-tree nfs, iscsi, gitRepo volumes)
    HOST_PATH = "hostPath"
    NODE_NAME = "nodeName"  # bypass the scheduler onto a named node
    OTHER_SECRETS = "otherSecrets"  # Secrets not named <model> or <model>.<anything>
    FAULT_INJECTION = "faultInjection"  # the runtime's POST /debug/fault (tests and demos)


WHY: dict[Allowance, str] = {
    Allowance.SERVICE_ACCOUNT: "changes the ServiceAccount the pod runs as or gives it a token",
    Allowance.SERVICE_ACCOUNT_TOKEN: "mounts a ServiceAccount token",
    Allowance.HOST_NAMESPACES: "shares the node's namespaces",
    Allowance.PRIVILEGED: "runs with the node's privileges",
    Allowance.CAPABILITIES: "adds Linux capabilities",
    Allowance.HOST_PATH: "mounts a directory of the node",
    Allowance.NODE_NAME: "places the pod on a named node past the scheduler",
    Allowance.OTHER_SECRETS: "uses a Secret that is not the model's own",
    Allowance.FAULT_INJECTION: "lets anyone who reaches the pod inject faults",
}

# Where a PodSpec names a Secret: (path from the volume to the name) per volume source.
_VOLUME_SECRET_NAMES: tuple[tuple[str, ...], ...] = (
    ("secret", "secretName"),
    ("azureFile", "secretName"),
    ("csi", "nodePublishSecretRef", "name"),
    ("cephfs", "secretRef", "name"),
    ("cinder", "secretRef", "name"),
    ("flexVolume", "secretRef", "name"),
    ("iscsi", "secretRef", "name"),
    ("rbd", "secretRef", "name"),
    ("scaleIO", "secretRef", "name"),
    ("storageos", "secretRef", "name"),
)
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
# In-tree volumes the kubelet mounts on the node for the pod: an NFS export or an iSCSI disk
# reached from the node's own address, a git clone run by the kubelet on the node.
_NODE_MOUNTED_VOLUMES = ("nfs", "iscsi", "gitRepo")
# The annotation form of a container's AppArmor profile (`.../<container>: unconfined`).
_APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
_UNCONFINED = "Unconfined"
_UNCONFINED_WHY = "runs without seccomp or AppArmor confinement"


class PodPolicy(BaseModel):
    """What the installation allows model authors (the chart's `podPolicy`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: frozenset[Allowance] = Field(frozenset(), description="Allowed in every namespace.")
    namespaces: dict[str, frozenset[Allowance]] = Field(
        default_factory=dict, description="Allowed in these namespaces besides `allow`."
    )

    def allowed(self, namespace: str) -> frozenset[Allowance]:
        return self.allow | self.namespaces.get(namespace, frozenset())


def violations(
    spec: DisaggregatedModelSpec,
    model: str,
    annotations: Mapping[str, str],
    allowed: frozenset[Allowance],
) -> list[str]:
    """Every use of a power `allowed` lacks, as `field: why (allowance)`; empty when none."""
    out = []
    for path, allowance, why in _uses(spec, model, annotations):
        if allowance is None:
            out.append(f"{path}: {why}")
        elif allowance not in allowed:
            out.append(f"{path}: {why}; the installation's pod policy does not allow {allowance.value}")
    return out


# (field path, the allowance that permits it or None when nothing does, why)
Use = tuple[str, Allowance | None, str]


def _use(path: str, allowance: Allowance, why: str | None = None) -> Use:
    return path, allowance, why or WHY[allowance]


def fault_injection_asked(annotations: Mapping[str, str]) -> bool:
    return annotations.get(contract.ANNOTATION_ALLOW_FAULT_INJECTION, "").lower() == "true"


def _uses(spec: DisaggregatedModelSpec, model: str, annotations: Mapping[str, str]) -> Iterator[Use]:
    if fault_injection_asked(annotations):
        at = f"metadata.annotations[{contract.ANNOTATION_ALLOW_FAULT_INJECTION}]"
        if spec.engine == "sglang":  # its HTTP port is SGLang's own: never a fault endpoint there
            yield at, None, "fault injection is never served with engine sglang"
        else:
            yield _use(at, Allowance.FAULT_INJECTION)
    if spec.transfer.host_network:
        yield _use("spec.transfer.hostNetwork", Allowance.HOST_NAMESPACES)
    if spec.model.host_path is not None:
        yield _use("spec.model.hostPath", Allowance.HOST_PATH)
    hf = spec.model.hugging_face
    if hf is not None:
        if hf.cache.host_path is not None:
            yield _use("spec.model.huggingFace.cache.hostPath", Allowance.HOST_PATH)
        if hf.token_secret_ref is not None:
            yield from _secret("spec.model.huggingFace.tokenSecretRef.name", hf.token_secret_ref.name, model)
    for role in contract.RUNTIME_ROLES:
        role_spec = spec.role(role)
        for i, var in enumerate(role_spec.env):
            ref = _map(_map(var.value_from).get("secretKeyRef"))
            if ref:
                at = f"spec.{role}.env[{i}].valueFrom.secretKeyRef.name"
                yield from _secret(at, ref.get("name"), model)
        if role_spec.pod_template:
            yield from _template(f"spec.{role}.podTemplate", role_spec.pod_template, model)
    if spec.router.pod_template:
        yield from _template("spec.router.podTemplate", spec.router.pod_template, model)


def _own_secret(name: object, model: str) -> bool:
    # a dot, never a dash: no model's name holds a dot, so no other model's Secret starts so
    return isinstance(name, str) and (name == model or name.startswith(f"{model}."))


def _secret(path: str, name: object, model: str) -> Iterator[Use]:
    if not _own_secret(name, model):
        own = f"a model's own are named {model} or {model}.<anything>"
        yield path, Allowance.OTHER_SECRETS, f"{WHY[Allowance.OTHER_SECRETS]} ({name!r}; {own})"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> Iterator[tuple[int, Mapping[str, Any]]]:
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield i, _map(item)


def _template(root: str, fragment: Mapping[str, Any], model: str) -> Iterator[Use]:
    spec = _map(fragment.get("spec"))
    at = f"{root}.spec"
    for name in ("serviceAccountName", "serviceAccount"):
        if name in spec:
            yield _use(f"{at}.{name}", Allowance.SERVICE_ACCOUNT)
    if spec.get("automountServiceAccountToken") is True:
        yield _use(f"{at}.automountServiceAccountToken", Allowance.SERVICE_ACCOUNT)
    for name in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(name) is True:
            yield _use(f"{at}.{name}", Allowance.HOST_NAMESPACES)
    if spec.get("nodeName"):
        yield _use(f"{at}.nodeName", Allowance.NODE_NAME)
    pod_context = _map(spec.get("securityContext"))
    if _map(pod_context.get("windowsOptions")).get("hostProcess") is True:
        yield _use(f"{at}.securityContext.windowsOptions.hostProcess", Allowance.PRIVILEGED)
    yield from _confinement(f"{at}.securityContext", pod_context)
    if pod_context.get("sysctls"):
        # the kubelet sets them in the pod's kernel namespaces; unsafe ones reach past the pod
        yield _use(f"{at}.securityContext.sysctls", Allowance.PRIVILEGED, "sets kernel parameters")
    annotations = _map(_map(fragment.get("metadata")).get("annotations"))
    for key, value in annotations.items():
        if str(key).startswith(_APPARMOR_ANNOTATION_PREFIX) and str(value).lower() == "unconfined":
            yield _use(f"{root}.metadata.annotations[{key}]", Allowance.PRIVILEGED, _UNCONFINED_WHY)
    for i, pull in _items(spec.get("imagePullSecrets")):
        yield from _secret(f"{at}.imagePullSecrets[{i}].name", pull.get("name"), model)
    for i, volume in _items(spec.get("volumes")):
        yield from _volume(f"{at}.volumes[{i}]", volume, model)
    for kind in _CONTAINER_LISTS:
        for i, container in _items(spec.get(kind)):
            yield from _container(f"{at}.{kind}[{i}]", container, model)


def _confinement(at: str, context: Mapping[str, Any]) -> Iterator[Use]:
    """A pod's or a container's seccomp and AppArmor profile set to Unconfined."""
    for name in ("seccompProfile", "appArmorProfile"):
        if _map(context.get(name)).get("type") == _UNCONFINED:
            yield _use(f"{at}.{name}.type", Allowance.PRIVILEGED, _UNCONFINED_WHY)


def _volume(at: str, volume: Mapping[str, Any], model: str) -> Iterator[Use]:
    if "hostPath" in volume:
        yield _use(f"{at}.hostPath", Allowance.HOST_PATH)
    for kind in _NODE_MOUNTED_VOLUMES:
        if kind in volume:
            yield _use(
                f"{at}.{kind}", Allowance.HOST_PATH, "has the node mount storage with its own identity"
            )
    for path in _VOLUME_SECRET_NAMES:
        source = _map(volume.get(path[0]))
        if not source:
            continue
        value: Any = source
        for key in path[1:]:
            value = _map(value).get(key)
        if value is not None:
            yield from _secret(f"{at}.{'.'.join(path)}", value, model)
    for j, source in _items(_map(volume.get("projected")).get("sources")):
        if "serviceAccountToken" in source:
            yield _use(f"{at}.projected.sources[{j}].serviceAccountToken", Allowance.SERVICE_ACCOUNT_TOKEN)
        if "secret" in source:
            name = _map(source["secret"]).get("name")
            yield from _secret(f"{at}.projected.sources[{j}].secret.name", name, model)


def _container(at: str, container: Mapping[str, Any], model: str) -> Iterator[Use]:
    context = _map(container.get("securityContext"))
    if context.get("privileged") is True:
        yield _use(f"{at}.securityContext.privileged", Allowance.PRIVILEGED)
    if context.get("allowPrivilegeEscalation") is True:
        yield _use(f"{at}.securityContext.allowPrivilegeEscalation", Allowance.PRIVILEGED)
    if context.get("procMount") not in (None, "Default"):
        yield _use(f"{at}.securityContext.procMount", Allowance.PRIVILEGED)
    if _map(context.get("windowsOptions")).get("hostProcess") is True:
        yield _use(f"{at}.securityContext.windowsOptions.hostProcess", Allowance.PRIVILEGED)
    yield from _confinement(f"{at}.securityContext", context)
    if _map(context.get("capabilities")).get("add"):
        yield _use(f"{at}.securityContext.capabilities.add", Allowance.CAPABILITIES)
    for i, port in _items(container.get("ports")):
        if port.get("hostPort"):
            yield _use(
                f"{at}.ports[{i}].hostPort", Allowance.HOST_NAMESPACES, "listens on a port of the node"
            )
    for i, var in _items(container.get("env")):
        ref = _map(_map(var.get("valueFrom")).get("secretKeyRef"))
        if ref:
            yield from _secret(f"{at}.env[{i}].valueFrom.secretKeyRef.name", ref.get("name"), model)
    for i, source in _items(container.get("envFrom")):
        ref = _map(source.get("secretRef"))
        if ref:
            yield from _secret(f"{at}.envFrom[{i}].secretRef.name", ref.get("name"), model)
