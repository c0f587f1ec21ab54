"""The worker key in the children: which Secret each pod mounts, presents and accepts, and the
Secret that holds a new key (the key's life: worker_key_secret.py)."""

from __future__ import annotations

from typing import Final

import pdwarden_contract as contract
from pdwarden_operator import worker_key_secret
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.render.meta import Obj, Owner, child_metadata

# The worker key's Secret: labelled as a part of the model of its own.
WORKER_KEY_ROLE: Final = contract.WORKER_KEY_SECRET_INFIX


def _key_use(owner: Owner, spec: DisaggregatedModelSpec) -> worker_key_secret.KeyUse | None:
    """Reconcile's plan, or from the spec alone: everyone, under the stand-in name that reconcile
    replaces before anything is applied."""
    if owner.worker_key is not None or not spec.worker_key.enabled:
        return owner.worker_key
    return worker_key_secret.KeyUse.final(worker_key_secret.pending(owner.name))


def router_key(owner: Owner, spec: DisaggregatedModelSpec) -> str | None:
    """The Secret whose key the router presents (None: it presents none)."""
    use = _key_use(owner, spec)
    return use.router if use is not None else None


def workers_key_use(owner: Owner, spec: DisaggregatedModelSpec) -> worker_key_secret.KeyUse:
    """What the prefill and decode pods use: the key they require and sign with, the other one
    they accept, and whether the side channel is lenient (all None/False: no key)."""
    use = _key_use(owner, spec)
    return use if use is not None else worker_key_secret.KeyUse()


def mount_worker_key(
    secret: str | None, volumes: list[Obj], mounts: list[Obj], accepted: bool = False
) -> None:
    """Add a key's volume and mount from `secret` (nothing for None)."""
    if secret is not None:
        volume, mount = worker_key_secret.volume(secret, accepted)
        volumes.append(volume)
        mounts.append(mount)


def worker_key_secret_object(owner: Owner, spec: DisaggregatedModelSpec, key: str) -> Obj:
    """A new Secret for the model's worker key (of its current rotation), named by the API
    server."""
    meta = child_metadata(owner, "", WORKER_KEY_ROLE)
    del meta["name"]
    meta["generateName"] = worker_key_secret.generate_name(owner.name, spec.worker_key.rotation)
    return worker_key_secret.secret(meta, key)
