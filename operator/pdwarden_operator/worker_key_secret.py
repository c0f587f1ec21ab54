"""The model's worker key: the Secret that holds it and where its pods find it. Pure.

The operator may create Secrets but never read one (the chart grants `create` alone), so the
Secret gets a generated name (`<model>-worker-key-<random>`: it can never take over another's
object) and the operator learns which one the model uses from its own children, which mount it.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterable, Mapping
from typing import Any, Final

import pdwarden_contract as contract
from pdwarden_operator import podtemplate

Obj = dict[str, Any]

# The file the runtime's and the router's --worker-key-file read.
KEY_FILE: Final = f"{contract.WORKER_KEY_DIR}/{contract.WORKER_KEY_SECRET_KEY}"
# 32 random bytes, URL-safe: 43 characters.
KEY_BYTES: Final = 32
_WORKLOAD_KINDS: Final = ("Deployment", "StatefulSet")


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
    workloads = [c for c in children if c.get("kind") in _WORKLOAD_KINDS]
    workloads.sort(key=lambda c: c.get("metadata", {}).get("labels", {}).get(contract.LABEL_ROLE) != "router")
    for child in workloads:
        template = (child.get("spec") or {}).get("template") or {}
        name = mounted_by(template.get("spec") or {}, model)
        if name is not None:
            return name
    return None
