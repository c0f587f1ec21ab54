"""Multi-node replicas: the spec's rules, the groups' children, their pruning and status."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

import pdwarden_contract as contract
from pdwarden_operator import plan
from pdwarden_operator.models import parse_spec
from pdwarden_operator.render.children import child_key, render_children
from pdwarden_operator.render.meta import Owner
from pdwarden_operator.status import Observed, Workload, compute_status, observe_groups

pytestmark = pytest.mark.unit

OWNER = Owner(name="m1", namespace="ns1", uid="6f1c2d3e-0000-4000-8000-000000000002")


def _spec(**roles: Any) -> dict[str, Any]:
    return {"model": {"path": "synthetic/tiny"}, "engine": "synthetic", **roles}


def _children(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {child_key(o): o for o in render_children(OWNER, parse_spec(spec))}


GROUPED = _spec(
    prefill={"replicas": 1, "nodesPerReplica": 2, "tensorParallel": 2},
    decode={"replicas": 2, "nodesPerReplica": 4, "tensorParallel": 4},
)


def test_one_statefulset_per_group_and_a_ranks_service_per_role() -> None:
    kids = _children(GROUPED)
    assert ("Deployment", "m1-prefill") not in kids and ("Deployment", "m1-decode") not in kids
    assert {k for k in kids if k[0] == "StatefulSet"} == {
        ("StatefulSet", "m1-prefill-0"),
        ("StatefulSet", "m1-decode-0"),
        ("StatefulSet", "m1-decode-1"),
    }
    svc = kids[("Service", "m1-decode-ranks")]["spec"]
    assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is True
    sts = kids[("StatefulSet", "m1-decode-1")]
    assert sts["spec"]["replicas"] == 4 and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "m1-decode-ranks"
    assert sts["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert sts["spec"]["selector"]["matchLabels"][contract.LABEL_GROUP] == "1"


def test_group_pods_get_rank_leader_address_and_spread_over_nodes() -> None:
    sts = _children(GROUPED)[("StatefulSet", "m1-decode-1")]
    pod = sts["spec"]["template"]
    assert pod["metadata"]["labels"][contract.LABEL_GROUP] == "1"
    container = pod["spec"]["containers"][0]
    cmd = container["command"]
    assert cmd[cmd.index("--nnodes") + 1] == "4"
    assert cmd[cmd.index("--node-rank") + 1] == f"$({contract.ENV_NODE_RANK})"
    assert (
        cmd[cmd.index("--dist-init-addr") + 1]
        == f"m1-decode-1-0.m1-decode-ranks:{contract.DEFAULT_DIST_INIT_PORT}"
    )
    rank = next(e for e in container["env"] if e["name"] == contract.ENV_NODE_RANK)
    assert rank["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{contract.LABEL_POD_INDEX}']"
    assert any(p["name"] == contract.PORT_NAME_DIST for p in container["ports"])
    term = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"][contract.LABEL_GROUP] == "1"


def test_the_router_discovers_only_leaders_of_grouped_roles() -> None:
    spec = _spec(decode={"replicas": 1, "nodesPerReplica": 2, "tensorParallel": 2})
    cmd = _children(spec)[("Deployment", "m1-router")]["spec"]["template"]["spec"]["containers"][0]["command"]
    prefill = cmd[cmd.index("--prefill-selector") + 1 : cmd.index("--decode-selector")]
    decode = cmd[cmd.index("--decode-selector") + 1 : cmd.index("--prometheus-host")]
    assert f"{contract.LABEL_POD_INDEX}=0" in decode
    assert not any(a.startswith(contract.LABEL_POD_INDEX) for a in prefill)


def test_scaling_down_prunes_whole_groups_and_switching_modes_prunes_the_other_kind() -> None:
    observed = _children(GROUPED)
    fewer = render_children(
        OWNER,
        parse_spec(
            _spec(
                prefill={"replicas": 1, "nodesPerReplica": 2, "tensorParallel": 2},
                decode={"replicas": 1, "nodesPerReplica": 4, "tensorParallel": 4},
            )
        ),
    )
    assert [child_key(o) for o in plan.to_delete(fewer, observed)] == [("StatefulSet", "m1-decode-1")]
    single = render_children(OWNER, parse_spec(_spec()))
    gone = {child_key(o) for o in plan.to_delete(single, observed)}
    assert gone == {
        ("StatefulSet", "m1-prefill-0"),
        ("StatefulSet", "m1-decode-0"),
        ("StatefulSet", "m1-decode-1"),
        ("Service", "m1-prefill-ranks"),
        ("Service", "m1-decode-ranks"),
    }
    back = render_children(OWNER, parse_spec(GROUPED))
    assert {child_key(o) for o in plan.to_delete(back, _children(_spec()))} == {
        ("Deployment", "m1-prefill"),
        ("Deployment", "m1-decode"),
    }


@pytest.mark.parametrize(
    ("role", "message"),
    [
        ({"nodesPerReplica": 2, "gpus": 8, "tensorParallel": 32}, "gpus x nodesPerReplica"),
        ({"nodesPerReplica": 4, "gpus": 8, "tensorParallel": 2}, "multiple of nodesPerReplica"),
        ({"nodesPerReplica": 0}, "greater than or equal to 1"),
    ],
)
def test_bad_groups_are_refused_naming_the_field(role: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_spec(_spec(decode=role))
    assert message in str(err.value) and "decode" in str(err.value)


def test_tensor_parallel_may_span_the_group_and_the_router_stays_single() -> None:
    spec = parse_spec(_spec(decode={"nodesPerReplica": 2, "gpus": 8, "tensorParallel": 16}))
    assert spec.decode.grouped and spec.decode.tensor_parallel == 16
    with pytest.raises(ValidationError, match="router runs as single pods"):
        parse_spec(_spec(router={"nodesPerReplica": 2}))


def _sts(ready: int, updated: int = 2, replicas: int = 2) -> dict[str, Any]:
    status = {
        "replicas": replicas,
        "readyReplicas": ready,
        "updatedReplicas": updated,
        "observedGeneration": 1,
    }
    return {"metadata": {"generation": 1}, "status": status}


def test_a_group_is_ready_only_when_every_rank_is() -> None:
    w = observe_groups([_sts(2), _sts(1)], nodes=2, want=2)
    assert (w.ready, w.ready_pods, w.spec_replicas) == (1, 3, 2)
    spec = parse_spec(GROUPED | {"decode": {"replicas": 2, "nodesPerReplica": 2, "tensorParallel": 2}})
    observed = Observed(generation=1, workloads={contract.ROLE_DECODE: w})
    decode = compute_status(spec, observed, None)["decode"]
    assert decode["summary"] == "1/2 groups, 3/4 pods"
    assert (decode["groups"], decode["readyGroups"], decode["readyPods"]) == (2, 1, 3)
    assert compute_status(spec, observed, None)["conditions"][0]["status"] == "False"


def test_all_groups_ready_settles_the_role() -> None:
    spec = parse_spec(
        _spec(
            decode={"replicas": 2, "nodesPerReplica": 2, "tensorParallel": 2},
            prefill={"replicas": 0},
            router={"replicas": 0},
        )
    )
    w = observe_groups([_sts(2), _sts(2)], nodes=2, want=2)

    done = Workload(present=True, up_to_date=True)
    observed = Observed(
        generation=1,
        workloads={contract.ROLE_DECODE: w, contract.ROLE_PREFILL: done, contract.ROLE_ROUTER: done},
    )
    ready = compute_status(spec, observed, None)["conditions"][0]
    assert ready["status"] == "True", ready
