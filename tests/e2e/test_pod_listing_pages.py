"""The watchdog's namespace listing against the real API server: served in pages that follow
the continue token to the end, every runtime pod once, nothing outside the runtime selector."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.cluster import ClusterInfo
from pdwarden_operator.kube import pods as kube_pods
from pdwarden_operator.kube.client import KubeClient, connect
from pdwarden_testkit.kubectl import Kubectl

pytestmark = pytest.mark.e2e


def _pending_pod(name: str, labels: dict[str, str]) -> dict[str, object]:
    """A pod no node takes: the listing is the subject, not the pod's process."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"pdwarden.test/no-such-node": "true"},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "python:3.11-slim", "command": ["true"]}],
        },
    }


@pytest.fixture
async def api_client(cluster: ClusterInfo) -> AsyncIterator[KubeClient]:
    client = connect(str(cluster.kubeconfig), max_connections=2)
    try:
        yield client
    finally:
        await client.aclose()


async def test_a_namespace_listed_in_pages_yields_every_runtime_pod_once(
    kubectl: Kubectl, namespace: str, api_client: KubeClient
) -> None:
    runtime = [f"m-{role}-{i}" for role in contract.RUNTIME_ROLES for i in range(3)]
    items = [
        _pending_pod(name, {contract.LABEL_MODEL: "m", contract.LABEL_ROLE: name.split("-")[1]})
        for name in runtime
    ]
    items.append(_pending_pod("not-a-runtime-pod", {contract.LABEL_MODEL: "m"}))  # no role label
    kubectl.run(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
    )

    pages = [page async for page in kube_pods.list_namespace_runtime_pods(api_client, namespace, page_size=4)]

    assert [len(page) for page in pages] == [4, 2]
    listed = [p["metadata"]["name"] for page in pages for p in page]
    assert sorted(listed) == sorted(runtime)
