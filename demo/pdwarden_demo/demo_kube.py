"""The demo's only door to the cluster: the Kubernetes API (python client) and helm.

Everything the demo reads or changes in the cluster goes through `DemoCluster`, so the
rest of the demo is about what happened, not how to ask.
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
from kubernetes.client.exceptions import ApiException

import pdwarden_contract as contract
from pdwarden_demo import chart
from pdwarden_operator import worker_key_secret

Obj = dict[str, Any]


class DemoError(RuntimeError):
    """A step of the demo could not be done; the message says which and why."""


class DemoCluster:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self._api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        self.core = kubernetes.client.CoreV1Api(self._api)
        self.custom = kubernetes.client.CustomObjectsApi(self._api)
        self.apps = kubernetes.client.AppsV1Api(self._api)

    def close(self) -> None:
        self._api.close()

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
        try:
            self.core.create_namespace({"metadata": {"name": name, "labels": {"pdwarden.io/demo": "true"}}})
        except ApiException as exc:
            if exc.status != 409:
                raise DemoError(f"cannot create namespace {name}: {exc.reason}") from exc

    def delete_namespace(self, name: str, wait_s: float = 60) -> bool:
        try:
            self.core.delete_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise DemoError(f"cannot delete namespace {name}: {exc.reason}") from exc
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                self.core.read_namespace(name)
            except ApiException as exc:
                if exc.status == 404:
                    return True
            time.sleep(1)
        return False

    def create_model(self, manifest: Obj) -> None:
        ns = manifest["metadata"]["namespace"]
        try:
            self.custom.create_namespaced_custom_object(
                contract.API_GROUP, contract.API_VERSION, ns, contract.PLURAL, manifest
            )
        except ApiException as exc:
            raise DemoError(f"the API refused the DisaggregatedModel: {exc.status} {exc.body}") from exc

    def get_model(self, namespace: str, name: str) -> Obj | None:
        try:
            obj: Obj = self.custom.get_namespaced_custom_object(
                contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def delete_model(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    # --- pods and events -----------------------------------------------------------------

    def pods(self, namespace: str, selector: str) -> list[Obj]:
        listing = self._api.sanitize_for_serialization(
            self.core.list_namespaced_pod(namespace, label_selector=selector)
        )
        items: list[Obj] = listing.get("items", [])
        return items

    def cluster_ip(self, namespace: str, service: str) -> str | None:
        """The ClusterIP of a Service (None while it does not exist or has none)."""
        try:
            svc = self.core.read_namespaced_service(service, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        ip = svc.spec.cluster_ip if svc.spec else None
        return ip if ip and ip != "None" else None

    def events(self, namespace: str, involved_name: str | None = None) -> list[Obj]:
        selector = f"involvedObject.name={involved_name}" if involved_name else None
        listing = self._api.sanitize_for_serialization(
            self.core.list_namespaced_event(namespace, field_selector=selector)
        )
        items: list[Obj] = listing.get("items", [])
        return items

    def deployments(self, namespace: str, selector: str) -> list[Obj]:
        listing = self._api.sanitize_for_serialization(
            self.apps.list_namespaced_deployment(namespace, label_selector=selector)
        )
        items: list[Obj] = listing.get("items", [])
        return items

    def worker_key(self, pod: Obj) -> str | None:
        """The model's worker key that `pod` requires (None: it requires none), read from the
        Secret it mounts: the demo stands where only the model's router stands."""
        model = pod["metadata"].get("labels", {}).get(contract.LABEL_MODEL, "")
        name = worker_key_secret.mounted_by(pod.get("spec") or {}, model)
        if name is None:
            return None
        secret = self.core.read_namespaced_secret(name, pod["metadata"]["namespace"])
        data = (secret.data or {}).get(contract.WORKER_KEY_SECRET_KEY)
        if data is None:
            raise DemoError(f"the worker key's Secret {name} has no {contract.WORKER_KEY_SECRET_KEY!r}")
        return base64.b64decode(data).decode().strip()


def pod_ip(pod: Obj) -> str | None:
    ip: str | None = pod.get("status", {}).get("podIP")
    return ip


def selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def names(objs: Sequence[Obj]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)
