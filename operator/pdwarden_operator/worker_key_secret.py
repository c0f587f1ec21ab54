"""The model's worker key: the Secret that holds it, where its pods find it, and who uses it
while pods roll. Pure.

The operator may create Secrets but never read one (the chart grants `create` alone), so the
Secret gets a generated name (`<model>-worker-key-<random>`: it can never take over another's
object) and the operator learns which one the model uses from its own children, which mount it.

A worker that requires the key refuses a router that does not present it, so the key is
switched on router first (workers require it only once every router pod presents it) and off
workers first (the router stops presenting it only once no worker pod requires it): a model
that gets the key (an upgrade, `workerKey.enabled` set) or drops it serves without a refusal.
A new model's pods start with it at once.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pdwarden_contract as contract
from pdwarden_operator import podtemplate

Obj = dict[str, Any]

# The file the runtime's and the router's --worker-key-file read.
KEY_FILE: Final = f"{contract.WORKER_KEY_DIR}/{contract.WORKER_KEY_SECRET_KEY}"
# 32 random bytes, URL-safe: 43 characters.
KEY_BYTES: Final = 32
# The children that run the model's pods (and so mount the key).
WORKLOAD_KINDS: Final = ("Deployment", "StatefulSet")


def generate_name(model: str) -> str:
    return f"{model}-{contract.WORKER_KEY_SECRET_INFIX}-"


def pending(model: str) -> str:
    """A stand-in name for the dry-run before the Secret exists (never a generated name: those
    end in five characters)."""
    return f"{generate_name(model)}pending"


def new_key() -> str:
    return secrets.token_urlsafe(KEY_BYTES)


def secret(metadata: Obj, key: str) -> Obj:
    """The Secret to create (`metadata`: the model's child metadata, its name left to the API
    server). Immutable: a new key is a new Secret, which rolls every pod onto it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "immutable": True,
        "data": {contract.WORKER_KEY_SECRET_KEY: base64.b64encode(key.encode()).decode()},
    }


def volume(secret_name: str) -> tuple[Obj, Obj]:
    """(volume, volumeMount) of the key in a pod: one file, read-only to the pod's fsGroup."""
    items = [{"key": contract.WORKER_KEY_SECRET_KEY, "path": contract.WORKER_KEY_SECRET_KEY}]
    vol = {
        "name": podtemplate.WORKER_KEY_VOLUME,
        "secret": {"secretName": secret_name, "items": items, "defaultMode": 0o440},
    }
    mount = {"name": podtemplate.WORKER_KEY_VOLUME, "mountPath": contract.WORKER_KEY_DIR, "readOnly": True}
    return vol, mount


def mounted_by(pod_spec: Mapping[str, Any], model: str) -> str | None:
    """The Secret with the model's generated name that a pod spec mounts the key from, if any."""
    for vol in pod_spec.get("volumes") or []:
        if vol.get("name") != podtemplate.WORKER_KEY_VOLUME:
            continue
        name = (vol.get("secret") or {}).get("secretName")
        if isinstance(name, str) and name.startswith(generate_name(model)):
            return name
    return None


def in_use(children: Iterable[Mapping[str, Any]], model: str) -> str | None:
    """The Secret the model's workloads mount (the router's first, then the workers'), if one
    with the model's generated name does."""
    workloads = [c for c in children if c.get("kind") in WORKLOAD_KINDS]
    workloads.sort(key=lambda c: _role(c) != contract.ROLE_ROUTER)
    for child in workloads:
        name = mounted_by(_template_spec(child), model)
        if name is not None:
            return name
    return None


@dataclass(frozen=True)
class KeyUse:
    """Who uses the model's worker key now: the router presents it, the workers require it."""

    secret: str
    router: bool = True
    workers: bool = True


def _role(child: Mapping[str, Any]) -> str | None:
    role = ((child.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ROLE)
    return role if isinstance(role, str) else None


def _template_spec(child: Mapping[str, Any]) -> Mapping[str, Any]:
    return (((child.get("spec") or {}).get("template") or {}).get("spec")) or {}


def rolled_out(workload: Mapping[str, Any]) -> bool:
    """Whether every pod of a Deployment or StatefulSet runs its current template (no pod of an
    earlier one is left)."""
    meta, spec, status = (
        workload.get("metadata") or {},
        workload.get("spec") or {},
        workload.get("status") or {},
    )
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        return False
    replicas = int(spec.get("replicas", 1))
    counts = (status.get(k) or 0 for k in ("updatedReplicas", "readyReplicas", "replicas"))
    if any(int(n) != replicas for n in counts):
        return False
    current, update = status.get("currentRevision"), status.get("updateRevision")
    return not (workload.get("kind") == "StatefulSet" and current and update and current != update)


def plan_use(children: Iterable[Mapping[str, Any]], model: str, enabled: bool) -> KeyUse | None:
    """Who uses the key this round (None: no one), from the model's children as the watches
    hold them (templates and rollout status)."""
    workloads = [c for c in children if c.get("kind") in WORKLOAD_KINDS]
    routers = [w for w in workloads if _role(w) == contract.ROLE_ROUTER]
    runtime = [w for w in workloads if _role(w) in contract.RUNTIME_ROLES]
    secret = in_use(workloads, model)
    workers_require = any(mounted_by(_template_spec(w), model) is not None for w in runtime)
    if enabled:
        name = secret or pending(model)
        presented = bool(routers) and all(
            mounted_by(_template_spec(r), model) == name and rolled_out(r) for r in routers
        )
        return KeyUse(name, router=True, workers=not runtime or workers_require or presented)
    if secret is None:
        return None
    if workers_require or not all(rolled_out(w) for w in runtime):
        return KeyUse(secret, router=True, workers=False)
    return None
