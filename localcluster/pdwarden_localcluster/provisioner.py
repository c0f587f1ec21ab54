"""Local PersistentVolumes: the `pdwarden-local` StorageClass and its provisioner.

`python -m pdwarden_localcluster.provisioner --server ... --volumes-dir DIR`, a process of the
cluster like the scheduler. The class binds late (WaitForFirstConsumer), as local storage
must: the scheduler picks the node for the first pod using a claim and writes it on the
claim (`volume.kubernetes.io/selected-node`); the provisioner then creates a directory
`DIR/<pv name>` and a `local` PersistentVolume with nodeAffinity to that node, pre-bound to
the claim, and the controller-manager's PV controller binds the two. The pod is then bound
to that node, and every later pod using the claim goes there too. `spec.local.path` is the
directory a kubelet mounts. A Released volume of this provisioner with reclaim policy
Delete loses its directory, then its PersistentVolume.

The builders and decisions are pure; `Provisioner` is the only part that calls the API.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdwarden_localcluster.kubeapi import ApiError, KubeApi
from pdwarden_localcluster.pki import CLIENTS
from pdwarden_operator.kube.credentials import Credentials

JSON = dict[str, Any]
log = logging.getLogger("pdwarden.provisioner")

CLASS_NAME = "pdwarden-local"
PROVISIONER = "pdwarden.io/local"
USER = CLIENTS["provisioner"][0]  # the provisioner's client certificate's name
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
ANN_DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def storage_class() -> JSON:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": CLASS_NAME, "annotations": {ANN_DEFAULT_CLASS: "true"}},
        "provisioner": PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    }


def rbac() -> list[JSON]:
    """What the provisioner may do (applied by `cluster up` with the admin's credentials)."""
    name = "pdwarden:local-provisioner"
    rules = [
        {
            "apiGroups": [""],
            "resources": ["persistentvolumes"],
            "verbs": ["get", "list", "watch", "create", "delete"],
        },
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["storage.k8s.io"],
            "resources": ["storageclasses"],
            "verbs": ["get", "list", "watch", "create"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        },
    ]


def pv_name(claim: JSON) -> str:
    return f"pvc-{claim['metadata']['uid']}"


def node_to_provision(claim: JSON, classes: dict[str, JSON]) -> str | None:
    """The node to create `claim`'s volume on, or None while it is not (yet) this provisioner's."""
    meta, spec = claim.get("metadata") or {}, claim.get("spec") or {}
    if meta.get("deletionTimestamp") or spec.get("volumeName"):
        return None
    if (claim.get("status") or {}).get("phase", "Pending") != "Pending":
        return None
    cls = classes.get(spec.get("storageClassName") or "")
    if cls is None or cls.get("provisioner") != PROVISIONER:
        return None
    node = (meta.get("annotations") or {}).get(ANN_SELECTED_NODE)
    return str(node) if node else None


def persistent_volume(claim: JSON, node: str, volumes_dir: Path, cls: JSON) -> JSON:
    """A `local` volume on `node` for `claim`, pre-bound to it (claimRef with its uid)."""
    meta, spec = claim["metadata"], claim["spec"]
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": pv_name(claim),
            "annotations": {ANN_PROVISIONED_BY: PROVISIONER},
            "labels": {HOSTNAME_LABEL: node},
        },
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "persistentVolumeReclaimPolicy": cls.get("reclaimPolicy") or "Delete",
            "storageClassName": cls["metadata"]["name"],
            "local": {"path": str(volumes_dir / pv_name(claim))},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}
                    ]
                }
            },
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


def to_delete(pv: JSON, volumes_dir: Path) -> Path | None:
    """The directory of a Released volume of this provisioner whose policy is Delete, if any."""
    meta, spec = pv.get("metadata") or {}, pv.get("spec") or {}
    if (meta.get("annotations") or {}).get(ANN_PROVISIONED_BY) != PROVISIONER or meta.get(
        "deletionTimestamp"
    ):
        return None
    if spec.get("persistentVolumeReclaimPolicy") != "Delete":
        return None
    if (pv.get("status") or {}).get("phase") not in ("Released", "Failed"):
        return None
    path = Path(str((spec.get("local") or {}).get("path", "")))
    # only ever a directory this provisioner made: one level under its own root
    return path if path.parent == volumes_dir and path.name == meta.get("name") else None


class Provisioner:
    def __init__(self, api: KubeApi, volumes_dir: Path, stop: threading.Event) -> None:
        self.api, self.volumes_dir, self.stop = api, volumes_dir, stop

    def ensure_class(self) -> None:
        try:
            self.api.post("/apis/storage.k8s.io/v1/storageclasses", storage_class())
        except ApiError as exc:
            if exc.status != 409:
                raise

    def classes(self) -> dict[str, JSON]:
        items = self.api.get("/apis/storage.k8s.io/v1/storageclasses").get("items", [])
        return {c["metadata"]["name"]: c for c in items}

    def provision(self, claim: JSON, classes: dict[str, JSON]) -> None:
        node = node_to_provision(claim, classes)
        if node is None:
            return
        cls = classes[claim["spec"]["storageClassName"]]
        pv = persistent_volume(claim, node, self.volumes_dir, cls)
        path = Path(pv["spec"]["local"]["path"])
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)  # pods of any uid may write, as with a real local-path provisioner
        try:
            self.api.post("/api/v1/persistentvolumes", pv)
        except ApiError as exc:
            if exc.status != 409:  # 409: made on an earlier pass, the PV controller binds it
                raise
            return
        meta = claim["metadata"]
        log.info(
            "provisioned %s on %s for %s/%s at %s",
            pv_name(claim),
            node,
            meta["namespace"],
            meta["name"],
            path,
        )

    def reclaim(self, pv: JSON) -> None:
        path = to_delete(pv, self.volumes_dir)
        if path is None:
            return
        shutil.rmtree(path, ignore_errors=True)
        name = pv["metadata"]["name"]
        try:
            self.api.delete(f"/api/v1/persistentvolumes/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
        log.info("deleted %s and %s", name, path)

    def _list_and_watch(self, what: str, path: str, handler: Callable[[], Callable[[JSON], None]]) -> None:
        """A small informer: list `path` and hand every item to a handler made for this list,
        then watch from the list's version; relist every 30 s and after any error."""
        while not self.stop.is_set():
            try:
                handle = handler()
                listing = self.api.get(path)
                for item in listing.get("items", []):
                    handle(item)
                params = {"resourceVersion": str(listing["metadata"]["resourceVersion"])}
                for etype, obj in self.api.watch(path, params, 30):
                    if self.stop.is_set():
                        return
                    if etype == "ERROR":
                        break
                    if etype in ("ADDED", "MODIFIED"):
                        handle(obj)
            except ApiError as exc:
                log.warning("%s: %s; relisting", what, exc)
                self.stop.wait(1.0)
            except Exception:
                log.exception("%s failed; relisting", what)
                self.stop.wait(1.0)

    def run_claims(self) -> None:
        """Claims: provisioned against the StorageClasses read at each (re)list."""

        def handler() -> Callable[[JSON], None]:
            classes = self.classes()
            return lambda claim: self.provision(claim, classes)

        self._list_and_watch("claims", "/api/v1/persistentvolumeclaims", handler)

    def run_volumes(self) -> None:
        """Volumes: Released ones of this provisioner are deleted."""
        self._list_and_watch("volumes", "/api/v1/persistentvolumes", lambda: self.reclaim)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdwarden-local-provisioner", description=__doc__)
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca-file", required=True, type=Path)
    parser.add_argument("--cert-file", required=True, type=Path)
    parser.add_argument("--key-file", required=True, type=Path)
    parser.add_argument("--volumes-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    api = KubeApi(Credentials(args.server, args.ca_file, args.cert_file, args.key_file))
    volumes_dir = args.volumes_dir.resolve()
    volumes_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    prov = Provisioner(api, volumes_dir, stop)
    while not stop.is_set():
        try:
            prov.ensure_class()
            break
        except ApiError as exc:
            log.warning("creating StorageClass %s: %s; retrying", CLASS_NAME, exc)
            stop.wait(1.0)
    threading.Thread(target=prov.run_claims, name="claims", daemon=True).start()
    threading.Thread(target=prov.run_volumes, name="volumes", daemon=True).start()
    log.info("provisioning %s volumes under %s", CLASS_NAME, volumes_dir)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
