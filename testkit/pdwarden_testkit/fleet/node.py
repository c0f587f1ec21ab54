"""The fleet's Node: registered and kept Ready (Lease and status, as the local kubelet does),
every pod bound to it marked running with an address of the fleet's pool, and a deleted pod
let go at once (nothing runs to stop). Which address is which pod's, and each pod's role and
mode, is what the metrics server answers by."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import pdwarden_contract as contract
from pdwarden_localcluster.kubeapi import ApiError, KubeApi
from pdwarden_localcluster.kubelet.ipam import IpAllocator
from pdwarden_localcluster.kubelet.node import NodeAgent, NodeShape, seconds_time
from pdwarden_testkit.fleet import placement, pod_status
from pdwarden_testkit.fleet.runtimes import Mode, mode_of

JSON = dict[str, Any]
log = logging.getLogger("pdwarden.fleet")
DEFAULT_NAME: Final = "pdwarden-fleet-0"
WRITERS: Final = 8  # status writes in flight: a Deployment's thousand pods start in seconds
RETRY_WRITE_S: Final = 1.0  # a failed status write is tried again after this


@dataclass(frozen=True)
class FleetPod:
    uid: str
    namespace: str
    name: str
    role: str
    mode: Mode


def node_labels(name: str) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        placement.NODE_LABEL: "true",
    }


class FleetNode:
    def __init__(self, api: KubeApi, pool: str, *, name: str = DEFAULT_NAME, capacity: int = 20000) -> None:
        # room for `capacity` pods of any size the operator renders (a GPU role's 16Gi of /dev/shm)
        shape = NodeShape(
            cpu=str(1000 * capacity),
            memory=f"{64 * capacity}Gi",
            pods=str(capacity),
            ephemeral_storage=f"{64 * capacity}Gi",
            gpus=8 * capacity,
        )
        self.api = api
        self.name = name
        self.agent = NodeAgent(
            api,
            name,
            pod_status.NODE_IP,
            shape,
            labels=node_labels(name),
            spec={"taints": [placement.taint()]},
        )
        self.ips = IpAllocator(pool)
        self._lock = threading.Lock()
        self._by_ip: dict[str, FleetPod] = {}
        self._ip_of: dict[str, str] = {}  # uid -> address
        self._marking: set[str] = set()  # uids whose status write is queued or in flight
        self._stop = threading.Event()
        self._writers = concurrent.futures.ThreadPoolExecutor(WRITERS, thread_name_prefix="fleet-status")

    # --- what the metrics server reads ------------------------------------------------------
    def pod_at(self, ip: str) -> FleetPod | None:
        with self._lock:
            return self._by_ip.get(ip)

    def pods(self) -> int:
        with self._lock:
            return len(self._by_ip)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> FleetNode:
        self.agent.register()
        threading.Thread(
            target=self.agent.heartbeat_forever, args=(self._stop,), name="fleet-heartbeat", daemon=True
        ).start()
        threading.Thread(target=self._watch, name="fleet-pods", daemon=True).start()
        return self

    def stop(self, delete_node: bool = True) -> None:
        """Stop; with `delete_node`, the Node goes (the pod garbage collector then removes
        any pod still bound to it)."""
        self._stop.set()
        self._writers.shutdown(wait=True, cancel_futures=True)
        if delete_node:
            try:
                self.api.delete(f"/api/v1/nodes/{self.name}")
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("deleting node %s: %s", self.name, exc)

    def _watch(self) -> None:
        """List the node's pods once, then watch from there, each watch resuming where the last
        one ended (its events' and bookmarks' resourceVersion); listed again only after an
        error or a 410. A listing of ten thousand pods every watch timeout held this process
        for seconds (decoding it), and every scrape in flight with it."""
        selector = {"fieldSelector": f"spec.nodeName={self.name}"}
        version: str | None = None  # where the next watch resumes; None: list first
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list(selector)
                for etype, obj in self.api.watch("/api/v1/pods", dict(selector, resourceVersion=version), 30):
                    if self._stop.is_set():
                        return
                    if etype == "ERROR":
                        version = None  # 410 Gone: list again
                        break
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if etype == "DELETED":
                        self._forget(obj["metadata"]["uid"])
                    elif etype in ("ADDED", "MODIFIED"):
                        self._seen(obj)
            except ApiError as exc:
                log.warning("node %s pod watch: %s; listing again", self.name, exc)
                version = None
                self._stop.wait(1.0)
            except Exception:
                log.exception("node %s pod watch failed; listing again", self.name)
                version = None
                self._stop.wait(1.0)

    def _list(self, selector: dict[str, str]) -> str:
        """Every pod bound to the node, each seen and any other forgotten; the listing's
        resourceVersion."""
        listing = self.api.get("/api/v1/pods", params=selector)
        items = listing.get("items", [])
        self._forget_missing({p["metadata"]["uid"] for p in items})
        for pod in items:
            self._seen(pod)
        return str(listing["metadata"]["resourceVersion"])

    def _seen(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if meta.get("deletionTimestamp"):
            self._forget(uid)
            self._submit(self._finish_deletion, dict(pod))
            return
        labels = meta.get("labels") or {}
        role = labels.get(contract.LABEL_ROLE, "")
        status = pod.get("status") or {}
        with self._lock:
            known = self._ip_of.get(uid)
            ours = known is not None and status.get("podIP") == known and status.get("phase") == "Running"
            marking = uid in self._marking
        if known is not None and (ours or marking):
            # a label or annotation change (the mode may have moved), or an event that came
            # before our status write landed: nothing to write again
            self._record(pod, uid, known, role)
            return
        ip = self.ips.allocate(uid, status.get("podIP"))
        self._record(pod, uid, ip, role)
        with self._lock:
            self._marking.add(uid)
        self._submit(self._mark_running, dict(pod), ip)

    def _record(self, pod: Mapping[str, Any], uid: str, ip: str, role: str) -> None:
        meta = pod.get("metadata") or {}
        entry = FleetPod(
            uid, str(meta.get("namespace")), str(meta.get("name")), role, mode_of(meta.get("annotations"))
        )
        with self._lock:
            self._ip_of[uid] = ip
            self._by_ip[ip] = entry

    def _forget(self, uid: str) -> None:
        with self._lock:
            ip = self._ip_of.pop(uid, None)
            if ip is not None and (entry := self._by_ip.get(ip)) is not None and entry.uid == uid:
                del self._by_ip[ip]
        self.ips.release(uid)

    def _forget_missing(self, present: set[str]) -> None:
        with self._lock:
            gone = [uid for uid in self._ip_of if uid not in present]
        for uid in gone:
            self._forget(uid)

    def _submit(self, fn: Any, *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # stopping: the executor takes no more work
            self._writers.submit(self._logged, fn, *args)

    def _logged(self, fn: Any, *args: Any) -> None:
        """`fn`, a write about one pod; tried again after a transient failure (the watch
        resumes rather than lists, so no listing would). A pod gone (404) or replaced by
        another of its name (409) needs none."""
        try:
            fn(*args)
        except ApiError as exc:
            if exc.status in (404, 409):
                return
            transient = exc.status in (0, 429) or exc.status >= 500
            log.warning("%s: %s%s", fn.__name__, exc, f"; again in {RETRY_WRITE_S:g}s" if transient else "")
            if transient and not self._stop.wait(RETRY_WRITE_S):
                self._submit(fn, *args)
        except Exception:
            log.exception("%s failed", fn.__name__)

    def _mark_running(self, pod: JSON, ip: str) -> None:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{quote(meta['name'])}/status"
        try:
            self.api.merge_patch(
                path,
                {"metadata": {"uid": meta["uid"]}, "status": pod_status.running(pod, ip, seconds_time())},
            )
        finally:
            with self._lock:
                self._marking.discard(meta["uid"])

    def _finish_deletion(self, pod: JSON) -> None:
        meta = pod["metadata"]
        self.api.delete(
            f"/api/v1/namespaces/{meta['namespace']}/pods/{quote(meta['name'])}",
            {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
        )
