"""On nodes tainted like GPU nodes, a model without a toleration stays Pending with the
scheduler's reason in its Ready condition; with podTemplate tolerations and nodeSelector, shm
and a PersistentVolumeClaim of weights it becomes Ready, and its runtime sees /dev/shm a tmpfs
of the asked size and the weights at /models, read-only.

Cluster-exclusive (no other e2e module beside it): it taints every node of the shared cluster,
where no other module's pods could then be placed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.operator_process import OperatorProcess

from ._operator_helpers import Kubectl, condition, operator_module_fixtures
from .test_operator_pods import _container_proc, _model, _mounts

pytestmark = [pytest.mark.e2e, pytest.mark.cluster_exclusive]

kubectl, operator, namespace = operator_module_fixtures("pdwe-gpu-taint-")

TAINT = "nvidia.com/gpu=present:NoSchedule"
WEIGHTS_CONFIG = '{"model_type": "tiny"}'


@pytest.fixture
def tainted_nodes(kubectl: Kubectl) -> Iterator[None]:
    """Every node tainted the way GPU nodes are: the CPU nodes get the GPU nodes' taint for the
    test (and lose it afterwards, whatever happens); the GPU nodes keep theirs."""
    untainted = [
        n["metadata"]["name"]
        for n in kubectl.json("get", "nodes")["items"]
        if not any(t.get("key") == "nvidia.com/gpu" for t in n["spec"].get("taints") or [])
    ]
    for node in untainted:
        kubectl.run("taint", "nodes", node, TAINT, "--overwrite")
    try:
        yield
    finally:
        for node in untainted:
            kubectl.run("taint", "nodes", node, "nvidia.com/gpu:NoSchedule-", check=False)


@pytest.fixture
def weights_claim(kubectl: Kubectl, namespace: str, tmp_path: Path) -> Iterator[str]:
    """A PersistentVolumeClaim bound (by the real PV controller) to a static PersistentVolume
    holding a model directory `tiny`."""
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(WEIGHTS_CONFIG)
    pv = f"{namespace}-weights"
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "hostPath": {"path": str(tmp_path)},
            },
        }
    )
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "weights"},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": pv,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    kubectl.apply(claim, namespace)
    try:
        yield "weights"
    finally:
        kubectl.run("delete", "pvc", "weights", "-n", namespace, "--wait=false", check=False)
        kubectl.run("delete", "pv", pv, "--wait=false", check=False)


def test_gpu_taint_keeps_pods_pending_until_the_template_tolerates_it(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, tainted_nodes: None, weights_claim: str
) -> None:
    model = _model("gpu", prefill={"replicas": 1})
    kubectl.apply(model, namespace)

    def blocked() -> dict[str, Any] | None:
        ready = condition(kubectl.get("disaggregatedmodel", "gpu", namespace), "Ready")
        return ready if ready.get("reason") == "PodsBlocked" else None

    ready = wait_for(blocked, 180, "Ready/PodsBlocked with the scheduler's reason", 2.0)
    assert ready["status"] == "False"
    assert "untolerated taint" in ready["message"], ready["message"]
    assert "prefill" in ready["message"]

    template = {
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
        }
    }
    fixed = _model(
        "gpu",
        model={"path": "tiny", "persistentVolumeClaim": {"claimName": weights_claim}},
        prefill={"replicas": 1, "sharedMemory": "1Gi", "podTemplate": template},
    )
    kubectl.apply(fixed, namespace)

    def ready_now() -> dict[str, Any] | None:
        c = condition(kubectl.get("disaggregatedmodel", "gpu", namespace), "Ready")
        return c if c.get("status") == "True" else None

    wait_for(ready_now, 420, "the tolerating model Ready", 2.0)
    [pod] = kubectl.items("pods", namespace, "pdwarden.io/model=gpu,pdwarden.io/role=prefill")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    # What the runtime itself sees: /dev/shm a 1 GiB tmpfs, the claim's files at /models, read-only.
    proc = _container_proc(pod)
    mounts = _mounts(proc)
    assert mounts["/dev/shm"][0] == "tmpfs" and "size=1048576k" in mounts["/dev/shm"][1], mounts["/dev/shm"]
    assert "ro" in mounts["/models"][2].split(",")
    assert (proc / "root/models/tiny/config.json").read_text() == WEIGHTS_CONFIG
