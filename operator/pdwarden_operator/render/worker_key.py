"""The worker key in the children: which Secret each pod mounts, presents and accepts, the
Secret that holds a new key, and the name of one created after the render bound into it (the
key's life: worker_key_secret.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import pdwarden_contract as contract
from pdwarden_operator import podtemplate, worker_key_secret
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.render.meta import Obj, Owner, child_metadata

# The worker key's Secret: labelled as a part of the model of its own.
WORKER_KEY_ROLE: Final = contract.WORKER_KEY_SECRET_INFIX
# The volumes a pod mounts a key from (`worker_key_secret.volume`): where a Secret's name stands.
KEY_VOLUMES: Final = frozenset({podtemplate.WORKER_KEY_VOLUME, podtemplate.WORKER_KEY_ACCEPT_VOLUME})


def _key_use(owner: Owner, spec: DisaggregatedModelSpec) -> worker_key_secret.KeyUse | None:
    """Reconcile's plan, or from the spec alone: everyone, under the placeholder name that
    reconcile binds to the created Secret (`bind_created_key`) before anything is applied."""
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


def bind_created_key(objs: Iterable[Obj], placeholder: str, secret_name: str) -> list[Obj]:
    """`objs` as rendered over `secret_name`, from their render over `placeholder` (the name that
    stands for a Secret not created yet, `worker_key_secret.pending`): the name is put in the key
    volumes that mount the placeholder, nowhere else. Pure: a child it changes is a copy, the
    others come back as they are; a child's digest is stamped anew by `plan.stamped`."""
    return [_bound(obj, placeholder, secret_name) for obj in objs]


def _bound(obj: Obj, placeholder: str, secret_name: str) -> Obj:
    template = (obj.get("spec") or {}).get("template") or {}
    pod = template.get("spec") or {}
    volumes = pod.get("volumes") or []
    if not any(_mounts(volume, placeholder) for volume in volumes):
        return obj
    bound = [
        {**v, "secret": {**v["secret"], "secretName": secret_name}} if _mounts(v, placeholder) else v
        for v in volumes
    ]
    return {**obj, "spec": {**obj["spec"], "template": {**template, "spec": {**pod, "volumes": bound}}}}


def _mounts(volume: Any, placeholder: str) -> bool:
    """Whether `volume` is a key volume that mounts the Secret named `placeholder`."""
    return volume.get("name") in KEY_VOLUMES and (volume.get("secret") or {}).get("secretName") == placeholder
