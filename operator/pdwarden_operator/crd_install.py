"""Put this operator's CRD on the cluster: `pdwarden crd --apply`.

Helm installs a chart's `crds/` on the first install only and never upgrades them, so after
`helm upgrade` the cluster would keep the old schema. The chart's pre-upgrade hook
(charts/pdwarden/templates/crd-upgrade.yaml) runs this in the operator's image before the
new operator starts: the CRD the operator validates against is the one the API server serves.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final, Literal

from pdwarden_operator.crd import CRD_NAME, build_crd
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeApiError, KubeClient

CRD_API: Final = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
Change = Literal["created", "updated", "unchanged"]


class CrdNotServed(Exception):
    """The API server took the CRD but does not serve it (names refused, or not in time)."""


@dataclass(frozen=True)
class Applied:
    name: str
    change: Change
    served: tuple[str, ...]  # versions the CRD serves now
    stored: tuple[str, ...]  # status.storedVersions: versions objects may still be stored in

    def summary(self) -> str:
        return (
            f"customresourcedefinition/{self.name} {self.change} (served: {', '.join(self.served)}; "
            f"stored: {', '.join(self.stored) or '-'})"
        )


def _conditions(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = (crd.get("status") or {}).get("conditions") or []
    return {str(c.get("type")): c for c in found if isinstance(c, dict)}


def served_versions(crd: dict[str, Any]) -> tuple[str, ...] | None:
    """The served versions once the CRD is Established with its names accepted; None before."""
    conds = _conditions(crd)
    names = conds.get("NamesAccepted") or {}
    if names.get("status") == "False":
        raise CrdNotServed(f"{CRD_NAME}: names not accepted: {names.get('message')}")
    if names.get("status") != "True" or (conds.get("Established") or {}).get("status") != "True":
        return None
    return tuple(v["name"] for v in crd["spec"]["versions"] if v.get("served"))


def _desired(before: dict[str, Any] | None) -> dict[str, Any]:
    """The CRD to write: ours, on top of what is there (its resourceVersion, others' labels and
    annotations). The spec is ours whole: a replace drops what a previous version had that
    this one has not, which an apply would leave where Helm's install created it."""
    crd = build_crd()
    if before is None:
        return crd
    meta = before["metadata"]
    crd["metadata"] = {
        "name": CRD_NAME,
        "resourceVersion": meta["resourceVersion"],
        "labels": {**(meta.get("labels") or {}), **crd["metadata"]["labels"]},
        **({"annotations": meta["annotations"]} if meta.get("annotations") else {}),
    }
    return crd


async def apply_crd(client: KubeClient, timeout: float = 60.0, poll: float = 0.5) -> Applied:
    """Write the CRD generated from this package's models (create, or replace what is there),
    then wait until the API server serves it. Raises KubeApiError (a refusal: the RBAC, a
    stored version dropped) or CrdNotServed."""
    for attempt in range(3):
        before = await kube_apply.get(client, *CRD_API, None, CRD_NAME)
        try:
            if before is None:
                crd = await kube_apply.create(client, _desired(None))
            else:
                crd = await kube_apply.replace(client, _desired(before))
            break
        except KubeApiError as exc:
            if exc.status != 409 or attempt == 2:  # 409: changed (or created) since read: again
                raise
    if before is None:
        change: Change = "created"
    elif before.get("spec") == crd.get("spec"):  # as the API server stores them, defaults filled in
        change = "unchanged"
    else:
        change = "updated"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (served := served_versions(crd)) is None:
        if loop.time() >= deadline:
            raise CrdNotServed(f"{CRD_NAME}: not Established within {timeout:g}s: {_conditions(crd)}")
        await asyncio.sleep(poll)
        crd = await kube_apply.get(client, *CRD_API, None, CRD_NAME) or crd
    stored = tuple((crd.get("status") or {}).get("storedVersions") or ())
    return Applied(CRD_NAME, change, served, stored)
