"""The demo's only door to the cluster: the Kubernetes API (python client) and helm.

Everything the demo reads or changes in the cluster goes through `DemoCluster`, so the
rest of the demo is about what happened, not how to ask.
"""

from __future__ import annotations

import base64
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pdwarden_contract as contract
from pdwarden_demo import chart
from pdwarden_localcluster.kubeapi import ApiError, KubeApi
from pdwarden_localcluster.waits import WaitTimeout, wait_for
from pdwarden_operator import worker_key_secret

Obj = dict[str, Any]


class DemoError(RuntimeError):
    """A step of the demo could not be done; the message says which and why."""


class DemoCluster:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.api = KubeApi.from_kubeconfig(kubeconfig)

    # --- helm ----------------------------------------------------------------------------

    def helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        proc = subprocess.run(
            [chart.find_tool("helm"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
        return proc

    def helm_install(self, release: str, namespace: str, values: Mapping[str, str]) -> None:
        proc = self.helm(
            "upgrade",
            "--install",
            release,
            str(chart.CHART_DIR),
            "--namespace",
            namespace,
            "--create-namespace",
            "--wait",
            "--timeout",
            "180s",
            *chart.helm_value_args(values),
            timeout=240,
        )
        if proc.returncode != 0:
            raise DemoError(f"helm install {release} failed: {(proc.stderr or proc.stdout).strip()[-1500:]}")

    def helm_uninstall(self, release: str, namespace: str) -> None:
        proc = self.helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s")
        if proc.returncode != 0 and "not found" not in proc.stderr:
            raise DemoError(f"helm uninstall {release} failed: {proc.stderr.strip()[-800:]}")

    # --- namespaces and the model ----------------------------------------------------------

    def ensure_namespace(self, name: str) -> None:
        body = {"metadata": {"name": name, "labels": {"pdwarden.io/demo": "true"}}}
        try:
            self.api.post("/api/v1/namespaces", body)
        except ApiError as exc:
            if exc.status != 409:
                raise DemoError(f"cannot create namespace {name}: {exc.message}") from exc

    def delete_namespace(self, name: str, wait_s: float = 60) -> bool:
        try:
            self.api.delete(f"/api/v1/namespaces/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return True
            raise DemoError(f"cannot delete namespace {name}: {exc.message}") from exc
        try:
            path = f"/api/v1/namespaces/{name}"
            wait_for(lambda: self.api.get_or_none(path) is None, wait_s, f"namespace {name} to go", 1.0)
        except WaitTimeout:
            return False
        return True

    def create_model(self, manifest: Obj) -> None:
        ns = manifest["metadata"]["namespace"]
        try:
            self.api.post(_models_path(ns), manifest)
        except ApiError as exc:
            raise DemoError(f"the API refused the DisaggregatedModel: {exc.status} {exc.message}") from exc

    def get_model(self, namespace: str, name: str) -> Obj | None:
        return self.api.get_or_none(f"{_models_path(namespace)}/{name}")

    def delete_model(self, namespace: str, name: str) -> None:
        try:
            self.api.delete(f"{_models_path(namespace)}/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise

    # --- pods and events -----------------------------------------------------------------

    def pods(self, namespace: str, selector: str) -> list[Obj]:
        return self._items(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": selector})

    def cluster_ip(self, namespace: str, service: str) -> str | None:
        """The ClusterIP of a Service (None while it does not exist or has none)."""
        svc = self.api.get_or_none(f"/api/v1/namespaces/{namespace}/services/{service}")
        ip = str((svc or {}).get("spec", {}).get("clusterIP") or "")
        return ip if ip and ip != "None" else None

    def events(self, namespace: str, involved_name: str | None = None) -> list[Obj]:
        params = {"fieldSelector": f"involvedObject.name={involved_name}"} if involved_name else None
        return self._items(f"/api/v1/namespaces/{namespace}/events", params)

    def deployments(self, namespace: str, selector: str) -> list[Obj]:
        return self._items(f"/apis/apps/v1/namespaces/{namespace}/deployments", {"labelSelector": selector})

    def _items(self, path: str, params: dict[str, str] | None) -> list[Obj]:
        items: list[Obj] = self.api.get(path, params).get("items") or []
        return items

    def worker_key(self, pod: Obj) -> str | None:
        """The model's worker key that `pod` requires (None: it requires none), read from the
        Secret it mounts: the demo stands where only the model's router stands."""
        model = pod["metadata"].get("labels", {}).get(contract.LABEL_MODEL, "")
        name = worker_key_secret.mounted_by(pod.get("spec") or {}, model)
        if name is None:
            return None
        secret = self.api.get(f"/api/v1/namespaces/{pod['metadata']['namespace']}/secrets/{name}")
        data = (secret.get("data") or {}).get(contract.WORKER_KEY_SECRET_KEY)
        if data is None:
            raise DemoError(f"the worker key's Secret {name} has no {contract.WORKER_KEY_SECRET_KEY!r}")
        return base64.b64decode(data).decode().strip()


def _models_path(namespace: str) -> str:
    return f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{namespace}/{contract.PLURAL}"


def pod_ip(pod: Obj) -> str | None:
    ip: str | None = pod.get("status", {}).get("podIP")
    return ip


def selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def names(objs: Sequence[Obj]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)
