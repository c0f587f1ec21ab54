"""The chart's model-members policy (templates/admission-model-members.yaml) on the local
cluster's real API server and controllers: only the operator and kube-controller-manager's
controllers make pods, ReplicaSets, Deployments and StatefulSets that carry a model's labels.

A tenant with ordinary rights in the namespace (ClusterRole `edit`, through its ServiceAccount)
cannot create a pod labelled as a model's decode, label an existing pod so, or make a workload
that would create one; the operator's workloads still roll out, quarantine, roll and are
garbage collected; and with the chart installed, the model's own pods serve through its router.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_demo import chart
from pdwarden_localcluster.waits import pod_ready, wait_for
from pdwarden_operator.cache import controller_ref
from pdwarden_operator.kube.pods import quarantine_patch
from pdwarden_testkit.cluster_env import http_json
from pdwarden_testkit.kubectl import Kubectl

from .test_helm_install import EXAMPLE, helm, helm_install, hook_selector

pytestmark = pytest.mark.e2e

RELEASE = "mm"
SUFFIX = "model-members"
VICTIM = "victim"
MEMBER = {contract.LABEL_MODEL: VICTIM, contract.LABEL_ROLE: contract.ROLE_DECODE}
SLEEP = ["python", "-c", "import time; time.sleep(3600)"]
REFUSED = "ValidatingAdmissionPolicy '{policy}'"
# what each refusal says (the policy's messageExpressions)
NOT_A_CREATOR = "only the ReplicaSet and StatefulSet controllers, for a model's workload, may create one"
NOT_THE_DEPLOYMENT_CONTROLLER = "only the Deployment controller, for a model's Deployment, may create one"
NOT_THE_OPERATOR = "only the pdwarden operator may create one"
NOT_ADDED = "make a model's member and cannot be added to an existing object"
NOT_A_CHANGER = "only the pdwarden operator and the Kubernetes controllers that make it may change it"


def operator_user(namespace: str, release: str = RELEASE) -> str:
    return f"system:serviceaccount:{namespace}:{release}-pdwarden"


def policy_name(namespace: str, release: str = RELEASE) -> str:
    return f"{namespace}.{release}-pdwarden.{SUFFIX}"


def tenant_user(namespace: str) -> str:
    return f"system:serviceaccount:{namespace}:tenant"


def pod_spec(**extra: Any) -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "runtime",
                "image": "python:3.11-slim",
                "command": SLEEP,
                "ports": [{"name": contract.PORT_NAME_HTTP, "containerPort": contract.DEFAULT_HTTP_PORT}],
            }
        ],
        **extra,
    }


def pod(name: str, labels: dict[str, str], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, **meta},
        "spec": pod_spec(),
    }


def workload(kind: str, name: str, labels: dict[str, str], replicas: int = 1) -> dict[str, Any]:
    """A Deployment, ReplicaSet or StatefulSet whose pods carry `labels` (and so does it)."""
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": pod_spec()},
    }
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def tenant_rbac(namespace: str) -> list[dict[str, Any]]:
    """The tenant: a ServiceAccount with the ordinary `edit` rights in the namespace (create and
    change pods, ReplicaSets, Deployments, StatefulSets)."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
        },
    ]


def as_user(kubectl: Kubectl, user: str, *args: str, stdin: str | None = None) -> tuple[int, str]:
    proc = kubectl(*args, "--as", user, check=False, stdin=stdin)
    return proc.returncode, proc.stderr


def create(
    kubectl: Kubectl, user: str, obj: dict[str, Any], namespace: str, *, dry: bool = False
) -> tuple[int, str]:
    args = ["create", "-f", "-", "-n", namespace] + (["--dry-run=server"] if dry else [])
    return as_user(kubectl, user, *args, stdin=json.dumps(obj))


def assert_refused(result: tuple[int, str], policy: str, says: str) -> None:
    rc, stderr = result
    assert rc != 0, "admitted"
    assert "forbidden" in stderr.lower() and REFUSED.format(policy=policy) in stderr, stderr
    assert says in stderr, stderr


def assert_admitted(result: tuple[int, str]) -> None:
    rc, stderr = result
    assert rc == 0, stderr


def wait_enforced(kubectl: Kubectl, namespace: str, policy: str) -> None:
    """The API server enforces a new policy once its informers have it: until a stranger's
    member pod is refused."""

    def enforced() -> bool:
        rc, stderr = create(kubectl, tenant_user(namespace), pod("probe", MEMBER), namespace, dry=True)
        return rc != 0 and REFUSED.format(policy=policy) in stderr

    wait_for(enforced, 60, "the policy enforced", 1.0)


def members(kubectl: Kubectl, namespace: str, selector: str) -> list[dict[str, Any]]:
    return [
        p for p in kubectl.items("pods", namespace, selector) if not p["metadata"].get("deletionTimestamp")
    ]


def controller_kind(obj: dict[str, Any]) -> str | None:
    ref = controller_ref(obj)
    return None if ref is None else str(ref.get("kind"))


@pytest.fixture
def policy_only(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """The chart's policy alone (namespace scope: bound to `namespace`), no operator running;
    the operator's ServiceAccount and the tenant may edit the namespace."""
    docs = chart.helm_template(
        release=RELEASE,
        namespace=namespace,
        set_values={"operator.scope": "namespace", "operator.watchNamespace": namespace},
    )
    mine = [
        d
        for d in docs
        if d["kind"].startswith("ValidatingAdmissionPolicy") and d["metadata"]["name"].endswith(SUFFIX)
    ]
    assert [d["kind"] for d in mine] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    manifest = yaml.safe_dump_all(mine)
    operator_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "operator-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": f"{RELEASE}-pdwarden", "namespace": namespace}],
    }
    for obj in [*tenant_rbac(namespace), operator_binding]:
        kubectl.apply(obj, namespace)
    kubectl("apply", "-f", "-", stdin=manifest)
    try:
        wait_enforced(kubectl, namespace, policy_name(namespace))
        yield policy_name(namespace)
    finally:
        kubectl("delete", "-f", "-", "--wait=false", check=False, stdin=manifest)


def test_only_the_operator_and_the_controllers_make_a_models_members(
    kubectl: Kubectl, namespace: str, policy_only: str
) -> None:
    ns, policy, tenant, operator = namespace, policy_only, tenant_user(namespace), operator_user(namespace)

    # the operator's Deployment and StatefulSet: the Deployment controller makes the ReplicaSet,
    # the ReplicaSet and StatefulSet controllers the pods, all admitted
    assert_admitted(create(kubectl, operator, workload("Deployment", "victim-decode", MEMBER), ns))
    grouped = {contract.LABEL_MODEL: VICTIM, contract.LABEL_ROLE: contract.ROLE_PREFILL}
    assert_admitted(create(kubectl, operator, workload("StatefulSet", "victim-prefill-0", grouped), ns))
    decode_sel = f"{contract.LABEL_MODEL}={VICTIM},{contract.LABEL_ROLE}={contract.ROLE_DECODE}"
    prefill_sel = f"{contract.LABEL_MODEL}={VICTIM},{contract.LABEL_ROLE}={contract.ROLE_PREFILL}"
    (decode,) = wait_for(lambda: members(kubectl, ns, decode_sel) or None, 90, "the decode pod")
    (prefill,) = wait_for(lambda: members(kubectl, ns, prefill_sel) or None, 90, "the prefill pod")
    assert controller_kind(decode) == "ReplicaSet" and controller_kind(prefill) == "StatefulSet"
    (rs,) = kubectl.items("replicasets", ns, decode_sel)
    assert controller_kind(rs) == "Deployment"

    # the tenant: no member pod, however it is made
    assert_refused(create(kubectl, tenant, pod("look-alike", MEMBER), ns), policy, NOT_A_CREATOR)
    forged = pod(
        "forged-owner",
        MEMBER,
        ownerReferences=[{**controller_owner(rs), "controller": True}],
    )
    assert_refused(create(kubectl, tenant, forged, ns), policy, NOT_A_CREATOR)
    assert_refused(
        create(kubectl, tenant, workload("ReplicaSet", "look-alike", MEMBER), ns),
        policy,
        NOT_THE_DEPLOYMENT_CONTROLLER,
    )
    for kind in ("Deployment", "StatefulSet"):
        assert_refused(
            create(kubectl, tenant, workload(kind, "look-alike", MEMBER), ns), policy, NOT_THE_OPERATOR
        )
    # the labels on the pod template alone: its pods would be members
    hidden = workload("Deployment", "hidden", MEMBER)
    hidden["metadata"]["labels"] = {"app": "hidden"}
    assert_refused(create(kubectl, tenant, hidden, ns), policy, NOT_THE_OPERATOR)
    # ... nor a pod of its own relabelled afterwards
    assert_admitted(create(kubectl, tenant, pod("foreign", {"app": "foreign"}), ns))
    labels = [f"{k}={v}" for k, v in MEMBER.items()]
    assert_refused(as_user(kubectl, tenant, "label", "pod", "foreign", *labels, "-n", ns), policy, NOT_ADDED)
    admin = kubectl("label", "pod", "foreign", *labels, "-n", ns, check=False)
    assert_refused((admin.returncode, admin.stderr), policy, NOT_ADDED)  # whoever asks
    foreign = kubectl.get("pod", "foreign", ns)
    assert foreign is not None and contract.LABEL_MODEL not in foreign["metadata"]["labels"]
    # ... nor a member changed: moved to another model, or anything else of it
    name = decode["metadata"]["name"]
    moved = f"{contract.LABEL_MODEL}=other"
    assert_refused(
        as_user(kubectl, tenant, "label", "pod", name, moved, "--overwrite", "-n", ns), policy, NOT_A_CHANGER
    )
    assert_refused(as_user(kubectl, tenant, "annotate", "pod", name, "x=y", "-n", ns), policy, NOT_A_CHANGER)
    image = ["set", "image", "deployment/victim-decode", "runtime=evil:1", "-n", ns]
    assert_refused(as_user(kubectl, tenant, *image), policy, NOT_A_CHANGER)
    # deleting is RBAC's: the tenant may (and the ReplicaSet replaces the pod)
    assert_admitted(as_user(kubectl, tenant, "delete", "pod", "foreign", "-n", ns, "--wait=false"))

    # the watchdog's quarantine, as the operator sends it: its ReplicaSet then lets the pod go
    # (the ReplicaSet controller's update) and makes a replacement
    deployment = kubectl.get("deployment", "victim-decode", ns)
    assert deployment is not None
    patch = quarantine_patch(
        decode["metadata"], decode["metadata"]["uid"], controller_owner(deployment), "now"
    )
    quarantine = ["patch", "pod", name, "-n", ns, "--type", "strategic", "-p", json.dumps(patch)]
    assert_refused(as_user(kubectl, tenant, *quarantine), policy, NOT_A_CHANGER)
    assert_admitted(as_user(kubectl, operator, *quarantine))

    def released() -> dict[str, Any] | None:
        now = kubectl.get("pod", name, ns)
        return now if now is not None and controller_ref(now) is None else None

    let_go = wait_for(released, 90, "the ReplicaSet to release the quarantined pod")
    assert let_go["metadata"]["labels"][contract.LABEL_ROLE] == contract.ROLE_QUARANTINED
    (replacement,) = wait_for(lambda: members(kubectl, ns, decode_sel) or None, 90, "a replacement")
    assert replacement["metadata"]["uid"] != decode["metadata"]["uid"]
    # ... and the tenant cannot bring the quarantined pod back into the router's view
    back = f"{contract.LABEL_ROLE}={contract.ROLE_DECODE}"
    assert_refused(
        as_user(kubectl, tenant, "label", "pod", name, back, "--overwrite", "-n", ns), policy, NOT_A_CHANGER
    )

    # a roll: a new ReplicaSet (the Deployment controller), its pod, the old one scaled down
    restart = {"spec": {"template": {"metadata": {"annotations": {"pdwarden.io/rolled": "1"}}}}}
    assert_admitted(
        as_user(
            kubectl, operator, "patch", "deployment", "victim-decode", "-n", ns, "-p", json.dumps(restart)
        )
    )

    def rolled() -> bool:
        sets = kubectl.items("replicasets", ns, decode_sel)
        pods = members(kubectl, ns, decode_sel)
        return (
            len(sets) == 2
            and sorted(s["spec"]["replicas"] for s in sets) == [0, 1]
            and len(pods) == 1
            and (pods[0]["metadata"].get("annotations") or {}).get("pdwarden.io/rolled") == "1"
        )

    wait_for(rolled, 120, "the Deployment rolled")

    # the garbage collector: a foreground deletion (its finalizer removed by the collector)
    # takes the ReplicaSets, their pods and the quarantined pod (the Deployment its owner)
    kubectl("delete", "deployment", "victim-decode", "-n", ns, "--cascade=foreground", "--timeout=120s")
    kubectl("delete", "statefulset", "victim-prefill-0", "-n", ns, "--cascade=foreground", "--timeout=120s")
    wait_for(
        lambda: (
            not members(kubectl, ns, f"{contract.LABEL_MODEL}={VICTIM}")
            and not kubectl.items("replicasets", ns)
        ),
        120,
        "every member collected",
    )


def controller_owner(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": obj.get("apiVersion", "apps/v1"),
        "kind": obj.get("kind"),
        "name": meta["name"],
        "uid": meta["uid"],
    }


@pytest.fixture
def kubeconfig(cluster: Any) -> Path:
    return Path(cluster.kubeconfig)


def test_with_the_chart_installed_a_tenant_cannot_join_a_model_that_serves_through_its_router(
    kubectl: Kubectl, kubeconfig: Path, namespace: str
) -> None:
    release = f"mm-{uuid.uuid4().hex[:6]}"
    policy = policy_name(namespace, release)
    scope = ["--set", "operator.scope=namespace", "--set", f"operator.watchNamespace={namespace}"]
    proc = helm_install(kubeconfig, "install", release, chart.CHART_DIR, namespace, *scope)
    assert proc.returncode == 0, proc.stderr
    try:
        assert kubectl.get("validatingadmissionpolicybinding", policy, namespace) is not None
        for obj in tenant_rbac(namespace):
            kubectl.apply(obj, namespace)
        wait_enforced(kubectl, namespace, policy)
        model = yaml.safe_load(EXAMPLE.read_text())
        name = model["metadata"]["name"]
        kubectl.apply(model, namespace)

        def serving() -> list[dict[str, Any]] | None:
            pods = members(kubectl, namespace, f"{contract.LABEL_MODEL}={name}")
            return pods if len(pods) == 3 and all(map(pod_ready, pods)) else None

        pods = wait_for(serving, 300, "the model's three pods Ready", 2.0)
        assert {controller_kind(p) for p in pods} == {"ReplicaSet"}
        svc = kubectl.get("service", f"{name}-router", namespace)
        assert svc is not None
        url = f"http://{svc['spec']['clusterIP']}:{contract.ROUTER_HTTP_PORT}{contract.GENERATE_PATH}"
        body = {"text": "members only", "model": name, "sampling_params": {"max_new_tokens": 2}}
        wait_for(lambda: http_json(url, body)[0] == 200, 120, "an answer through the router", 1.0)

        tenant = tenant_user(namespace)
        decode = {contract.LABEL_MODEL: name, contract.LABEL_ROLE: contract.ROLE_DECODE}
        assert_refused(create(kubectl, tenant, pod("look-alike", decode), namespace), policy, NOT_A_CREATOR)
        assert_admitted(create(kubectl, tenant, pod("foreign", {"app": "foreign"}), namespace))
        labels = [f"{k}={v}" for k, v in decode.items()]
        assert_refused(
            as_user(kubectl, tenant, "label", "pod", "foreign", *labels, "-n", namespace), policy, NOT_ADDED
        )
        assert_refused(
            create(kubectl, tenant, workload("ReplicaSet", "look-alike", decode), namespace),
            policy,
            NOT_THE_DEPLOYMENT_CONTROLLER,
        )
        # the router still serves from the model's own pods, which are all its members are
        status, answer = http_json(url, body)
        assert status == 200, answer
        now = members(kubectl, namespace, f"{contract.LABEL_MODEL}={name}")
        assert sorted(p["metadata"]["uid"] for p in now) == sorted(p["metadata"]["uid"] for p in pods)
        kubectl("delete", "disaggregatedmodels", name, "-n", namespace, "--timeout=120s")
    finally:
        kubectl("delete", "pod,serviceaccount", "-n", namespace, "-l", hook_selector(release), check=False)
        helm(kubeconfig, "uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")
    assert kubectl("get", "validatingadmissionpolicy", policy, check=False).returncode != 0
