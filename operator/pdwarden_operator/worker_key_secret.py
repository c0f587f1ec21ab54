"""The model's worker key: the Secret that holds it, where its pods find it, and who uses which
key while pods roll. Pure.

The operator may create Secrets but never read one (the chart grants `create` alone), so a
Secret gets a generated name (`<model>-worker-key-<random>`, `<model>-worker-key-r<N>-<random>`
for the model's N-th rotation: it can never take over another's object) and the operator learns
which ones the model uses from its own children, which mount them.

Who uses which key is a `KeyUse`, read back from the workloads' templates (`observed`). Pods of
two neighbouring uses always understand each other, so the operator moves one step at a time
(`step`), and only once every workload runs its current template (`rolled_out`):

- switch on: the router presents the key; the workers require it, sign with it, and still take
  side-channel messages without a proof (lenient); then they require proofs;
- switch off: the workers turn lenient; then drop the key (a proof they get is ignored); then
  the router stops presenting it;
- rotate (`spec.workerKey.rotation` raised): the workers accept the new key beside the old; the
  router presents the new; the workers sign with the new, still accepting the old; then the new
  alone.

A new model's pods start with the final use at once; a key whose Secret is gone is replaced
everywhere at once (pods could not start on it).
"""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import pdwarden_contract as contract
from pdwarden_operator import podtemplate
from pdwarden_operator.render.kinds import POD_MAKING_KINDS

Obj = dict[str, Any]

# The file the runtime's and the router's --worker-key-file read.
KEY_FILE: Final = f"{contract.WORKER_KEY_DIR}/{contract.WORKER_KEY_SECRET_KEY}"
# While the key rotates: the other key a worker accepts (--worker-key-accept-file).
ACCEPT_KEY_FILE: Final = f"{contract.WORKER_KEY_ACCEPT_DIR}/{contract.WORKER_KEY_SECRET_KEY}"
# 32 random bytes, URL-safe: 43 characters.
KEY_BYTES: Final = 32
# The children that run the model's pods (and so mount the key).
WORKLOAD_KINDS: Final = tuple(sorted(POD_MAKING_KINDS))  # the kinds whose pods mount the key


def generate_name(model: str, rotation: int = 0) -> str:
    """The Secret's generateName for the model's `rotation`-th key (0: the first one)."""
    base = f"{model}-{contract.WORKER_KEY_SECRET_INFIX}-"
    return base if rotation == 0 else f"{base}r{rotation}-"


# What the API server appends to a generateName: five of [bcdfghjklmnpqrstvwxz2456789].
_ROTATION_SUFFIX: Final = re.compile(r"r([0-9]+)-[a-z0-9]{5}")


def rotation_of(name: str, model: str) -> int | None:
    """The rotation a Secret of the model's was made for (None: not a name of the model's)."""
    base = generate_name(model)
    if not name.startswith(base):
        return None
    matched = _ROTATION_SUFFIX.fullmatch(name[len(base) :])
    return int(matched.group(1)) if matched else 0


def pending(model: str) -> str:
    """The placeholder name of a Secret not created yet: the children are rendered and dry-run
    over it, and `render.worker_key.bind_created_key` puts the created Secret's name in its
    place (never a generated name: those end in five characters)."""
    return f"{generate_name(model)}pending"


def new_key() -> str:
    return secrets.token_urlsafe(KEY_BYTES)


def secret(metadata: Obj, key: str) -> Obj:
    """The Secret to create (`metadata`: the model's child metadata, its name left to the API
    server). Immutable: a new key is a new Secret, which pods move onto step by step."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "immutable": True,
        "data": {contract.WORKER_KEY_SECRET_KEY: base64.b64encode(key.encode()).decode()},
    }


def volume(secret_name: str, accepted: bool = False) -> tuple[Obj, Obj]:
    """(volume, volumeMount) of a key in a pod (`accepted`: the other key a worker accepts
    while the key rotates): one file, read-only to the pod's fsGroup."""
    name = podtemplate.WORKER_KEY_ACCEPT_VOLUME if accepted else podtemplate.WORKER_KEY_VOLUME
    path = contract.WORKER_KEY_ACCEPT_DIR if accepted else contract.WORKER_KEY_DIR
    items = [{"key": contract.WORKER_KEY_SECRET_KEY, "path": contract.WORKER_KEY_SECRET_KEY}]
    vol = {"name": name, "secret": {"secretName": secret_name, "items": items, "defaultMode": 0o440}}
    return vol, {"name": name, "mountPath": path, "readOnly": True}


def mounted_by(pod_spec: Mapping[str, Any], model: str, accepted: bool = False) -> str | None:
    """The Secret with the model's generated name that a pod spec mounts the key (`accepted`:
    the other accepted key) from, if any."""
    wanted = podtemplate.WORKER_KEY_ACCEPT_VOLUME if accepted else podtemplate.WORKER_KEY_VOLUME
    for vol in pod_spec.get("volumes") or []:
        if vol.get("name") != wanted:
            continue
        name = (vol.get("secret") or {}).get("secretName")
        if isinstance(name, str) and name.startswith(generate_name(model)):
            return name
    return None


@dataclass(frozen=True)
class KeyUse:
    """Who uses which of the model's keys (Secret names; None: none). The router presents
    `router`; the workers require and sign with `sign`, accept `accept` too (a rotation), and
    take side-channel messages without a proof while `lenient` (a switch on or off)."""

    router: str | None = None
    sign: str | None = None
    accept: str | None = None
    lenient: bool = False

    @classmethod
    def final(cls, secret: str | None) -> KeyUse:
        """Everyone on `secret` (None: no key anywhere), nothing in between."""
        return cls(router=secret, sign=secret)

    @property
    def other_accepted(self) -> str | None:
        """The second key the workers accept (a rotation's), when they use one at all."""
        return self.accept if self.sign is not None and self.accept != self.sign else None

    @property
    def secrets(self) -> frozenset[str]:
        return frozenset(n for n in (self.router, self.sign, self.accept) if n is not None)

    def renamed(self, old: str, new: str) -> KeyUse:
        """`old` (the stand-in name) replaced by `new` (the created Secret's) wherever used."""

        def swap(name: str | None) -> str | None:
            return new if name == old else name

        return replace(self, router=swap(self.router), sign=swap(self.sign), accept=swap(self.accept))


def step(current: KeyUse, target: str | None) -> KeyUse:
    """The next use on the way from `current` to everyone on `target` (None: no key); the
    same use once there. Pods of `current` and of the result always understand each other:
    the router's key is one every worker of both accepts, and a worker of either takes what a
    worker of the other sends on the side channel."""
    c = current
    if target is None:
        if c.sign is not None and not c.lenient:
            return replace(c, lenient=True)  # still accepting what the router presents
        if c.sign is not None:
            return KeyUse(router=c.router)  # the workers drop the key; the router still presents
        return KeyUse()
    if c.sign is None:  # switch on
        if c.router != target:
            return KeyUse(router=target)
        return KeyUse(router=target, sign=target, lenient=True)
    if c.sign != target:  # rotate from c.sign to target
        if c.accept != target:
            return replace(c, accept=target)
        if c.router != target:
            return replace(c, router=target)
        return replace(c, sign=target, accept=c.sign)
    if c.router != target:  # signing with the target already: the router follows
        return replace(c, router=target)
    # every worker signs with the target: the old key and messages without a proof can go
    return KeyUse.final(target)


def _role(child: Mapping[str, Any]) -> str | None:
    role = ((child.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ROLE)
    return role if isinstance(role, str) else None


def _template_spec(child: Mapping[str, Any]) -> Mapping[str, Any]:
    return (((child.get("spec") or {}).get("template") or {}).get("spec")) or {}


def _is_lenient(pod_spec: Mapping[str, Any]) -> bool:
    return any(
        contract.ServeFlag.SIDE_CHANNEL_LENIENT in (container.get("command") or [])
        for container in pod_spec.get("containers") or []
    )


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


@dataclass(frozen=True)
class ObservedKeyUses:
    """The key uses the model's workloads' templates show (one, or two while an apply was cut
    short between them; none for a model without workloads), and whether every pod runs its
    workload's template."""

    uses: tuple[KeyUse, ...]
    rolled_out: bool

    @property
    def settled(self) -> bool:
        return len(self.uses) <= 1 and self.rolled_out

    def latest(self, target: str | None) -> KeyUse | None:
        """The use the workers are moving to (of two: the one a step toward `target` leads to)."""
        if not self.uses:
            return None
        later = self.uses[0]
        for use in self.uses[1:]:
            if step(later, target) == use:
                later = use
        return later


def observed(children: Iterable[Mapping[str, Any]], model: str) -> ObservedKeyUses:
    """What the model's Deployments and StatefulSets show now."""
    workloads = [c for c in children if c.get("kind") in WORKLOAD_KINDS]
    if not workloads:
        return ObservedKeyUses((), True)
    routers = [w for w in workloads if _role(w) == contract.ROLE_ROUTER]
    runtime = [w for w in workloads if _role(w) in contract.RUNTIME_ROLES]
    router = next((n for r in routers if (n := mounted_by(_template_spec(r), model))), None)
    uses: list[KeyUse] = []
    for w in runtime:
        pod = _template_spec(w)
        sign = mounted_by(pod, model)
        accept = mounted_by(pod, model, accepted=True)
        use = KeyUse(router, sign, accept, sign is not None and _is_lenient(pod))
        if use not in uses:
            uses.append(use)
    return ObservedKeyUses(tuple(uses) or (KeyUse(router),), all(rolled_out(w) for w in workloads))


def in_use(children: Iterable[Mapping[str, Any]], model: str) -> str | None:
    """The newest of the model's Secrets its workloads mount (by rotation), if any."""
    return _newest_in(observed(children, model), model)


def _reached(current: str | None, model: str, rotation: int) -> bool:
    """Whether `current` is of `rotation` or later (a rotation lowered in the spec asks for nothing)."""
    return current is not None and (rotation_of(current, model) or 0) >= rotation


def _newest_in(seen: ObservedKeyUses, model: str) -> str | None:
    return newest({name for use in seen.uses for name in use.secrets}, model)


def newest(names: Iterable[str], model: str) -> str | None:
    return max(sorted(names), key=lambda name: rotation_of(name, model) or 0, default=None)


def plan_use(
    children: Iterable[Mapping[str, Any]], model: str, enabled: bool, rotation: int = 0
) -> KeyUse | None:
    """Who uses which key this round (None: no one), from the model's children as the watches
    hold them (templates and rollout status): the target is the model's Secret of this
    `rotation` (the stand-in for one to create when none is in use) or none; one step toward
    it once every pod runs the current use."""
    seen = observed(children, model)
    goal: str | None = None
    if enabled:
        current = _newest_in(seen, model)
        done = _reached(current, model, rotation)
        goal = current if done else pending(model)
    latest = seen.latest(goal)
    if latest is None:
        use = KeyUse.final(goal)  # a new model: its pods start on the final use
    elif not seen.settled:
        use = latest  # pods of an earlier use still run: hold
    else:
        use = step(latest, goal)
    return use if use.secrets else None


# The model's key as status reports it (`status.workerKey.state`).
KEY_OFF: Final = "Off"
KEY_ON: Final = "On"
KEY_SWITCHING_ON: Final = "SwitchingOn"
KEY_SWITCHING_OFF: Final = "SwitchingOff"
KEY_ROTATING: Final = "Rotating"


def _describe(use: KeyUse) -> str:
    router = f"the router presents {use.router}" if use.router else "the router presents no key"
    if use.sign is None:
        return f"{router}; the workers require no key"
    also = f", accept {use.accept} too" if use.accept else ""
    lenient = ", take side-channel messages without a proof" if use.lenient else ""
    return f"{router}; the workers use {use.sign}{also}{lenient}"


def progress(children: Iterable[Mapping[str, Any]], model: str, enabled: bool, rotation: int = 0) -> Obj:
    """`status.workerKey`: where the model's key stands (state, the rotation in force, and the
    step its pods are on while it moves)."""
    workloads = [c for c in children if c.get("kind") in WORKLOAD_KINDS]
    seen = observed(workloads, model)
    current = _newest_in(seen, model)
    uses = seen.uses or (KeyUse(),)
    done = _reached(current, model, rotation)
    if not enabled:
        state = KEY_SWITCHING_OFF if current is not None else KEY_OFF
    elif seen.settled and done and uses[0] == KeyUse.final(current):
        state = KEY_ON
    elif current is None or uses[0].sign is None or uses[0].lenient:
        state = KEY_SWITCHING_ON
    else:
        state = KEY_ROTATING
    # Every key, None included: status is written as a JSON merge patch, where a key left out
    # keeps its old value (a finished rotation's message) and None removes it.
    presented = uses[0].router  # the key the model's clients' requests travel with
    out: Obj = {
        "state": state,
        "rotation": None if presented is None else rotation_of(presented, model),
        "message": None,
    }
    if state not in (KEY_ON, KEY_OFF):
        step_now = "; ".join(sorted({_describe(u) for u in uses}))
        wait = "waiting for every pod to run it" if not seen.settled else "the next step is applied next"
        out["message"] = f"{step_now} ({wait})"
    return out
