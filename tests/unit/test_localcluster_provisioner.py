"""The local volume provisioner's decisions and objects (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pdwarden_localcluster import provisioner as prov

pytestmark = pytest.mark.unit

ROOT = Path("/state/volumes")
CLASSES = {
    prov.CLASS_NAME: prov.storage_class(),
    "other": {"metadata": {"name": "other"}, "provisioner": "example.com/nfs"},
}


def claim(**over: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": "data",
            "namespace": "ns",
            "uid": "1234",
            "annotations": {prov.ANN_SELECTED_NODE: "pdwarden-node-1"},
        },
        "spec": {
            "storageClassName": prov.CLASS_NAME,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "2Gi"}},
        },
        "status": {"phase": "Pending"},
    }
    for key, value in over.items():
        obj[key] = {**obj[key], **value}
    return obj


def test_the_class_binds_late_deletes_on_release_and_is_the_default() -> None:
    cls = prov.storage_class()
    assert cls["volumeBindingMode"] == "WaitForFirstConsumer"
    assert cls["reclaimPolicy"] == "Delete"
    assert cls["metadata"]["annotations"][prov.ANN_DEFAULT_CLASS] == "true"


def test_a_claim_is_provisioned_only_once_a_node_is_selected_for_it() -> None:
    assert prov.node_to_provision(claim(), CLASSES) == "pdwarden-node-1"
    assert prov.node_to_provision(claim(metadata={"annotations": {}}), CLASSES) is None, "no node yet"
    assert prov.node_to_provision(claim(spec={"storageClassName": "other"}), CLASSES) is None
    assert prov.node_to_provision(claim(spec={"storageClassName": "missing"}), CLASSES) is None
    assert prov.node_to_provision(claim(spec={"volumeName": "pv-1"}), CLASSES) is None, "bound already"
    assert prov.node_to_provision(claim(status={"phase": "Bound"}), CLASSES) is None
    assert prov.node_to_provision(claim(metadata={"deletionTimestamp": "x"}), CLASSES) is None


def test_the_volume_is_a_local_directory_on_the_selected_node_pre_bound_to_the_claim() -> None:
    pv = prov.persistent_volume(claim(), "pdwarden-node-1", ROOT, prov.storage_class())
    spec = pv["spec"]
    assert pv["metadata"]["name"] == "pvc-1234"
    assert spec["local"] == {"path": "/state/volumes/pvc-1234"}
    [term] = spec["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["pdwarden-node-1"]}
    ]
    assert spec["claimRef"] | {} == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "ns",
        "name": "data",
        "uid": "1234",
    }
    assert spec["capacity"] == {"storage": "2Gi"} and spec["accessModes"] == ["ReadWriteOnce"]
    assert spec["storageClassName"] == prov.CLASS_NAME
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert pv["metadata"]["annotations"][prov.ANN_PROVISIONED_BY] == prov.PROVISIONER


def _pv(
    phase: str, policy: str = "Delete", by: str = prov.PROVISIONER, path: str = "/state/volumes/pvc-1"
) -> Any:
    return {
        "metadata": {"name": "pvc-1", "annotations": {prov.ANN_PROVISIONED_BY: by}},
        "spec": {"persistentVolumeReclaimPolicy": policy, "local": {"path": path}},
        "status": {"phase": phase},
    }


def test_only_a_released_volume_of_its_own_with_policy_delete_is_deleted() -> None:
    assert prov.to_delete(_pv("Released"), ROOT) == ROOT / "pvc-1"
    assert prov.to_delete(_pv("Bound"), ROOT) is None
    deleting = _pv("Released")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert prov.to_delete(deleting, ROOT) is None, "deleted already (its finalizer not yet removed)"
    assert prov.to_delete(_pv("Released", policy="Retain"), ROOT) is None
    assert prov.to_delete(_pv("Released", by="example.com/nfs"), ROOT) is None
    # never a directory outside its own root, whatever the object says
    assert prov.to_delete(_pv("Released", path="/etc"), ROOT) is None
    assert prov.to_delete(_pv("Released", path="/state/volumes/../pvc-1"), ROOT) is None


def test_its_role_covers_what_it_does_and_no_more() -> None:
    role, binding = prov.rbac()
    verbs = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert ("persistentvolumes", "create") in verbs and ("persistentvolumes", "delete") in verbs
    assert ("persistentvolumeclaims", "update") not in verbs and ("secrets", "get") not in verbs
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": prov.USER}
    ]
