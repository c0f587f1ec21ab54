"""Children of a DisaggregatedModel, as plain dicts ready for server-side apply.

Pure functions: same input, same output, no API calls. Names are deterministic
(`<name>-prefill`, `<name>-decode`, `<name>-router`), so re-applying after a crash or a
restart updates the same objects instead of creating duplicates.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pdwarden_contract as contract
from pdwarden_operator import groups, podpolicy, podtemplate, replicas, worker_key_secret
from pdwarden_operator.models import (
    GPU_RESOURCE,
    ROUTER_DEFAULT_RESOURCES,
    RUNTIME_EPHEMERAL_STORAGE,
    DisaggregatedModelSpec,
    ResourceRequirements,
    RoleSpec,
)

Obj = dict[str, Any]

RUNTIME_CONTAINER = podtemplate.RUNTIME_CONTAINER
ROUTER_CONTAINER = podtemplate.ROUTER_CONTAINER
APP_NAME = "pdwarden"
# The runtime image's non-root USER (runtime/Dockerfile); pods run as it unless a podTemplate
# says otherwise (an image that needs root: securityContext {runAsNonRoot: false, runAsUser: 0}).
NON_ROOT_UID = 1000
SHM_DIR = "/dev/shm"
MODEL_DIR = "/models"  # weights on a volume, read-only
CACHE_DIR = "/cache"  # downloaded weights, read-write
GONE_PODS_DIR = "/etc/pdwarden/gone-pods"  # the watchdog's list of deleted runtime pods, read-only
HF_HOME = f"{CACHE_DIR}/huggingface"
TMP_DIR = "/tmp"  # an emptyDir: the root filesystem is read-only
HF_TOKEN_DIR = "/var/run/secrets/huggingface"  # the token as a file, never in the environment
NETWORK_POLICY_SUFFIX = "runtime"
# Pods allowed to scrape metrics when networkPolicy.metricsFrom is unset: the operator (the
# chart's labels) and Prometheus, in any namespace.
DEFAULT_METRICS_PEERS: tuple[Obj, ...] = (
    {
        "namespaceSelector": {},
        "podSelector": {
            "matchLabels": {contract.LABEL_APP_NAME: APP_NAME, contract.LABEL_APP_COMPONENT: "operator"}
        },
    },
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {contract.LABEL_APP_NAME: "prometheus"}}},
)


@dataclass(frozen=True)
class Owner:
    """What the children need to know about their DisaggregatedModel besides its spec."""

    name: str
    namespace: str
    uid: str
    annotations: dict[str, str] = field(default_factory=dict)
    # Who uses the model's worker key now (observed: reconcile plans it; None: from the spec).
    worker_key: worker_key_secret.KeyUse | None = None
    # Autoscaled roles' counts as their Deployments hold them (observed; absent: none yet).
    deployed: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Any) -> Owner:
        meta = body["metadata"]
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            annotations=dict(meta.get("annotations") or {}),
        )

    @property
    def allow_fault_injection(self) -> bool:
        return podpolicy.fault_injection_asked(self.annotations)

    def owner_reference(self) -> Obj:
        return {
            "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
            "kind": contract.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def child_name(model: str, role: str) -> str:
    return f"{model}-{role}"


def selector_labels(model: str, role: str) -> dict[str, str]:
    """The immutable Deployment selector; also what the router's discovery matches."""
    return {contract.LABEL_MODEL: model, contract.LABEL_ROLE: role}


def labels(model: str, role: str) -> dict[str, str]:
    return {
        **selector_labels(model, role),
        contract.LABEL_APP_NAME: APP_NAME,
        contract.LABEL_APP_INSTANCE: model,
        contract.LABEL_APP_COMPONENT: role,
        contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
    }


def _metadata(owner: Owner, name: str, role: str) -> Obj:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner.name, role),
        "ownerReferences": [owner.owner_reference()],
    }


def _key_use(owner: Owner, spec: DisaggregatedModelSpec) -> worker_key_secret.KeyUse | None:
    """Reconcile's plan, or from the spec alone: everyone, under the stand-in name that reconcile
    replaces before anything is applied."""
    if owner.worker_key is not None or not spec.worker_key.enabled:
        return owner.worker_key
    return worker_key_secret.KeyUse.final(worker_key_secret.pending(owner.name))


def router_key(owner: Owner, spec: DisaggregatedModelSpec) -> str | None:
    """The Secret whose key the router presents (None: it presents none)."""
    use = _key_use(owner, spec)
    return use.router if use is not None else None


def workers_key_use(owner: Owner, spec: DisaggregatedModelSpec) -> worker_key_secret.KeyUse:
    """What the prefill and decode pods use: the key they require and sign with, the other one
    they accept, and whether the side channel is lenient (all None/False: no key)."""
    use = _key_use(owner, spec)
    return use if use is not None else worker_key_secret.KeyUse()


def _mount_worker_key(
    secret: str | None, volumes: list[Obj], mounts: list[Obj], accepted: bool = False
) -> None:
    """Add a key's volume and mount from `secret` (nothing for None)."""
    if secret is not None:
        volume, mount = worker_key_secret.volume(secret, accepted)
        volumes.append(volume)
        mounts.append(mount)


def worker_key_secret_object(owner: Owner, spec: DisaggregatedModelSpec, key: str) -> Obj:
    """A new Secret for the model's worker key (of its current rotation), named by the API
    server."""
    meta = _metadata(owner, "", WORKER_KEY_ROLE)
    del meta["name"]
    meta["generateName"] = worker_key_secret.generate_name(owner.name, spec.worker_key.rotation)
    return worker_key_secret.secret(meta, key)


def served_name(owner: Owner, spec: DisaggregatedModelSpec) -> str:
    return spec.model.served_name or owner.name


# --- runtime (prefill / decode) -------------------------------------------------------------


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


def _field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _pod_identity_env() -> list[Obj]:
    """POD_IP, POD_NAME, POD_NAMESPACE from the downward API (runtime and router pods)."""
    return [
        _field_env(contract.ENV_POD_IP, "status.podIP"),
        _field_env(contract.ENV_POD_NAME, "metadata.name"),
        _field_env(contract.ENV_POD_NAMESPACE, "metadata.namespace"),
    ]


def runtime_env(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> list[Obj]:
    env = [
        *_pod_identity_env(),
        _field_env(contract.ENV_POD_UID, "metadata.uid"),
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


def _resources(res: ResourceRequirements | None, gpus: int = 0, extra: dict[str, int] | None = None) -> Obj:
    out: Obj = {}
    if res is not None:
        if res.requests:
            out["requests"] = {k: str(v) for k, v in res.requests.items()}
        if res.limits:
            out["limits"] = {k: str(v) for k, v in res.limits.items()}
    devices = {**({GPU_RESOURCE: gpus} if gpus > 0 else {}), **(extra or {})}
    if devices:
        # Extended resources are requested through limits (requests default to them).
        out["limits"] = {**out.get("limits", {}), **{k: str(v) for k, v in devices.items()}}
    return out


def _runtime_resources(role_spec: RoleSpec, extra: dict[str, int] | None) -> Obj:
    out = _resources(role_spec.resources, role_spec.gpus, extra)
    # the scheduler counts what /tmp holds only where a request says so
    out["requests"] = {"ephemeral-storage": RUNTIME_EPHEMERAL_STORAGE, **out.get("requests", {})}
    return out


def _router_resources(res: ResourceRequirements | None) -> Obj:
    """The router's defaults, overridden key by key by router.resources."""
    given = _resources(res)
    return {
        part: {**ROUTER_DEFAULT_RESOURCES[part], **given.get(part, {})} for part in ROUTER_DEFAULT_RESOURCES
    }


def pod_security_context() -> Obj:
    """Restricted Pod Security level: non-root, RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": NON_ROOT_UID,
        "runAsGroup": NON_ROOT_UID,
        "fsGroup": NON_ROOT_UID,
        # A volume of weights is large: change its ownership only when its root does not match.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(add: tuple[str, ...] = ()) -> Obj:
    capabilities: Obj = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = list(add)
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": capabilities}


def tmp_volume() -> tuple[Obj, Obj]:
    """(volume, mount) of the writable /tmp of a pod whose root filesystem is read-only."""
    return {"name": podtemplate.TMP_VOLUME, "emptyDir": {}}, {
        "name": podtemplate.TMP_VOLUME,
        "mountPath": TMP_DIR,
    }


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


def _spread(model: str, role: str) -> list[Obj]:
    """Same-role replicas prefer different nodes (a preference: never leaves a pod Pending)."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector_labels(model, role)},
        }
    ]


def gone_pods_name(model: str) -> str:
    """The ConfigMap in which the watchdog lists the model's deleted runtime pods."""
    return child_name(model, contract.GONE_PODS_SUFFIX)


def gone_pods_configmap(owner: Owner, document: str) -> Obj:
    """The watchdog's list of the model's gone runtime pods (``watchdog/gone_pods.py``), as the
    runtime pods mount it (``runtime_volumes``)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, gone_pods_name(owner.name), contract.GONE_PODS_SUFFIX),
        "data": {contract.GONE_PODS_KEY: document},
    }


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
    _mount_worker_key(keys.sign, volumes, mounts)
    _mount_worker_key(keys.other_accepted, volumes, mounts, accepted=True)
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


def _http_probe(path: str, port: str, period: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _runtime_probes(spec: DisaggregatedModelSpec) -> Obj:
    # Loading a real model takes minutes: the startup probe allows up to an hour, after
    # which liveness takes over. The synthetic engine needs seconds to a few minutes (it
    # imports SGLang's transfer code; a busy CPU-only node is slow).
    startup_failures = 360 if spec.engine == "sglang" else 150
    startup_period = 10 if spec.engine == "sglang" else 2
    http = contract.PORT_NAME_HTTP
    return {
        "startupProbe": _http_probe(contract.HEALTH_PATH, http, startup_period, startup_failures),
        "readinessProbe": _http_probe(contract.HEALTH_PATH, http, 5, 3),
        "livenessProbe": _http_probe(contract.HEALTH_PATH, http, 10, 3),
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
        "topologySpreadConstraints": _spread(owner.name, role),
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
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
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
    meta = _metadata(owner, child_name(owner.name, role), role)
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


# --- router -----------------------------------------------------------------------------------


def _selector_args(model: str, role: str, grouped: bool = False) -> list[str]:
    """The router discovers a group by its leader (rank 0: the StatefulSet's ordinal 0), which
    is ready only once every rank of its group has joined."""
    leader = {contract.LABEL_POD_INDEX: "0"} if grouped else {}
    return [f"{k}={v}" for k, v in {**selector_labels(model, role), **leader}.items()]


# SGLang's router (the model gateway, smg) as a module of the router image's Python.
ROUTER_MODULE: Final = "smg.launch_router"
# Its retry and circuit-breaker behaviour, set explicitly (models.ROUTER_RESILIENCE_OWNED_ARGS:
# spec.router.args may not change them). A retry is a new PD attempt: a new pair and a new
# bootstrap_room, so it never writes one request's KV into another's decode pages. smg retries
# 408, 429, 500, 502, 503 and 504; the runtime answers 503 for a room its deadline failed and
# while it stops. But smg picks the retry's pair by the same policy (cache_aware: the same
# prefix, the same pair), so the breaker is what sends it elsewhere: two failed attempts within
# ten seconds open both of their workers (smg counts a PD attempt's status against both) for a
# second, during which retries go to another pair; then one trial request either closes the
# breaker (a healthy partner blamed with the wedged pod) or opens it again (the wedged pod; that
# trial is retried the same way). One failure does not open it: with every decode blamed at once
# (a burst of failures through one wedged prefill) smg answers 503 "no available workers" at
# once, without retrying. Five attempts with backoff (100 ms doubling, at most 1 s) give a retry
# room to find another pair (docs/wedges.md, "What a client still sees").
ROUTER_RESILIENCE_ARGS: Final = (
    "--retry-max-retries",
    "5",
    "--retry-initial-backoff-ms",
    "100",
    "--retry-max-backoff-ms",
    "1000",
    "--retry-backoff-multiplier",
    "2",
    "--retry-jitter-factor",
    "0.2",
    "--cb-failure-threshold",
    "2",
    "--cb-success-threshold",
    "1",
    "--cb-timeout-duration-secs",
    "1",
    "--cb-window-duration-secs",
    "10",
)
# Whether a worker serves is the pods' readiness probes' and the watchdog's to say, never smg's:
# smg's own health checks (every 60 s, 5 s timeout, 3 failures) would take a live worker that is
# slow to answer (a CPU-starved node) out of routing, and under discovery smg by default also
# removes an unhealthy worker from its registry. Discovery (pod readiness) decides which
# workers smg has; retries cover a worker that fails a request meanwhile.
ROUTER_HEALTH_ARGS: Final = ("--disable-health-check", "--no-remove-unhealthy-workers")


def router_command(owner: Owner, spec: DisaggregatedModelSpec) -> list[str]:
    """smg in PD mode, discovering workers by pod labels in its namespace, on loopback behind
    `pdwarden runtime router`'s gate: the gate passes only the serving routes (smg's control
    plane answers no client) and presents the worker key, when the model has one, for every
    client."""
    pod_ip = f"$({contract.ENV_POD_IP})"
    smg = [
        "python",
        "-m",
        ROUTER_MODULE,
        "--host",
        "127.0.0.1",
        "--port",
        str(contract.ROUTER_LOOPBACK_PORT),
        "--pd-disaggregation",
        "--policy",
        spec.router.policy,
        "--service-discovery",
        "--service-discovery-namespace",
        f"$({contract.ENV_POD_NAMESPACE})",
        "--service-discovery-port",
        str(spec.transfer.port(contract.DEFAULT_HTTP_PORT)),
        "--prefill-selector",
        *_selector_args(owner.name, contract.ROLE_PREFILL, spec.prefill.grouped),
        "--decode-selector",
        *_selector_args(owner.name, contract.ROLE_DECODE, spec.decode.grouped),
        "--prometheus-host",
        pod_ip,
        "--prometheus-port",
        str(contract.ROUTER_METRICS_PORT),
        *ROUTER_RESILIENCE_ARGS,
        *ROUTER_HEALTH_ARGS,
        *spec.router.args,
    ]
    gate = ["pdwarden", "runtime", "router", "--host", pod_ip, "--port", str(contract.ROUTER_HTTP_PORT)]
    gate += ["--router-port", str(contract.ROUTER_LOOPBACK_PORT)]
    # smg routes by model under discovery: the gate names the model in a native /generate body
    # that names none (one model behind one router)
    gate += ["--served-model-name", served_name(owner, spec)]
    if router_key(owner, spec) is not None:
        gate += ["--worker-key-file", worker_key_secret.KEY_FILE]
    return [*gate, "--", *smg]


# Where a pod's API credentials are read by every Kubernetes client (smg's included).
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
# A bound token's life; the kubelet renews it at 80 % (the API server's default for the
# volume the ServiceAccount admission plugin adds).
TOKEN_EXPIRATION_S: Final = 3607


def router_token_volume() -> tuple[Obj, Obj]:
    """(volume, mount) of the router's API credentials for its container alone: what the
    ServiceAccount admission plugin mounts into every container of a pod with automount on
    (a bound token, the cluster's CA, the namespace), so that no sidecar reads pods."""
    volume = {
        "name": podtemplate.ROUTER_TOKEN_VOLUME,
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_S}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
        },
    }
    mount = {"name": podtemplate.ROUTER_TOKEN_VOLUME, "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}
    return volume, mount


def router_deployment(owner: Owner, spec: DisaggregatedModelSpec) -> Obj:
    role = contract.ROLE_ROUTER
    tmp, tmp_mount = tmp_volume()
    token, token_mount = router_token_volume()
    volumes, mounts = [tmp, token], [tmp_mount, token_mount]
    _mount_worker_key(router_key(owner, spec), volumes, mounts)
    container: Obj = {
        "name": ROUTER_CONTAINER,
        "image": spec.router.image or spec.image,
        "command": router_command(owner, spec),
        "ports": [
            {"name": contract.PORT_NAME_HTTP, "containerPort": contract.ROUTER_HTTP_PORT, "protocol": "TCP"},
            {
                "name": contract.PORT_NAME_METRICS,
                "containerPort": contract.ROUTER_METRICS_PORT,
                "protocol": "TCP",
            },
        ],
        "env": [
            *_pod_identity_env(),
        ],
        "resources": _router_resources(spec.router.resources),
        # Liveness only after the router has started (slow on a busy node); /readiness
        # answers 503 until the router has healthy prefill and decode workers.
        "startupProbe": _http_probe("/liveness", contract.PORT_NAME_HTTP, 2, 150),
        "readinessProbe": _http_probe("/readiness", contract.PORT_NAME_HTTP, 5, 3),
        "livenessProbe": _http_probe("/liveness", contract.PORT_NAME_HTTP, 10, 3),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    template = {
        "metadata": {"labels": labels(owner.name, role)},
        "spec": {
            "serviceAccountName": child_name(owner.name, role),
            # Discovery reads pods with this account's token, mounted into the router container
            # only (router_token_volume): a sidecar gets none.
            "automountServiceAccountToken": False,
            "securityContext": pod_security_context(),
            "topologySpreadConstraints": _spread(owner.name, role),
            "volumes": volumes,
            "containers": [container],
            "terminationGracePeriodSeconds": 30,
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": selector_labels(owner.name, role)},
            "template": podtemplate.merge(template, spec.router.pod_template),
        },
    }


# The worker key's Secret: labelled as a part of the model of its own.
WORKER_KEY_ROLE: Final = contract.WORKER_KEY_SECRET_INFIX


# The prefill and decode pods' ServiceAccount: one per model, with no token, so that a runtime
# pod never runs as the namespace's default account (which others may have granted rights to).
RUNTIME_ACCOUNT: Final = "runtime"


def runtime_service_account_name(model: str) -> str:
    return child_name(model, RUNTIME_ACCOUNT)


def runtime_service_account(owner: Owner) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(owner, runtime_service_account_name(owner.name), RUNTIME_ACCOUNT),
        "automountServiceAccountToken": False,
    }


def router_service_account(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
    }


def router_role(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
        # Service discovery only reads pods in its own namespace.
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }


def router_role_binding(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    name = child_name(owner.name, role)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(owner, name, role),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }


def router_service(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name, role),
            "ports": [
                {
                    "name": contract.PORT_NAME_HTTP,
                    "port": contract.ROUTER_HTTP_PORT,
                    "targetPort": contract.PORT_NAME_HTTP,
                    "protocol": "TCP",
                },
                {
                    "name": contract.PORT_NAME_METRICS,
                    "port": contract.ROUTER_METRICS_PORT,
                    "targetPort": contract.PORT_NAME_METRICS,
                    "protocol": "TCP",
                },
            ],
        },
    }


def pod_disruption_budgets(owner: Owner, spec: DisaggregatedModelSpec) -> list[Obj]:
    """A budget for each role that runs pods. A role scaled to zero gets none (an autoscaled
    role never is: its floor is one pod): there is nothing to protect, and the budget, its
    status and the disruption controller's `NoPods` event (created, then updated) were 12 of
    the 46 API writes a new idle model cost. Scaling the role up renders the budget again;
    scaling it to zero deletes it (`OPTIONAL_KINDS`)."""
    return [
        pod_disruption_budget(owner, spec, role)
        for role in ROLES
        if replicas.desired(spec, role, owner.deployed.get(role)) > 0
    ]


def pod_disruption_budget(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "maxUnavailable": spec.watchdog.max_unavailable,
            "selector": {"matchLabels": selector_labels(owner.name, role)},
        },
    }


def network_policy(owner: Owner, spec: DisaggregatedModelSpec) -> Obj:
    """Ingress to the model's prefill and decode pods: its router to HTTP, its own runtime pods
    to every port (bootstrap; NIXL, UCX and side channels use ephemeral ports), the metrics
    peers to metrics. A named port follows hostPortOffset."""
    runtime_pods = {
        "matchLabels": {contract.LABEL_MODEL: owner.name},
        "matchExpressions": [
            {
                "key": contract.LABEL_ROLE,
                "operator": "In",
                # a quarantined pod still finishes its healthy requests' transfers while it drains
                "values": [contract.ROLE_PREFILL, contract.ROLE_DECODE, contract.ROLE_QUARANTINED],
            }
        ],
    }
    router_pods = {"matchLabels": selector_labels(owner.name, contract.ROLE_ROUTER)}
    metrics_from = _metrics_peers(spec)
    suffix = NETWORK_POLICY_SUFFIX
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(owner, child_name(owner.name, suffix), suffix),
        "spec": {
            "podSelector": runtime_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": router_pods}],
                    "ports": [{"protocol": "TCP", "port": contract.PORT_NAME_HTTP}],
                },
                {"from": [{"podSelector": runtime_pods}]},
                {"from": metrics_from, "ports": [{"protocol": "TCP", "port": contract.PORT_NAME_METRICS}]},
            ],
        },
    }


def _metrics_peers(spec: DisaggregatedModelSpec) -> list[Obj]:
    peers = spec.network_policy.metrics_from
    return [dict(p) for p in (peers if peers is not None else DEFAULT_METRICS_PEERS)]


def router_network_policy(owner: Owner, spec: DisaggregatedModelSpec) -> Obj:
    """Ingress to the model's router pods: clients to its HTTP port, the metrics peers to its
    metrics port, nothing else."""
    role = contract.ROLE_ROUTER
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(owner.name, role)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": contract.PORT_NAME_HTTP}]},
                {
                    "from": _metrics_peers(spec),
                    "ports": [{"protocol": "TCP", "port": contract.PORT_NAME_METRICS}],
                },
            ],
        },
    }


ROLES = (contract.ROLE_PREFILL, contract.ROLE_DECODE, contract.ROLE_ROUTER)
# Every kind a model's children may be, as (apiVersion, kind): the operator watches, lists
# before start and may delete these (handlers.py), and the chart's RBAC grants them.
CHILD_KINDS: Final = (
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)
# Kinds rendered only when the spec asks for them: one that is observed but no longer rendered
# is deleted.
# (A group's StatefulSet after a scale-down, a role's Deployment or ranks Service after its
# nodesPerReplica changed, a role's PodDisruptionBudget once it is scaled to zero.)
OPTIONAL_KINDS = ("NetworkPolicy", "StatefulSet", "Deployment", "Service", "PodDisruptionBudget")
# Kinds whose content the spec shapes freely (a pod template, NetworkPolicy peers): the API
# server dry-runs them before anything is applied.
USER_SHAPED_KINDS = ("Deployment", "StatefulSet", "NetworkPolicy")


def spec_field(obj: Obj) -> str:
    """The part of the spec a child's content comes from (for messages)."""
    role = obj["metadata"]["labels"].get(contract.LABEL_ROLE, "")
    if obj["kind"] == "NetworkPolicy":
        return "spec.networkPolicy"
    if obj["kind"] in ("Deployment", "StatefulSet") and role in ROLES:
        return f"spec.{role} (podTemplate, resources, env, image)"
    return "spec"


def render_children(owner: Owner, spec: DisaggregatedModelSpec) -> list[Obj]:
    """Every child of one DisaggregatedModel; reconcile applies them in `plan.apply_waves`'
    order (what pods depend on first), each wave at once."""
    return [
        *runtime_workloads(owner, spec, contract.ROLE_PREFILL),
        *runtime_workloads(owner, spec, contract.ROLE_DECODE),
        runtime_service_account(owner),
        router_service_account(owner),
        router_role(owner),
        router_role_binding(owner),
        router_deployment(owner, spec),
        router_service(owner),
        *pod_disruption_budgets(owner, spec),
        *(
            [network_policy(owner, spec), router_network_policy(owner, spec)]
            if spec.network_policy.enabled
            else []
        ),
    ]


def child_key(obj: Obj) -> tuple[str, str]:
    """(kind, name): how children are matched with what the cluster holds."""
    return obj["kind"], obj["metadata"]["name"]
