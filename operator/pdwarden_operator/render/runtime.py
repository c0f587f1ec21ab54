"""The prefill and decode pods: their command, environment, volumes, ports, probes, pod
template, and the workloads that run them (a Deployment, or a StatefulSet per multi-node group:
groups.py)."""

from __future__ import annotations

import posixpath
from typing import Final

import pdwarden_contract as contract
from pdwarden_operator import groups, podtemplate, replicas, worker_key_secret
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.render.accounts import runtime_service_account_name
from pdwarden_operator.render.gone_pods import GONE_PODS_DIR, gone_pods_name
from pdwarden_operator.render.kinds import DEPLOYMENT
from pdwarden_operator.render.meta import (
    Obj,
    Owner,
    child_metadata,
    child_name,
    labels,
    selector_labels,
    served_name,
)
from pdwarden_operator.render.pods import (
    TMP_DIR,
    container_resources,
    container_security_context,
    field_env,
    http_probe,
    pod_identity_env,
    pod_security_context,
    spread_constraints,
    tmp_volume,
)
from pdwarden_operator.render.worker_key import mount_worker_key, workers_key_use
from pdwarden_operator.resource.containers import GPU_RESOURCE
from pdwarden_operator.resource.roles import RUNTIME_EPHEMERAL_STORAGE, RoleSpec

RUNTIME_CONTAINER = podtemplate.RUNTIME_CONTAINER
SHM_DIR = "/dev/shm"
MODEL_DIR = "/models"  # weights on a volume, read-only
CACHE_DIR = "/cache"  # downloaded weights, read-write
HF_HOME = f"{CACHE_DIR}/huggingface"
HF_TOKEN_DIR = "/var/run/secrets/huggingface"  # the token as a file, never in the environment


def runtime_command(
    owner: Owner, spec: DisaggregatedModelSpec, role: str, group: int | None = None
) -> list[str]:
    """The command every runtime pod runs (parsed by ``pdwarden_runtime.cli``'s ``serve``);
    a group's pods also get the multi-node flags, which the runtime hands on to SGLang."""
    role_spec = spec.role(role)
    flag = contract.ServeFlag
    cmd = [
        *contract.SERVE_COMMAND,
        flag.ROLE,
        role,
        flag.ENGINE,
        spec.engine,
        flag.HOST,
        f"$({contract.ENV_POD_IP})",
        flag.PORT,
        str(spec.transfer.port(contract.DEFAULT_HTTP_PORT)),
        flag.BOOTSTRAP_PORT,
        str(spec.transfer.port(contract.DEFAULT_BOOTSTRAP_PORT)),
        flag.METRICS_PORT,
        str(spec.transfer.port(contract.DEFAULT_METRICS_PORT)),
        flag.INFLIGHT_DEADLINE,
        str(spec.transfer.inflight_deadline_seconds),
        flag.TRANSFER_DEADLINE,
        str(spec.transfer.transfer_deadline_seconds),
    ]
    keys = workers_key_use(owner, spec)
    if keys.sign is not None:
        cmd += [flag.WORKER_KEY_FILE, worker_key_secret.KEY_FILE]
        if keys.other_accepted is not None:
            cmd += [flag.WORKER_KEY_ACCEPT_FILE, worker_key_secret.ACCEPT_KEY_FILE]
        if keys.lenient:
            cmd.append(flag.SIDE_CHANNEL_LENIENT)
    if owner.allow_fault_injection:
        cmd.append(flag.ALLOW_FAULT_INJECTION)
    if group is not None:
        port = spec.transfer.port(contract.DEFAULT_DIST_INIT_PORT)
        cmd += groups.group_args(owner.name, role, group, role_spec.nodes_per_replica, port)
    if spec.engine == "synthetic":
        # served under the model's served name, as SGLang is: the router routes by it
        tail = [flag.MODEL, served_name(owner, spec), *role_spec.args]
    else:
        rdma = spec.transfer.rdma
        ib = ["--disaggregation-ib-device", ",".join(rdma.ib_devices)] if rdma and rdma.ib_devices else []
        tail = [
            "--",
            "--model-path",
            model_path(spec),
            "--served-model-name",
            served_name(owner, spec),
            "--tp",
            str(role_spec.tensor_parallel),
            *ib,
            *role_spec.args,
        ]
    return [str(a) for a in (*cmd, *tail)]  # plain strings: the flags are ServeFlag members


def model_path(spec: DisaggregatedModelSpec) -> str:
    """What SGLang loads: the mounted directory for weights on a volume, else the id as given."""
    if spec.model.volume:
        return posixpath.normpath(posixpath.join(MODEL_DIR, spec.model.path))
    return spec.model.path


def runtime_env(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> list[Obj]:
    env = [
        *pod_identity_env(),
        field_env(contract.ENV_POD_UID, "metadata.uid"),
        {"name": contract.ENV_ROLE, "value": role},
        {"name": contract.ENV_MODEL, "value": served_name(owner, spec)},
        {"name": contract.ENV_GONE_PODS_FILE, "value": f"{GONE_PODS_DIR}/{contract.GONE_PODS_KEY}"},
        # caches under ~ (Triton, FlashInfer, torch) land on the /tmp volume, not the read-only root
        {"name": "HOME", "value": TMP_DIR},
    ]
    if spec.transfer.ucx_transports:
        env.append({"name": "UCX_TLS", "value": spec.transfer.ucx_transports})
    hf = spec.model.hugging_face
    if hf is not None:
        env.append({"name": "HF_HOME", "value": HF_HOME})
        if hf.token_secret_ref is not None:
            # huggingface_hub reads the token from this file (an environment variable would show
            # in every process listing and crash report)
            env.append({"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/token"})
    # The role's env replaces pdwarden's optional variables of the same name (one entry per name:
    # server-side apply refuses duplicate keys).
    user = [var.model_dump(by_alias=True, exclude_none=True) for var in spec.role(role).env]
    return podtemplate.merge({"env": env}, {"env": user})["env"]


def _runtime_resources(role_spec: RoleSpec, extra: dict[str, int] | None) -> Obj:
    out = container_resources(role_spec.resources, role_spec.gpus, extra)
    # the scheduler counts what /tmp holds only where a request says so
    out["requests"] = {"ephemeral-storage": RUNTIME_EPHEMERAL_STORAGE, **out.get("requests", {})}
    return out


# GPU nodes are tainted like this (the NVIDIA GPU operator's and the clouds' convention); pods
# that request GPUs tolerate it, so they may land there while CPU pods stay off.
GPU_TOLERATION: Obj = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def gpu_tolerations(role_spec: RoleSpec) -> list[Obj]:
    """The GPU toleration for a pod that requests GPUs, unless the role says otherwise:
    `gpuToleration: false` drops it, and a podTemplate toleration for the same key replaces it
    (appended lists would keep both)."""
    if role_spec.gpus <= 0 or not role_spec.gpu_toleration:
        return []
    own = ((role_spec.pod_template or {}).get("spec") or {}).get("tolerations") or []
    if any(isinstance(t, dict) and t.get("key") == GPU_RESOURCE for t in own):
        return []
    return [dict(GPU_TOLERATION)]


def runtime_volumes(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> tuple[list[Obj], list[Obj]]:
    """(volumes, volumeMounts) of a runtime pod: the operator's list of deleted pods,
    /dev/shm, the weights, the download cache."""
    # Optional: a pod starts before the watchdog first writes the list (an absent list
    # proves nothing, so nothing is freed on it).
    gone = {"name": gone_pods_name(owner.name), "optional": True}
    tmp, tmp_mount = tmp_volume()
    volumes: list[Obj] = [{"name": podtemplate.GONE_PODS_VOLUME, "configMap": gone}, tmp]
    mounts: list[Obj] = [
        {"name": podtemplate.GONE_PODS_VOLUME, "mountPath": GONE_PODS_DIR, "readOnly": True},
        tmp_mount,
    ]
    keys = workers_key_use(owner, spec)
    mount_worker_key(keys.sign, volumes, mounts)
    mount_worker_key(keys.other_accepted, volumes, mounts, accepted=True)
    shm = spec.role(role).shm_size
    if shm:
        volumes.append({"name": podtemplate.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm}})
        mounts.append({"name": podtemplate.SHM_VOLUME, "mountPath": SHM_DIR})
    model = spec.model
    if model.persistent_volume_claim is not None:
        pvc = model.persistent_volume_claim
        claim = {"claimName": pvc.claim_name, "readOnly": True}
        volumes.append({"name": podtemplate.MODEL_VOLUME, "persistentVolumeClaim": claim})
        mount: Obj = {"name": podtemplate.MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}
        if pvc.sub_path:
            mount["subPath"] = pvc.sub_path
        mounts.append(mount)
    elif model.host_path is not None:
        host = {"path": model.host_path.path, "type": "Directory"}
        volumes.append({"name": podtemplate.MODEL_VOLUME, "hostPath": host})
        mounts.append({"name": podtemplate.MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True})
    elif model.hugging_face is not None:
        cache = model.hugging_face.cache
        source: Obj
        if cache.claim_name:
            source = {"persistentVolumeClaim": {"claimName": cache.claim_name}}
        elif cache.host_path:
            source = {"hostPath": {"path": cache.host_path, "type": "DirectoryOrCreate"}}
        else:
            source = {"emptyDir": {"sizeLimit": str(cache.size_limit)} if cache.size_limit else {}}
        volumes.append({"name": podtemplate.CACHE_VOLUME, **source})
        mounts.append({"name": podtemplate.CACHE_VOLUME, "mountPath": CACHE_DIR})
        token = model.hugging_face.token_secret_ref
        if token is not None:
            items = [{"key": token.key, "path": "token"}]
            volumes.append(
                {"name": podtemplate.HF_TOKEN_VOLUME, "secret": {"secretName": token.name, "items": items}}
            )
            mounts.append({"name": podtemplate.HF_TOKEN_VOLUME, "mountPath": HF_TOKEN_DIR, "readOnly": True})
    return volumes, mounts


def _runtime_probes(spec: DisaggregatedModelSpec) -> Obj:
    # Loading a real model takes minutes: the startup probe allows up to an hour, after
    # which liveness takes over. The synthetic engine needs seconds to a few minutes (it
    # imports SGLang's transfer code; a busy CPU-only node is slow).
    startup_failures = 360 if spec.engine == "sglang" else 150
    startup_period = 10 if spec.engine == "sglang" else 2
    http = contract.PORT_NAME_HTTP
    return {
        "startupProbe": http_probe(contract.HEALTH_PATH, http, startup_period, startup_failures),
        "readinessProbe": http_probe(contract.HEALTH_PATH, http, 5, 3),
        "livenessProbe": http_probe(contract.HEALTH_PATH, http, 10, 3),
    }


def _runtime_ports(spec: DisaggregatedModelSpec, grouped: bool = False) -> list[Obj]:
    """The contract's ports (a group's pods add the rendezvous port); with hostNetwork, shifted
    by hostPortOffset and declared as host ports, so that the scheduler never places two pods
    whose ports clash on one node."""
    ports = []
    named = [
        (contract.PORT_NAME_HTTP, contract.DEFAULT_HTTP_PORT),
        (contract.PORT_NAME_BOOTSTRAP, contract.DEFAULT_BOOTSTRAP_PORT),
        (contract.PORT_NAME_METRICS, contract.DEFAULT_METRICS_PORT),
    ]
    if grouped:
        named.append((contract.PORT_NAME_DIST, contract.DEFAULT_DIST_INIT_PORT))
    for name, base in named:
        port: Obj = {"name": name, "containerPort": spec.transfer.port(base), "protocol": "TCP"}
        if spec.transfer.host_network:
            port["hostPort"] = port["containerPort"]
        ports.append(port)
    return ports


def runtime_pod_template(
    owner: Owner, spec: DisaggregatedModelSpec, role: str, group: int | None = None
) -> Obj:
    """The role's pod template, the role's podTemplate merged in (`group`: for that group's pods)."""
    role_spec: RoleSpec = spec.role(role)
    pod_annotations = {
        # The router's service discovery reads the prefill bootstrap port from here.
        contract.ANNOTATION_BOOTSTRAP_PORT: str(spec.transfer.port(contract.DEFAULT_BOOTSTRAP_PORT)),
    }
    rdma = spec.transfer.rdma
    volumes, mounts = runtime_volumes(owner, spec, role)
    container: Obj = {
        "name": RUNTIME_CONTAINER,
        "image": spec.image,
        "command": runtime_command(owner, spec, role, group),
        "ports": _runtime_ports(spec, group is not None),
        "env": runtime_env(owner, spec, role) + ([groups.rank_env()] if group is not None else []),
        "resources": _runtime_resources(role_spec, {rdma.resource_name: rdma.count} if rdma else None),
        **_runtime_probes(spec),
        # IPC_LOCK: RDMA registers (pins) KV memory with the NIC.
        "securityContext": container_security_context(("IPC_LOCK",) if rdma else ()),
    }
    if mounts:
        container["volumeMounts"] = mounts
    pod_spec: Obj = {
        "serviceAccountName": runtime_service_account_name(owner.name),
        # The runtime never calls the Kubernetes API: no token to steal.
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "topologySpreadConstraints": spread_constraints(owner.name, role),
        "containers": [container],
        "terminationGracePeriodSeconds": 30,
    }
    if volumes:
        pod_spec["volumes"] = volumes
    tolerations = gpu_tolerations(role_spec)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.transfer.host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    template = {
        "metadata": {"labels": labels(owner.name, role), "annotations": pod_annotations},
        "spec": pod_spec,
    }
    return podtemplate.merge(template, role_spec.pod_template)


# smg registers a new worker some seconds after its pod is Ready (its discovery coalesces
# events for 1 s, then checks the worker's health and reads its metadata), but drops a
# terminating one at once: a rolling update removes an old pod only once its replacement has
# been Ready this long, so the router never runs out of workers of a role.
ROUTER_DISCOVERY_S: Final = 10


def runtime_deployment(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> Obj:
    return {
        **DEPLOYMENT.type_meta(),
        "metadata": child_metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "replicas": replicas.in_effect(spec.role(role), owner.deployed.get(role)),
            "minReadySeconds": ROUTER_DISCOVERY_S,
            "selector": {"matchLabels": selector_labels(owner.name, role)},
            "template": runtime_pod_template(owner, spec, role),
        },
    }


def runtime_workloads(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> list[Obj]:
    """One Deployment, or (nodesPerReplica > 1) one StatefulSet per group and the headless
    Service naming the leaders. Scaling `replicas` adds or removes whole groups: the resync
    deletes the StatefulSets of groups no longer rendered."""
    role_spec = spec.role(role)
    if not role_spec.grouped:
        return [runtime_deployment(owner, spec, role)]
    meta = child_metadata(owner, child_name(owner.name, role), role)
    port = spec.transfer.port(contract.DEFAULT_DIST_INIT_PORT)
    return [
        *(
            groups.statefulset(
                meta,
                runtime_pod_template(owner, spec, role, g),
                model=owner.name,
                role=role,
                group=g,
                nodes=role_spec.nodes_per_replica,
            )
            for g in range(role_spec.replicas)
        ),
        groups.ranks_service(meta, model=owner.name, role=role, port=port),
    ]
