"""Who the children belong to and how they are named and labelled: the owner, names,
labels, metadata, the model's served name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pdwarden_contract as contract
from pdwarden_operator import podpolicy, worker_key_secret
from pdwarden_operator.models import DisaggregatedModelSpec

Obj = dict[str, Any]

APP_NAME = "pdwarden"


@dataclass(frozen=True)
class Owner:
    """What the children need to know about their DisaggregatedModel besides its spec."""

    name: str
    namespace: str
    uid: str
    annotations: dict[str, str] = field(default_factory=dict)
    # Who uses the model's worker key now (observed: reconcile plans it; None: from the spec).
    worker_key: worker_key_secret.KeyUse | None = None
    # Autoscaled roles' counts as their Deployments hold them (observed; absent: none yet).
    deployed: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Any) -> Owner:
        meta = body["metadata"]
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            annotations=dict(meta.get("annotations") or {}),
        )

    @property
    def allow_fault_injection(self) -> bool:
        return podpolicy.fault_injection_asked(self.annotations)

    def owner_reference(self) -> Obj:
        return {
            "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
            "kind": contract.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def child_name(model: str, role: str) -> str:
    return f"{model}-{role}"


def selector_labels(model: str, role: str) -> dict[str, str]:
    """The immutable Deployment selector; also what the router's discovery matches."""
    return {contract.LABEL_MODEL: model, contract.LABEL_ROLE: role}


def role_of(obj: Mapping[str, Any]) -> str | None:
    """The role a child's labels name (None: a child of no one role)."""
    role: str | None = ((obj.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ROLE)
    return role


def labels(model: str, role: str) -> dict[str, str]:
    return {
        **selector_labels(model, role),
        contract.LABEL_APP_NAME: APP_NAME,
        contract.LABEL_APP_INSTANCE: model,
        contract.LABEL_APP_COMPONENT: role,
        contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
    }


def child_metadata(owner: Owner, name: str, role: str) -> Obj:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner.name, role),
        "ownerReferences": [owner.owner_reference()],
    }


def served_name(owner: Owner, spec: DisaggregatedModelSpec) -> str:
    return spec.model.served_name or owner.name
