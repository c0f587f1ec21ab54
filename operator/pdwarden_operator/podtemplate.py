"""A role's `podTemplate`: the one merge of a user's fragment into a rendered pod, and the one
list of the pod fields pdwarden owns.

The merge follows strategic-merge semantics on a PodTemplateSpec (what `kubectl patch
--type strategic` does), restricted to what a pod template needs:

- maps merge key by key, recursively; a scalar or an unkeyed list in the fragment replaces
  the rendered one; a key set to null in the fragment removes the rendered key (e.g.
  `securityContext: {runAsUser: null}`);
- lists in `KEYED_LISTS` merge item by item on their key: an item whose key is already
  rendered is merged into it, a new one is appended (containers, initContainers, volumes
  and env by name; topologySpreadConstraints by topologyKey, so a fragment can replace the
  default spread);
- lists in `APPENDED_LISTS` are appended to the rendered ones (tolerations, volumeMounts,
  imagePullSecrets).

Fields pdwarden owns (`OWNED_*` below) are refused, never silently dropped: the same data
produces the CRD's CEL rules (refused at `kubectl apply`) and `owned_violations` (refused
again when the operator reads the spec). Everything else a fragment says reaches the pod
as written; what the API server would refuse is found by a server-side dry-run of the
rendered child before anything is applied.

This module is pure and imports nothing of the operator, so that the spec models can build
their schema from it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

import pdwarden_contract as contract

Obj = dict[str, Any]

RUNTIME_CONTAINER: Final = "runtime"
ROUTER_CONTAINER: Final = "router"
# Volumes pdwarden mounts into runtime pods (shared memory, model weights, model cache).
SHM_VOLUME: Final = "dshm"
MODEL_VOLUME: Final = "model"
CACHE_VOLUME: Final = "model-cache"
# The operator's list of the model's deleted runtime pods (writer_watch's proof).
GONE_PODS_VOLUME: Final = "gone-pods"
# /tmp (and HOME) on a read-only root filesystem.
TMP_VOLUME: Final = "tmp"
# The Hugging Face token, as a file.
HF_TOKEN_VOLUME: Final = "hf-token"
# The model's worker key (router and workers), as a file.
WORKER_KEY_VOLUME: Final = "worker-key"
WORKER_KEY_ACCEPT_VOLUME: Final = "worker-key-accept"
# The router's ServiceAccount token (pod discovery), in the router container only.
ROUTER_TOKEN_VOLUME: Final = "router-token"

KEYED_LISTS: Final[dict[str, str]] = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "topologySpreadConstraints": "topologyKey",
}
APPENDED_LISTS: Final = ("tolerations", "volumeMounts", "imagePullSecrets")

# Env vars the operator sets itself on runtime pods; neither the role's env nor a fragment
# may set them.
RESERVED_ENV: Final = (
    contract.ENV_POD_IP,
    contract.ENV_POD_NAME,
    contract.ENV_POD_NAMESPACE,
    contract.ENV_ROLE,
    contract.ENV_MODEL,
    contract.ENV_NODE_RANK,
    contract.ENV_POD_UID,
    contract.ENV_GONE_PODS_FILE,
)
# Fields of the main container (`runtime` or `router`) that pdwarden owns, and where to say
# instead what one wants.
OWNED_CONTAINER_FIELDS: Final[dict[str, str]] = {
    "image": "set spec.image (or router.image)",
    "command": "pdwarden starts the runtime; add arguments with the role's args",
    "args": "use the role's args",
    "ports": "the ports are the runtime contract's (see transfer.hostNetwork)",
    "startupProbe": "pdwarden probes the runtime's health endpoint",
    "readinessProbe": "pdwarden probes the runtime's health endpoint",
    "livenessProbe": "pdwarden probes the runtime's health endpoint",
    "resources": "use the role's resources, gpus and transfer.rdma",
}
# The main container's keys are its own: in a shared process namespace the other containers
# would read them (its command line, its files through /proc).
_PRIVATE_PROCESSES: Final = {
    "shareProcessNamespace": "the other containers would read the main container's keys"
}
# Pod-level fields pdwarden owns, per main container.
OWNED_POD_FIELDS: Final[dict[str, dict[str, str]]] = {
    RUNTIME_CONTAINER: {"hostNetwork": "use transfer.hostNetwork", **_PRIVATE_PROCESSES},
    ROUTER_CONTAINER: {
        **_PRIVATE_PROCESSES,
        "hostNetwork": "the router runs on the pod network",
        "serviceAccountName": "the router's ServiceAccount holds its pod-discovery Role",
        "automountServiceAccountToken": "the router's token is mounted into its own container only",
    },
}
# The Deployment's selector and the router's discovery match these; NetworkPolicies admit the
# operator's pods by name and component (a model's pod labelled as the operator would read
# every model's metrics).
OWNED_LABELS: Final = (
    contract.LABEL_MODEL,
    contract.LABEL_ROLE,
    contract.LABEL_GROUP,
    contract.LABEL_RANK,
    contract.LABEL_APP_NAME,
    contract.LABEL_APP_COMPONENT,
)
# The router (smg) reads the prefill bootstrap port from this annotation.
OWNED_ANNOTATIONS: Final = (contract.ANNOTATION_BOOTSTRAP_PORT,)
OWNED_VOLUMES: Final = (
    SHM_VOLUME,
    MODEL_VOLUME,
    CACHE_VOLUME,
    GONE_PODS_VOLUME,
    TMP_VOLUME,
    HF_TOKEN_VOLUME,
    WORKER_KEY_VOLUME,
    WORKER_KEY_ACCEPT_VOLUME,
    ROUTER_TOKEN_VOLUME,
)
# Volumes only the main container mounts: what they hold is the model's (its keys, its Hugging
# Face token, the router's API token), not a sidecar's.
MAIN_ONLY_VOLUMES: Final = (HF_TOKEN_VOLUME, WORKER_KEY_VOLUME, WORKER_KEY_ACCEPT_VOLUME, ROUTER_TOKEN_VOLUME)
MAX_VOLUME_MOUNTS: Final = 64

# Bounds on the fragment's lists: they keep the CEL rules' cost estimate within the budget.
MAX_CONTAINERS: Final = 16
MAX_VOLUMES: Final = 64
MAX_ENV: Final = 128


# --- the merge -------------------------------------------------------------------------------


def merge(rendered: Mapping[str, Any], fragment: Mapping[str, Any] | None) -> Obj:
    """`rendered` with `fragment` merged in (neither is modified)."""
    out = copy.deepcopy(dict(rendered))
    if fragment:
        _merge_map(out, fragment)
    return out


def _merge_map(into: Obj, patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge_map(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = _merge_list(key, into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _merge_list(key: str, rendered: list[Any], patch: list[Any]) -> list[Any]:
    if key in APPENDED_LISTS:
        return [*rendered, *copy.deepcopy(patch)]
    merge_key = KEYED_LISTS.get(key)
    if merge_key is None:
        return copy.deepcopy(patch)
    out = list(rendered)
    index = {item.get(merge_key): i for i, item in enumerate(out) if isinstance(item, dict)}
    for item in patch:
        i = index.get(item.get(merge_key)) if isinstance(item, Mapping) else None
        if i is None:
            out.append(copy.deepcopy(item))
        else:
            merged = copy.deepcopy(out[i])
            _merge_map(merged, item)
            out[i] = merged
    return out


# --- owned fields: the pydantic check --------------------------------------------------------


def owned_violations(fragment: Mapping[str, Any], main: str) -> list[str]:
    """Every owned field `fragment` sets, as `path: why` (empty when it sets none).

    Robust to any shape: a wrong type is the schema's business, not a crash here.
    """
    out: list[str] = []
    meta = _map(fragment.get("metadata"))
    for part, owned in (("labels", OWNED_LABELS), ("annotations", OWNED_ANNOTATIONS)):
        values = _map(meta.get(part))
        out += [f"metadata.{part}[{k}]: owned by pdwarden" for k in owned if k in values]
    spec = _map(fragment.get("spec"))
    for name, why in OWNED_POD_FIELDS[main].items():
        if name in spec:
            out.append(f"spec.{name}: owned by pdwarden ({why})")
    for part in ("containers", "initContainers"):
        for i, container in enumerate(_list(spec.get(part))):
            c = _map(container)
            if part == "containers" and c.get("name") == main:
                continue
            for j, mount in enumerate(_list(c.get("volumeMounts"))):
                volume = _map(mount).get("name")
                if volume in MAIN_ONLY_VOLUMES:
                    out.append(f"spec.{part}[{i}].volumeMounts[{j}].name: {volume} is {main}'s alone")
    for i, container in enumerate(_list(spec.get("containers"))):
        c = _map(container)
        if c.get("name") != main:
            continue
        for name, why in OWNED_CONTAINER_FIELDS.items():
            if name in c:
                out.append(f"spec.containers[{i}].{name}: owned by pdwarden ({why})")
        for j, var in enumerate(_list(c.get("env"))):
            if _map(var).get("name") in RESERVED_ENV:
                out.append(f"spec.containers[{i}].env[{j}].name: set by pdwarden")
    for i, volume in enumerate(_list(spec.get("volumes"))):
        if _map(volume).get("name") in OWNED_VOLUMES:
            out.append(f"spec.volumes[{i}].name: {_map(volume).get('name')} is a volume pdwarden mounts")
    return out


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# --- owned fields: the CRD's schema and CEL rules -------------------------------------------


def _cel(rule: str, message: str, field_path: str | None = None) -> Obj:
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _cel_list(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _free(description: str) -> Obj:
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": description}


def _string_map(kind: str, owned: tuple[str, ...]) -> Obj:
    return {
        "type": "object",
        "description": f"Pod {kind}, added to pdwarden's.",
        "maxProperties": 64,
        "additionalProperties": {"type": "string", "description": f"A {kind[:-1]} value."},
        "x-kubernetes-validations": [
            _cel(f"!('{key}' in self)", f"{kind[:-1]} {key} is owned by pdwarden") for key in owned
        ],
    }


def _container_schema(main: str) -> Obj:
    rules = [
        _cel(
            f"self.name != '{main}' || !has(self.{name})",
            f"{name} of container {main} is owned by pdwarden: {why}",
            f".{name}",
        )
        for name, why in OWNED_CONTAINER_FIELDS.items()
    ]
    rules.append(
        _cel(
            f"self.name != '{main}' || !has(self.env) || "
            f"self.env.all(e, !(e.name in {_cel_list(RESERVED_ENV)}))",
            f"env of container {main}: {', '.join(RESERVED_ENV)} are set by pdwarden",
            ".env",
        )
    )
    rules.append(
        _cel(
            f"self.name == '{main}' || !has(self.volumeMounts) || "
            f"self.volumeMounts.all(m, !(m.name in {_cel_list(MAIN_ONLY_VOLUMES)}))",
            f"volumes {', '.join(MAIN_ONLY_VOLUMES)} are mounted by container {main} alone",
            ".volumeMounts",
        )
    )

    def strings(what: str) -> Obj:
        return {"type": "array", "description": what, "items": {"type": "string"}}

    owned = f"Owned by pdwarden in container {main}."
    props: Obj = {
        "name": {"type": "string", "description": "Container name (the merge key)."},
        "image": {"type": "string", "description": f"Image. {owned}"},
        "command": strings(f"Command. {owned}"),
        "args": strings(f"Arguments. {owned}"),
        "ports": {"type": "array", "description": f"Ports. {owned}", "items": _free("A port.")},
        "resources": _free(f"Resources. {owned}"),
        "env": {
            "type": "array",
            "description": "Environment, merged by name.",
            "maxItems": MAX_ENV,
            "items": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "required": ["name"],
                "properties": {"name": {"type": "string", "description": "Variable name (the merge key)."}},
            },
        },
    }
    props["volumeMounts"] = {
        "type": "array",
        "description": "Volume mounts, appended to pdwarden's.",
        "maxItems": MAX_VOLUME_MOUNTS,
        "items": {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"name": {"type": "string", "description": "The volume's name."}},
        },
    }
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        props[probe] = _free(f"A probe. {owned}")
    return {
        "type": "object",
        "description": "A container, merged by name.",
        "x-kubernetes-preserve-unknown-fields": True,
        "required": ["name"],
        "properties": props,
        "x-kubernetes-validations": rules,
    }


def schema(main: str) -> Obj:
    """The fragment's structural schema: free-form except where an owned field must be seen.

    The fields named here are the ones the CEL rules read (CEL cannot see fields that are
    only preserved as unknown); everything else is kept as written and checked by the
    server-side dry-run of the rendered child.
    """
    pod_rules = [
        _cel(f"!has(self.{name})", f"{name} is owned by pdwarden: {why}", f".{name}")
        for name, why in OWNED_POD_FIELDS[main].items()
    ]
    volume_rule = _cel(
        f"!(self.name in {_cel_list(OWNED_VOLUMES)})",
        f"volumes {', '.join(OWNED_VOLUMES)} are mounted by pdwarden",
        ".name",
    )
    pod_props: Obj = {
        "containers": {
            "type": "array",
            "maxItems": MAX_CONTAINERS,
            "description": "Merged by name: the container named "
            f"{main} is pdwarden's (its command, args, image, ports, probes and resources are "
            "owned); other names add sidecars.",
            "items": _container_schema(main),
        },
        "volumes": {
            "type": "array",
            "maxItems": MAX_VOLUMES,
            "description": "Merged by name.",
            "items": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "required": ["name"],
                "properties": {"name": {"type": "string", "description": "Volume name (the merge key)."}},
                "x-kubernetes-validations": [volume_rule],
            },
        },
    }
    for name, why in OWNED_POD_FIELDS[main].items():
        kind = "string" if name == "serviceAccountName" else "boolean"
        pod_props[name] = {"type": kind, "description": f"Owned by pdwarden: {why}."}
    return {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": (
            "A PodTemplateSpec fragment (metadata and spec) merged into the rendered pod with "
            "strategic-merge semantics: maps merge key by key (null removes a key); containers, "
            "initContainers, volumes and env merge by name, topologySpreadConstraints by "
            "topologyKey; tolerations, volumeMounts and imagePullSecrets are appended; any "
            f"other list replaces the rendered one. The main container is named {main}. Fields "
            "pdwarden owns (the main container's command, args, image, ports, probes and "
            "resources, the selector labels, hostNetwork and pdwarden's volumes) are refused. "
            "A fragment the API server would reject is reported in status (Degraded, "
            "ApplyFailed) and nothing is applied."
        ),
        "properties": {
            "metadata": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "description": "Pod labels and annotations, added to pdwarden's.",
                "properties": {
                    "labels": _string_map("labels", OWNED_LABELS),
                    "annotations": _string_map("annotations", OWNED_ANNOTATIONS),
                },
            },
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "description": "A PodSpec fragment: tolerations, nodeSelector, affinity, "
                "priorityClassName, imagePullSecrets, volumes, securityContext, sidecars, ...",
                "properties": pod_props,
                "x-kubernetes-validations": pod_rules,
            },
        },
    }
