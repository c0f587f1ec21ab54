"""The DisaggregatedModel resource as pydantic models: the single source of the CRD schema.

Field names are camelCase on the wire (aliases) and snake_case in Python. Every field has a
description (it becomes `kubectl explain` text), sensible defaults and bounds. Cross-field
rules are `Rule`s, each written once: its CEL (`x-kubernetes-validations`, enforced by the API
server at `kubectl apply`) and the same check on the parsed model (enforced again when the
operator reads a body, so an object stored under an older CRD still fails, with the message
the API server would give).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Literal, Self, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

import pdwarden_contract as contract
from pdwarden_operator import podtemplate

# Power-of-two tensor-parallel sizes that SGLang accepts on one node.
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_IMAGE = "ghcr.io/pdwarden/pdwarden-runtime:0.1.0"
GPU_RESOURCE = "nvidia.com/gpu"
# Env vars the operator sets itself on runtime pods; a user may not override them.
RESERVED_ENV = podtemplate.RESERVED_ENV
# /dev/shm of a GPU pod when the role does not size it: NCCL and SGLang's tensor parallelism
# need far more than a container's 64 MiB.
DEFAULT_SHM_SIZE = "16Gi"
# The router's requests and limits unless router.resources says otherwise (key by key).
ROUTER_DEFAULT_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "500m", "memory": "512Mi", "ephemeral-storage": "64Mi"},
    "limits": {"cpu": "2", "memory": "2Gi"},
}
# What a runtime pod writes outside its volumes: /tmp (an emptyDir), where JIT and compile caches go.
RUNTIME_EPHEMERAL_STORAGE = "2Gi"
# Extended resource names (a domain prefix is required for device-plugin resources).
EXTENDED_RESOURCE_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
# Children are named `<name>-prefill` etc. and the name is a label value and a Service
# name, so it must be a DNS-1035 label short enough for the suffixes.
MAX_NAME_LENGTH = 40
# status.watchdog.remediations keeps the latest this many (watchdog/state.py drops older ones)
MAX_REMEDIATIONS_KEPT = 20
WatchdogAction = Literal["alert", "restart", "evict", "drain"]  # spec.watchdog.action
WATCHDOG_ACTIONS: tuple[WatchdogAction, ...] = get_args(WatchdogAction)
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _rules(*entries: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(entries)}


@dataclass(frozen=True)
class Rule:
    """A rule across a model's fields, once: `cel` for the API server (over the object as the
    wire has it), `holds` for the operator (over the parsed model), one message for both."""

    cel: str
    message: str
    holds: Callable[[Any], bool]
    field_path: str | None = None  # where the API server reports a break, e.g. ".minReplicas"


def _schema_rules(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """A model's `RULES` in its schema, as x-kubernetes-validations."""
    rules: tuple[Rule, ...] = getattr(model, "RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [cel(r.cel, r.message, r.field_path) for r in rules]


class _Base(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        json_schema_extra=_schema_rules,
    )
    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _rules_hold(self) -> Self:
        broken = [rule.message for rule in self.RULES if not rule.holds(self)]
        if broken:
            raise ValueError("; ".join(broken))
        return self


# Kubernetes quantity syntax (resource.Quantity): a number and an SI, binary or exponent suffix.
_QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not _QUANTITY.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 4Gi, 2)")
    return value


# A Kubernetes quantity ("500m", "4Gi", 2): an int-or-string in the schema.
Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "description": "A Kubernetes quantity, e.g. 500m, 4Gi or 2.",
        }
    ),
]

# For a lone Quantity field (the schema's int-or-string accepts any string).
_QUANTITY_RULE = _rules(cel("isQuantity(string(self))", "must be a Kubernetes quantity (e.g. 16Gi)"))

ResourceMap = Annotated[
    dict[str, Quantity],
    Field(
        max_length=8,  # bounds the CEL cost of the quantity rule
        json_schema_extra=_rules(
            cel("self.all(k, isQuantity(string(self[k])))", "every value must be a Kubernetes quantity"),
        ),
    ),
]


def _no_gpus_in(part: str) -> Callable[[Any], bool]:
    return lambda resources: GPU_RESOURCE not in (getattr(resources, part) or {})


class ResourceRequirements(_Base):
    """CPU and memory for each pod of a role. GPUs are set with the role's `gpus` field."""

    RULES = tuple(
        Rule(
            f"!has(self.{part}) || !('{GPU_RESOURCE}' in self.{part})",
            f"do not set {GPU_RESOURCE} here: use the role's `gpus` field",
            _no_gpus_in(part),
            f".{part}",
        )
        for part in ("requests", "limits")
    )

    requests: ResourceMap | None = Field(
        None, description="Minimum resources per pod, e.g. {cpu: 4, memory: 32Gi}."
    )
    limits: ResourceMap | None = Field(None, description="Maximum resources per pod, e.g. {memory: 64Gi}.")


class EnvVar(_Base):
    """An environment variable for the role's container."""

    RULES = (
        Rule(
            "has(self.value) != has(self.valueFrom)",
            "exactly one of value and valueFrom must be set",
            lambda e: (e.value is None) != (e.value_from is None),
        ),
        Rule(
            "!(self.name in " + str(list(RESERVED_ENV)).replace("'", '"') + ")",
            "this variable is set by pdwarden and cannot be overridden",
            lambda e: e.name not in RESERVED_ENV,
            ".name",
        ),
    )

    name: str = Field(
        description="Variable name.",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$",
    )
    value: str | None = Field(None, description="Literal value.", max_length=32768)
    value_from: dict[str, Any] | None = Field(
        None,
        description="Source of the value, as in a Pod's env[].valueFrom "
        "(secretKeyRef, configMapKeyRef, fieldRef).",
    )


def _no_owned_fields(main: str) -> Any:
    def check(value: dict[str, Any]) -> dict[str, Any]:
        problems = podtemplate.owned_violations(value, main)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    return AfterValidator(check)


# A PodTemplateSpec fragment (see podtemplate.py: the merge and the fields pdwarden owns).
RuntimePodTemplate = Annotated[
    dict[str, Any],
    _no_owned_fields(podtemplate.RUNTIME_CONTAINER),
    WithJsonSchema(podtemplate.schema(podtemplate.RUNTIME_CONTAINER)),
]
RouterPodTemplate = Annotated[
    dict[str, Any],
    _no_owned_fields(podtemplate.ROUTER_CONTAINER),
    WithJsonSchema(podtemplate.schema(podtemplate.ROUTER_CONTAINER)),
]


class SecretKeyRef(_Base):
    """A key of a Secret in the model's namespace (read by the kubelet, never by the operator)."""

    name: str = Field(description="Secret name.", min_length=1, max_length=253)
    key: str = Field("token", description="Key in the Secret.", min_length=1, max_length=253)


class ModelCache(_Base):
    """Where downloaded weights are kept. Neither claimName nor hostPath: an emptyDir, which
    survives container restarts but not a new pod."""

    RULES = (
        Rule(
            "!(has(self.claimName) && has(self.hostPath))",
            "set at most one of claimName and hostPath",
            lambda c: c.claim_name is None or c.host_path is None,
        ),
    )

    claim_name: str | None = Field(
        None,
        description="A PersistentVolumeClaim that keeps the cache across pods (ReadWriteMany when "
        "pods of several nodes share it): a new pod finds the weights already there.",
        min_length=1,
        max_length=253,
    )
    host_path: str | None = Field(
        None,
        description="A directory on the node that keeps the cache for every pod of that node. "
        "hostPath volumes are refused by the baseline and restricted Pod Security levels.",
        pattern=r"^/.*",
        max_length=4096,
    )
    size_limit: Quantity | None = Field(
        None, description="Size limit of the emptyDir cache.", json_schema_extra=_QUANTITY_RULE
    )


class HuggingFaceSource(_Base):
    """Download `path` (a Hugging Face id) into a cache volume at start; later starts reuse it."""

    token_secret_ref: SecretKeyRef | None = Field(
        None, description="The Hugging Face token (HF_TOKEN), for gated or private models."
    )
    cache: ModelCache = Field(
        default_factory=lambda: ModelCache.model_validate({}),
        description="The cache volume, mounted at /cache (HF_HOME=/cache/huggingface).",
    )


class PersistentVolumeClaimSource(_Base):
    """Weights on a PersistentVolumeClaim, mounted read-only at /models."""

    claim_name: str = Field(description="PersistentVolumeClaim name.", min_length=1, max_length=253)
    sub_path: str | None = Field(
        None,
        description="Mount only this directory of the volume.",
        max_length=4096,
        pattern=r"^[^/].*",
    )


class HostPathSource(_Base):
    """Weights in a directory of the node, mounted read-only at /models. hostPath volumes are
    refused by the baseline and restricted Pod Security levels."""

    path: str = Field(description="Absolute directory on the node.", pattern=r"^/.*", max_length=4096)


class ModelRef(_Base):
    """Which model to serve, and where its weights come from (at most one of huggingFace,
    persistentVolumeClaim and hostPath; none: `path` is given to SGLang as it is)."""

    RULES = (
        Rule(
            "[has(self.huggingFace), has(self.persistentVolumeClaim), has(self.hostPath)]"
            ".filter(x, x).size() <= 1",
            "set at most one of huggingFace, persistentVolumeClaim and hostPath",
            lambda m: [m.hugging_face, m.persistent_volume_claim, m.host_path].count(None) >= 2,
        ),
        Rule(
            "!(has(self.persistentVolumeClaim) || has(self.hostPath)) || "
            "(!self.path.startsWith('/') && !self.path.matches('(^|/)[.][.](/|$)'))",
            "with persistentVolumeClaim or hostPath, path is relative to the volume "
            "(mounted at /models), without '..'",
            lambda m: not m.volume or (not m.path.startswith("/") and ".." not in m.path.split("/")),
            ".path",
        ),
    )

    path: str = Field(
        description="The model: a Hugging Face id (no storage, or huggingFace), or the model's "
        "directory relative to the volume (persistentVolumeClaim, hostPath; '.' for its root). "
        "SGLang gets it as --model-path (the synthetic engine ignores it).",
        min_length=1,
        max_length=512,
    )
    hugging_face: HuggingFaceSource | None = Field(
        None, description="Download from the Hugging Face Hub into a cache volume."
    )
    persistent_volume_claim: PersistentVolumeClaimSource | None = Field(
        None, description="Weights on a PersistentVolumeClaim (read-only)."
    )
    host_path: HostPathSource | None = Field(None, description="Weights on the node (read-only).")
    served_name: str | None = Field(
        None,
        description="Name clients use in requests (--served-model-name). Defaults to the resource name.",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
    )

    @property
    def volume(self) -> bool:
        """Whether the weights are on a volume mounted at /models."""
        return self.persistent_volume_claim is not None or self.host_path is not None


class RdmaSpec(_Base):
    """KV transfers over RDMA: the device-plugin resource each runtime pod gets, and the IB
    devices SGLang's NIXL backend uses. Adds the IPC_LOCK capability (memory registration),
    which the baseline and restricted Pod Security levels refuse."""

    RULES = (
        Rule(
            f"self.resourceName != '{GPU_RESOURCE}'",
            "GPUs are set with the role's gpus",
            lambda r: r.resource_name != GPU_RESOURCE,
            ".resourceName",
        ),
    )

    resource_name: str = Field(
        description="The RDMA device plugin's resource, e.g. rdma/ib or rdma/rdma_shared_device_a.",
        max_length=253,
        pattern=EXTENDED_RESOURCE_PATTERN,
    )
    count: int = Field(1, description="Devices of that resource per pod.", ge=1, le=64)
    ib_devices: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]+$", max_length=64)]] = Field(
        default_factory=list,
        description="IB devices for SGLang's --disaggregation-ib-device, e.g. [mlx5_0, mlx5_1].",
        max_length=16,
    )


class TransferSpec(_Base):
    """How KV caches move from prefill to decode, and the runtime's self-heal deadlines."""

    RULES = (
        Rule(
            "self.transferDeadlineSeconds <= self.inflightDeadlineSeconds",
            "transferDeadlineSeconds must not exceed inflightDeadlineSeconds",
            lambda t: t.transfer_deadline_seconds <= t.inflight_deadline_seconds,
            ".transferDeadlineSeconds",
        ),
        Rule(
            "self.hostNetwork || self.hostPortOffset == 0",
            "hostPortOffset needs hostNetwork",
            lambda t: t.host_network or t.host_port_offset == 0,
            ".hostPortOffset",
        ),
    )

    backend: Literal["nixl"] = Field("nixl", description="KV transfer backend. Only nixl is supported.")
    ucx_transports: str | None = Field(
        None,
        description="UCX transports for NIXL (UCX_TLS), e.g. rc,cuda_copy. Unset: UCX chooses.",
        max_length=256,
        pattern=r"^\^?[a-z0-9_]+(,[a-z0-9_]+)*$",
    )
    inflight_deadline_seconds: int = Field(
        contract.DEFAULT_INFLIGHT_DEADLINE_S,
        description="The runtime fails a KV room that has waited for or moved KV longer than this, "
        "counted from when it leaves Bootstrapping (queueing for bootstrap is not counted), on "
        "prefill and on decode (self-heal).",
        ge=1,
        le=86400,
    )
    transfer_deadline_seconds: int = Field(
        contract.DEFAULT_TRANSFER_DEADLINE_S,
        description=(
            "A KV chunk whose NIXL writes are not all done this long after they were posted fails "
            "its room on prefill; its NIXL handles are kept and polled until they can no longer "
            "write, and only then is decode told its pages are free."
        ),
        ge=1,
        le=86400,
    )
    rdma: RdmaSpec | None = Field(None, description="RDMA devices for KV transfers.")
    host_network: bool = Field(
        False,
        description="Run prefill and decode pods on the node's network (RDMA over RoCE without "
        "SR-IOV). Their ports become host ports, so the scheduler never puts two pods whose ports "
        "clash on one node: one pod of this model per node (prefill and decode share the "
        "ports the router discovers); models that share nodes need different hostPortOffsets. "
        "Refused by the baseline and restricted Pod Security levels.",
    )
    host_port_offset: int = Field(
        0,
        description="Added to every runtime port (HTTP 30000, bootstrap 8998, metrics 9400) "
        "with hostNetwork; keep offsets of models sharing nodes at least 1000 apart.",
        ge=0,
        le=30000,
    )

    def port(self, base: int) -> int:
        """A runtime port as the pods use it (shifted with hostNetwork)."""
        return base + self.host_port_offset


class ScalePolicy(_Base):
    """How fast one direction of scaling may go."""

    stabilization_seconds: int = Field(
        description="Look-back window: scaling up takes the lowest recommendation of the window, "
        "scaling down the highest, so a brief spike or lull moves nothing.",
        ge=0,
        le=3600,
    )
    max_step: int = Field(description="Pods added (or removed) at most per periodSeconds.", ge=1, le=64)
    period_seconds: int = Field(description="The period maxStep counts over.", ge=1, le=3600)


class AutoscalingTarget(_Base):
    """The load one pod should carry; the role scales so that the mean over its ready, unwedged
    pods meets every target set (the highest ratio decides). A wedged pod's queue is not demand:
    the watchdog remediates it."""

    RULES = (
        Rule(
            "has(self.inflightPerPod) || has(self.queueAgeSeconds) || has(self.kvPagesInUse)",
            "set at least one of inflightPerPod, queueAgeSeconds and kvPagesInUse",
            lambda t: any(
                x is not None for x in (t.inflight_per_pod, t.queue_age_seconds, t.kv_pages_in_use)
            ),
        ),
    )

    inflight_per_pod: float | None = Field(
        None,
        description="Requests in flight per pod (rooms between arrival and the end of their KV "
        "transfer): the load of either role.",
        gt=0,
        le=100000,
    )
    queue_age_seconds: float | None = Field(
        None,
        description="Prefill only: age of each pod's oldest request in flight, in seconds (how long "
        "a new request waits for prefill).",
        gt=0,
        le=3600,
    )
    kv_pages_in_use: float | None = Field(
        None,
        description="Decode only: KV-cache pages in use per pod (the runtime's pdwarden_kv_pages_in_use).",
        gt=0,
        le=1e9,
    )


def _policy(stabilization: int, step: int, period: int, description: str) -> Any:
    values: dict[str, Any] = {"stabilizationSeconds": stabilization, "maxStep": step, "periodSeconds": period}
    return Field(
        default_factory=lambda: ScalePolicy.model_validate(values),
        description=f"{description} Default: " + ", ".join(f"{k} {v}" for k, v in values.items()) + ".",
        json_schema_extra={"default": values},
    )


class AutoscalingSpec(_Base):
    """pdwarden scales the role between minReplicas and maxReplicas on its pods' load (or lets an
    autoscaler of yours drive the role's Deployment through its scale subresource)."""

    RULES = (
        Rule(
            "self.minReplicas <= self.maxReplicas",
            "minReplicas must not exceed maxReplicas",
            lambda a: a.min_replicas <= a.max_replicas,
            ".minReplicas",
        ),
    )

    min_replicas: int = Field(1, description="Fewest pods.", ge=1, le=512)
    max_replicas: int = Field(description="Most pods.", ge=1, le=512)
    driver: Literal["pdwarden", "external"] = Field(
        "pdwarden",
        description="pdwarden: the operator scales on `target`. external: an autoscaler of yours "
        "(HorizontalPodAutoscaler, KEDA) sets the Deployment's scale; pdwarden keeps it within "
        "[minReplicas, maxReplicas] and never reverts it.",
    )
    target: AutoscalingTarget = Field(
        default_factory=lambda: AutoscalingTarget.model_validate({"inflightPerPod": 8}),
        description="The load per pod to scale for. Default: {inflightPerPod: 8}.",
        json_schema_extra={"default": {"inflightPerPod": 8}},
    )
    scale_up: ScalePolicy = _policy(30, 2, 60, "How fast pods are added.")
    scale_down: ScalePolicy = _policy(300, 1, 120, "How fast pods are removed (each drains first).")


class RatioBand(_Base):
    """Prefill pods per decode pod, kept inside [min, max] whenever replicas change."""

    RULES = (Rule("self.min <= self.max", "min must not exceed max", lambda b: b.min <= b.max, ".min"),)

    min: float = Field(description="Fewest prefill pods per decode pod, e.g. 0.5.", gt=0, le=64)
    max: float = Field(description="Most prefill pods per decode pod, e.g. 2.", gt=0, le=64)


AUTOSCALING_GROUPS_MESSAGE = "autoscaling scales single-pod replicas only (nodesPerReplica 1)"


class RoleSpec(_Base):
    """One side of the disaggregated pair (prefill or decode): a Deployment of runtime pods."""

    RULES = (
        Rule(
            f"self.tensorParallel in {list(TENSOR_PARALLEL_SIZES)}",
            "tensorParallel must be a power of two between 1 and 64",
            lambda r: r.tensor_parallel in TENSOR_PARALLEL_SIZES,
            ".tensorParallel",
        ),
        Rule(
            "self.tensorParallel <= (self.gpus > 0 ? self.gpus : 1) * self.nodesPerReplica",
            "tensorParallel must not exceed the GPUs of one replica "
            "(gpus x nodesPerReplica; gpus counts as 1 without GPUs)",
            lambda r: r.tensor_parallel <= max(r.gpus, 1) * r.nodes_per_replica,
            ".tensorParallel",
        ),
        Rule(
            "self.nodesPerReplica == 1 || self.tensorParallel % self.nodesPerReplica == 0",
            "with nodesPerReplica > 1, tensorParallel must be a multiple of nodesPerReplica "
            "(SGLang gives every node tensorParallel / nodesPerReplica ranks)",
            lambda r: r.nodes_per_replica == 1 or r.tensor_parallel % r.nodes_per_replica == 0,
            ".tensorParallel",
        ),
        Rule(
            "!has(self.autoscaling) || self.nodesPerReplica == 1",
            AUTOSCALING_GROUPS_MESSAGE,
            lambda r: r.autoscaling is None or r.nodes_per_replica == 1,
            ".autoscaling",
        ),
    )

    replicas: int = Field(
        1,
        description="Number of replicas of this role: pods, or groups of nodesPerReplica pods.",
        ge=0,
        le=512,
    )
    nodes_per_replica: int = Field(
        1,
        description="Pods (nodes) per replica. 1: one pod per replica (a Deployment). N > 1: each "
        "replica is a group of N pods, rank 0 (the leader, which serves HTTP and KV transfers) and "
        "N-1 workers, each with `gpus`, started as one StatefulSet per group on distinct nodes "
        "(SGLang's --nnodes, --node-rank, --dist-init-addr); the group is restarted as a whole.",
        ge=1,
        le=64,
    )
    tensor_parallel: int = Field(
        1,
        description="Tensor-parallel size (--tp) of each replica: a power of two, at most "
        "gpus x nodesPerReplica.",
        ge=1,
        le=64,
    )
    gpus: int = Field(0, description="GPUs per pod, requested as nvidia.com/gpu. 0: CPU only.", ge=0, le=64)
    # A field of its own: a podTemplate's `tolerations: null` is pruned on its way through the
    # API server, so it cannot drop the default toleration; false can.
    gpu_toleration: bool = Field(
        True,
        description="true: pods that request GPUs (gpus > 0) tolerate the GPU nodes' taint "
        f"{GPU_RESOURCE}:NoSchedule (operator Exists), unless podTemplate.spec.tolerations has "
        f"one for the key {GPU_RESOURCE}, which replaces it. false: pdwarden adds no GPU "
        "toleration; the pods tolerate only what podTemplate.spec.tolerations lists.",
    )
    resources: ResourceRequirements | None = Field(
        None,
        description="CPU and memory requests and limits per pod. Without an ephemeral-storage "
        f"request, {RUNTIME_EPHEMERAL_STORAGE} is requested (the /tmp scratch volume: JIT and "
        "compile caches).",
    )
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        description="Extra arguments: SGLang server args for engine sglang (after --), "
        "runtime flags for engine synthetic.",
        max_length=128,
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        description="Extra environment variables for the container.",
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    shared_memory: Quantity | None = Field(
        None,
        description=f"Size of the in-memory emptyDir at /dev/shm (NCCL, tensor parallelism). "
        f"Unset: {DEFAULT_SHM_SIZE} when gpus > 0, none without GPUs; 0: none. It counts against "
        "the pod's memory limit.",
        json_schema_extra=_QUANTITY_RULE,
    )
    pod_template: RuntimePodTemplate | None = Field(None)
    autoscaling: AutoscalingSpec | None = Field(
        None,
        description="Scale the role on its load. `replicas` is then only the first count (kept "
        "within the bounds); the Deployment holds the count from there on.",
    )

    @property
    def shm_size(self) -> str | None:
        """The /dev/shm size to mount, or None for none."""
        if self.shared_memory is None:
            return DEFAULT_SHM_SIZE if self.gpus > 0 else None
        size = str(self.shared_memory)
        return None if re.fullmatch(r"\+?0*(\.0*)?[A-Za-z]*", size) else size

    @model_validator(mode="after")
    def _env_names_unique(self) -> RoleSpec:
        # the API server's side of this is the env list's map type (keyed by name)
        names = [e.name for e in self.env]
        if len(names) != len(set(names)):
            raise ValueError("env names must be unique")
        return self

    @property
    def grouped(self) -> bool:
        """Whether a replica spans several pods (a group)."""
        return self.nodes_per_replica > 1


# smg's options the router pod owns: where smg listens (loopback, behind the gate: on another
# address its control plane would face clients) and its keys.
ROUTER_LISTEN_ARGS: Final = ("--host", "--port", "--api-key", "--control-plane-api-keys")
# ... and its health checks and removal of workers (render.ROUTER_HEALTH_ARGS: off), every
# spelling smg 1.13.0 takes: whether a worker serves is its pod's readiness and the watchdog's
# to say, never smg's.
ROUTER_HEALTH_OWNED_ARGS: Final = (
    "--disable-health-check",
    "--health-check-interval-secs",
    "--health-check-timeout-secs",
    "--health-check-endpoint",
    "--health-failure-threshold",
    "--health-success-threshold",
    "--remove-unhealthy-workers",
    "--no-remove-unhealthy-workers",
    "--worker-auto-recovery",
    "--no-worker-auto-recovery",
)
# ... and its retries and circuit breaker (render.ROUTER_RESILIENCE_ARGS), every spelling smg
# 1.13.0 takes: a request caught in a wedged room is answered by another pair only with them.
ROUTER_RESILIENCE_OWNED_ARGS: Final = (
    "--retry-max-retries",
    "--retry-initial-backoff-ms",
    "--retry-max-backoff-ms",
    "--retry-backoff-multiplier",
    "--retry-jitter-factor",
    "--disable-retries",
    "--cb-failure-threshold",
    "--cb-success-threshold",
    "--cb-timeout-duration-secs",
    "--cb-window-duration-secs",
    "--disable-circuit-breaker",
)
# argparse takes any unambiguous prefix of an option, so a prefix of one of these is refused too.
ROUTER_OWNED_ARGS: Final = (*ROUTER_LISTEN_ARGS, *ROUTER_HEALTH_OWNED_ARGS, *ROUTER_RESILIENCE_OWNED_ARGS)


def _router_args_not_owned(args: list[str]) -> list[str]:
    for arg in args:
        name = arg.partition("=")[0]
        if len(name) < 3 or not name.startswith("--"):
            continue
        owned = [flag for flag in ROUTER_OWNED_ARGS if flag.startswith(name)]
        if owned:
            if owned[0] in ROUTER_HEALTH_OWNED_ARGS:
                why = (
                    "smg takes no worker out of routing on its own judgement: the pods' readiness "
                    "and the watchdog decide"
                )
            elif owned[0] in ROUTER_RESILIENCE_OWNED_ARGS:
                why = "retries and the circuit breaker send a request caught in a wedge to another pair"
            else:
                why = "smg listens on loopback behind the model's gate, with keys of the gate's own"
            raise ValueError(f"{name} is set by the router pod ({owned[0]}: {why}); leave it out")
    return args


class RouterSpec(_Base):
    """SGLang's router (smg) in front: discovers prefill and decode pods and routes requests."""

    RULES = (
        Rule(
            "self.nodesPerReplica == 1",
            "the router runs as single pods: nodesPerReplica must be 1 (only prefill and decode "
            "replicas span several nodes)",
            lambda r: r.nodes_per_replica == 1,
            ".nodesPerReplica",
        ),
    )

    replicas: int = Field(1, description="Number of router pods.", ge=0, le=64)
    nodes_per_replica: int = Field(
        1, description="Always 1: a router replica is one pod (prefill and decode may span nodes).", ge=1
    )
    policy: Literal["random", "round_robin", "cache_aware", "power_of_two"] = Field(
        "cache_aware", description="Load-balancing policy for both prefill and decode."
    )
    image: str | None = Field(
        None,
        description="Router image (with smg, SGLang's router). Defaults to the runtime image.",
        min_length=1,
        max_length=512,
    )
    resources: ResourceRequirements | None = Field(
        None,
        description="CPU and memory per router pod, merged key by key over the defaults: "
        + ", ".join(f"{part} {vals}" for part, vals in ROUTER_DEFAULT_RESOURCES.items())
        + ".",
    )
    args: Annotated[list[Annotated[str, Field(max_length=4096)]], AfterValidator(_router_args_not_owned)] = (
        Field(
            default_factory=list,
            description="Extra arguments of the router (smg launch_router); not "
            + ", ".join(ROUTER_OWNED_ARGS)
            + " (the router pod sets them).",
            max_length=64,
        )
    )
    pod_template: RouterPodTemplate | None = Field(None)


# The runtime's self-heal comes first (default inflightDeadlineSeconds 300): the operator's
# threshold sits a minute above it, so a wedge the operator sees is one the runtime could not heal.
DEFAULT_STUCK_AFTER_S = 360
MIN_COOLDOWN_S = 60


class WatchdogSpec(_Base):
    """How the operator finds and remediates wedged pods (inflight queue with no progress)."""

    RULES = (
        Rule(
            "self.stuckAfterSeconds >= 2 * self.scrapeIntervalSeconds",
            "stuckAfterSeconds must be at least two scrape intervals (a wedge needs two scrapes)",
            lambda w: w.stuck_after_seconds >= 2 * w.scrape_interval_seconds,
            ".stuckAfterSeconds",
        ),
        Rule(
            "self.budgetWindowSeconds >= self.stuckAfterSeconds",
            "budgetWindowSeconds must be at least stuckAfterSeconds",
            lambda w: w.budget_window_seconds >= w.stuck_after_seconds,
            ".budgetWindowSeconds",
        ),
        Rule(
            "self.action != 'drain' || self.drainSeconds >= 2 * self.scrapeIntervalSeconds",
            "drainSeconds must be at least two scrape intervals when action is drain (the default)",
            lambda w: w.action != "drain" or w.drain_seconds >= 2 * w.scrape_interval_seconds,
            ".drainSeconds",
        ),
    )

    stuck_after_seconds: int = Field(
        DEFAULT_STUCK_AFTER_S,
        description="A pod whose rooms in flight make no progress for this long, or whose oldest room "
        "stays in Transferring this long, is wedged. Must exceed transfer.inflightDeadlineSeconds: "
        "the runtime's own deadline fails a stuck room first; the operator acts only when it did not.",
        ge=2,
        le=86400,
    )
    scrape_interval_seconds: int = Field(
        10, description="How often each pod's metrics are scraped.", ge=1, le=3600
    )
    action: WatchdogAction = Field(
        "drain",
        description="What to do with a wedged pod: drain (the default: quarantine the pod out of its "
        "Deployment and the router so a replacement starts at once, wait until its healthy requests "
        "finished and the replacement is Ready, or drainSeconds, then delete it), evict (Eviction API, "
        "honours the PodDisruptionBudget), restart (delete the pod, bypassing the "
        "PodDisruptionBudget) or alert (Event and condition only).",
    )
    drain_seconds: int = Field(
        120,
        description="action drain: the longest a quarantined pod is kept for its healthy "
        "requests and its replacement; then what remains is aborted and the pod deleted.",
        ge=2,
        le=3600,
    )
    max_remediations: int = Field(
        3, description="At most this many remediations per budget window.", ge=0, le=1000
    )
    budget_window_seconds: int = Field(
        3600, description="Length of the remediation budget window.", ge=60, le=604800
    )
    max_unavailable: int = Field(
        1,
        description="At most this many pods of a role remediated (unavailable) at once; "
        "also the role's PodDisruptionBudget.",
        ge=1,
        le=512,
    )

    @property
    def cooldown_seconds(self) -> float:
        """After an action, no further action on any of the model's pods for this long: the
        replacement needs time to become Ready, and the pods of the OTHER role that were
        exchanging KV with the removed pod need time to let go of those rooms (measured: ~35 s
        for decode after its prefill vanished). Acting sooner would cascade."""
        return float(max(self.stuck_after_seconds, MIN_COOLDOWN_S))

    @property
    def scrape_timeout_seconds(self) -> float:
        """Per-request timeout: a slow pod must not delay the round past its interval."""
        return max(0.5, min(5.0, self.scrape_interval_seconds / 2))


class NetworkPolicySpec(_Base):
    """NetworkPolicies for the model's pods (enforced by the cluster's network plugin). Prefill
    and decode (<name>-runtime): the model's router may reach their HTTP port, the model's own
    prefill and decode pods reach each other on any port (bootstrap, and the NIXL/UCX and
    side-channel ports, which are ephemeral), and `metricsFrom` reaches the metrics port; nothing
    else gets in, so no one but the router can hand a worker a PD request. The router
    (<name>-router): its HTTP port from anywhere (the model's front door), its metrics port from
    `metricsFrom`."""

    enabled: bool = Field(True, description="Create the NetworkPolicies <name>-runtime and <name>-router.")
    metrics_from: list[dict[str, Any]] | None = Field(
        None,
        description="NetworkPolicyPeers (podSelector, namespaceSelector, ipBlock) allowed to scrape "
        "metrics. Unset: pods labelled app.kubernetes.io/component=operator, "
        "app.kubernetes.io/name=pdwarden (the operator) or app.kubernetes.io/name=prometheus, "
        "in any namespace.",
        max_length=16,
    )


class WorkerKeySpec(_Base):
    """A key of the model's own between its router and its workers. The operator creates a
    Secret `<name>-worker-key-<random>` (owned by the model; the operator may create Secrets but
    never read one) and mounts it into the router and every prefill and decode pod. A worker then
    answers 401 to any HTTP request without it, except /health* and /metrics: only the model's
    router can hand it a PD request, read its state or reach SGLang's other endpoints, even on a
    cluster that does not enforce NetworkPolicies. The router presents the key itself; its
    clients need none. Raising `rotation` replaces the key without a refused request. Deleting
    the Secret makes the operator create a new one at the model's next change or the operator's
    next start, and roll every pod onto it at once."""

    enabled: bool = Field(True, description="Require the model's worker key on the workers' HTTP port.")
    rotation: int = Field(
        0,
        ge=0,
        le=2**31 - 1,
        description="Raise it (by one) to rotate the key: the operator creates a new Secret and moves "
        "the router and every pod onto it through windows in which the old key and the new are both "
        "accepted, so that no request is refused. Lowering it does nothing.",
    )


def _nested(model: type[_Base], description: str) -> Any:
    """A nested object field that defaults to the object with every field at its default.

    The schema's `default:` spells those defaults out, because the API server checks a default
    against the object's CEL rules before nested defaults would fill it in.
    """
    values = model.model_validate({}).model_dump(by_alias=True, exclude_none=True)
    return Field(
        default_factory=lambda: model.model_validate({}),
        description=description,
        json_schema_extra={"default": {k: v for k, v in values.items() if v != []}},
    )


# The remediation ladder's order, as the API server and the operator both word it.
LADDER_MESSAGE = (
    "watchdog.stuckAfterSeconds must exceed transfer.inflightDeadlineSeconds: the runtime's own "
    "deadline fails a stuck room first, the operator acts only when that self-heal did not"
)


KV_PAGES_PREFILL_MESSAGE = (
    "prefill.autoscaling.target.kvPagesInUse: KV pages in use are decode's signal; prefill "
    "scales on inflightPerPod or queueAgeSeconds"
)
QUEUE_AGE_DECODE_MESSAGE = (
    "decode.autoscaling.target.queueAgeSeconds: queue age is prefill's signal; decode scales on "
    "inflightPerPod or kvPagesInUse"
)
RATIO_WITHOUT_AUTOSCALING_MESSAGE = "prefillDecodeRatio needs autoscaling on prefill or decode"


class DisaggregatedModelSpec(_Base):
    """Desired state: one model served by prefill and decode pods behind SGLang's router (smg)."""

    RULES = (
        Rule(
            "self.prefill.replicas == 0 || self.decode.replicas == 0 || self.router.replicas > 0",
            "router.replicas must be at least 1 when prefill and decode have replicas",
            lambda s: s.prefill.replicas == 0 or s.decode.replicas == 0 or s.router.replicas > 0,
            ".router.replicas",
        ),
        Rule(
            "self.watchdog.stuckAfterSeconds > self.transfer.inflightDeadlineSeconds",
            LADDER_MESSAGE,
            lambda s: s.watchdog.stuck_after_seconds > s.transfer.inflight_deadline_seconds,
            ".watchdog.stuckAfterSeconds",
        ),
        Rule(
            "!has(self.prefill.autoscaling) || !has(self.prefill.autoscaling.target) "
            "|| !has(self.prefill.autoscaling.target.kvPagesInUse)",
            KV_PAGES_PREFILL_MESSAGE,
            lambda s: s.prefill.autoscaling is None or s.prefill.autoscaling.target.kv_pages_in_use is None,
            ".prefill.autoscaling.target.kvPagesInUse",
        ),
        Rule(
            "!has(self.decode.autoscaling) || !has(self.decode.autoscaling.target) "
            "|| !has(self.decode.autoscaling.target.queueAgeSeconds)",
            QUEUE_AGE_DECODE_MESSAGE,
            lambda s: s.decode.autoscaling is None or s.decode.autoscaling.target.queue_age_seconds is None,
            ".decode.autoscaling.target.queueAgeSeconds",
        ),
        Rule(
            "!has(self.prefillDecodeRatio) || has(self.prefill.autoscaling) || has(self.decode.autoscaling)",
            RATIO_WITHOUT_AUTOSCALING_MESSAGE,
            lambda s: s.prefill_decode_ratio is None or bool(s.autoscaled_roles),
            ".prefillDecodeRatio",
        ),
    )

    model: ModelRef = Field(description="The model to serve.")
    image: str = Field(
        DEFAULT_IMAGE,
        description="Container image of the runtime pods (SGLang with pdwarden installed).",
        min_length=1,
        max_length=512,
    )
    engine: contract.Engine = Field(
        "sglang",
        description="sglang serves the model; synthetic is a CPU stand-in with the same HTTP and "
        "metrics surface (demos and tests).",
    )
    transfer: TransferSpec = _nested(TransferSpec, "KV transfer backend and self-heal deadlines.")
    prefill: RoleSpec = _nested(RoleSpec, "Prefill pods.")
    decode: RoleSpec = _nested(RoleSpec, "Decode pods.")
    router: RouterSpec = _nested(RouterSpec, "The router in front.")
    watchdog: WatchdogSpec = _nested(WatchdogSpec, "Wedge detection and remediation.")
    network_policy: NetworkPolicySpec = _nested(NetworkPolicySpec, "An optional NetworkPolicy.")
    worker_key: WorkerKeySpec = _nested(WorkerKeySpec, "The key between the router and the workers.")
    prefill_decode_ratio: RatioBand | None = Field(
        None,
        description="Prefill pods per decode pod to keep while autoscaling: when one role scales, "
        "the other follows as far as its bounds allow (status and an Event say when it cannot).",
    )

    @property
    def autoscaled_roles(self) -> tuple[str, ...]:
        """The runtime roles with `autoscaling` set."""
        return tuple(r for r in contract.RUNTIME_ROLES if self.role(r).autoscaling is not None)

    def role(self, role: str) -> RoleSpec:
        if role == contract.ROLE_PREFILL:
            return self.prefill
        if role == contract.ROLE_DECODE:
            return self.decode
        raise ValueError(f"unknown runtime role {role!r}")


# --- status ------------------------------------------------------------------------------

Phase = Literal["Pending", "Progressing", "Ready", "Degraded"]
ConditionType = Literal["Ready", "Progressing", "Degraded", "Wedged", "FleetBrake"]
CONDITION_TYPES: tuple[ConditionType, ...] = get_args(ConditionType)  # in the order status writes them


class Condition(_Base):
    """A standard Kubernetes condition."""

    type: ConditionType = Field(description="Ready, Progressing, Degraded, Wedged or FleetBrake.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="One CamelCase word for machines.", max_length=128)
    message: str = Field(description="What a person needs to know.", max_length=32768)
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int = Field(description="The .metadata.generation this condition describes.")


class ReplicaStatus(_Base):
    """Replica counts of one workload."""

    replicas: int = Field(0, description="Desired replicas (pods, or groups of nodesPerReplica pods).")
    ready_replicas: int = Field(0, description="Ready replicas (a group is ready when all its pods are).")
    summary: str = Field(
        "0/0",
        description="readyReplicas/replicas for kubectl get; with groups also the ready pods "
        "(`1/2 groups, 3/4 pods`).",
    )
    groups: int | None = Field(None, description="Desired groups (roles with nodesPerReplica > 1).")
    ready_groups: int | None = Field(None, description="Groups whose every pod is ready.")
    ready_pods: int | None = Field(None, description="Ready pods of the role's groups.")


class RoleAutoscalingStatus(_Base):
    """One autoscaled role as the last scaling round saw it."""

    replicas: int = Field(description="The Deployment's replicas when the round ran.")
    desired_replicas: int = Field(description="What the round set (or, driver external, found).")
    recommended_replicas: int | None = Field(
        None, description="What the load alone asks for, within the bounds (before windows, steps, band)."
    )
    min_replicas: int = Field(description="spec's minReplicas.")
    max_replicas: int = Field(description="spec's maxReplicas.")
    reason: str = Field(description="Why desiredReplicas is what it is: one CamelCase word.", max_length=64)
    message: str = Field(description="The figures behind the reason.", max_length=1024)
    saturated: bool = Field(False, description="At maxReplicas and the load asks for more.")
    last_scale_time: str | None = Field(None, description="When pdwarden last changed the count (RFC 3339).")


def _is_none(value: Any) -> bool:
    return value is None


def _null_clears(description: str) -> Any:
    """A status field written as null when unset: the status is a JSON merge patch, whose null
    removes a value stored before (and a null inside a list entry is kept as null)."""
    return Field(None, description=description, json_schema_extra={"nullable": True})


def _absent_when_unset(description: str) -> Any:
    return Field(None, description=description, exclude_if=_is_none)


class _StatusPart(_Base):
    """A part of the status the watchdog writes and reads back. Reading is tolerant of fields
    another version wrote (ignored); writing goes through these models, so nothing undeclared
    is written (the API server would prune it)."""

    model_config = ConfigDict(extra="ignore")


class BudgetStatus(_StatusPart):
    """The remediation budget: maxRemediations per window."""

    window_start: str | None = _null_clears("When the current window began (RFC 3339); null: none open.")
    used: int = Field(default=0, ge=0, description="Remediations charged to the window.")
    limit: int = Field(default=0, ge=0, description="spec.watchdog.maxRemediations.")
    exhausted: bool = Field(default=False, description="The window's budget is spent.")


class InFlightStatus(_StatusPart):
    """A remediation decided (its intent written first) and not yet known to be finished."""

    pod: str = Field(description="The pod acted on.")
    uid: str = Field(default="", description="That pod's UID (a pod of the same name later is another pod).")
    role: str = Field(description="prefill or decode.")
    action: WatchdogAction = Field(description="alert, restart, evict or drain.")
    started_at: str = Field(description="When the remediation was decided (RFC 3339).")
    remediation_id: int = Field(description="The status.remediations entry it updates.")
    reason: str = Field(default="", description="Why the pod was judged wedged.")
    attempts: int = Field(default=0, ge=0, description="Calls made so far (0: only the intent written).")
    last_outcome: str = Field(default="pending", description="The last call's outcome.")
    not_before: str | None = _null_clears("A 429's Retry-After: not tried again before then (RFC 3339).")
    quarantined_at: str | None = _absent_when_unset(
        "Drain: when the pod left its Deployment's selector (RFC 3339)."
    )


class FleetBrakeStatus(_StatusPart):
    """Whether a brake (the fleet's, or the model's namespace's) holds this model's remediations."""

    engaged: bool = Field(description="A brake holds every remediation of this model.")
    scope: str | None = _absent_when_unset("fleet or namespace (while engaged).")
    reason: str | None = _absent_when_unset("The counts that engaged it (while engaged).")


class WatchdogStatus(_StatusPart):
    """What the watchdog found and must remember across restarts."""

    last_scrape: str | None = _null_clears(
        "The last round (RFC 3339): written when a finding changes, alone at most once a minute."
    )
    wedged_pods: list[str] = Field(default_factory=list, description="Pods judged wedged now.")
    unobserved_pods: list[str] = Field(
        default_factory=list, description="Pods whose /metrics could not be scraped or parsed."
    )
    budget: BudgetStatus = Field(default_factory=BudgetStatus, description="The remediation budget.")
    budget_exhausted: bool | None = _absent_when_unset(
        "The budget is spent and the action is not alert (remediation held until the window ends)."
    )
    cooldown_until: dict[str, str] = Field(
        default_factory=dict, description="Per role, no new remediation before this time (RFC 3339)."
    )
    next_id: int = Field(default=1, ge=1, description="The id the next status.remediations entry gets.")
    in_flight: list[InFlightStatus] = Field(
        default_factory=list, description="Remediations decided and not finished (a restart resumes them)."
    )
    fleet_brake: FleetBrakeStatus | None = _absent_when_unset(
        "The brakes as this model's last round saw them."
    )


class RemediationPhase(_StatusPart):
    """One phase a drain went through."""

    phase: str = Field(description="The outcome the phase reached.")
    time: str = Field(description="When (RFC 3339).")


class RemediationStatus(_StatusPart):
    """One watchdog decision; `id` is stable for the entry's lifetime."""

    id: int = Field(description="Stable while the entry is kept.")
    pod: str = Field(description="The pod judged wedged.")
    role: str = Field(description="prefill or decode.")
    reason: str = Field(description="Why it was judged wedged.")
    action: str = Field(description="What the watchdog did, or would do (alert).")
    time: str = Field(description="When it was decided (RFC 3339).")
    outcome: str = Field(
        description="Where it stands: pending, deleted, evicted, quarantined, skipped-..., error."
    )
    phases: list[RemediationPhase] | None = _absent_when_unset("A drain's phases, each with its time.")


class AutoscalingStatus(_Base):
    """The autoscaler's view: desired against current per role, and why."""

    prefill: RoleAutoscalingStatus | None = Field(None, description="Prefill, when it autoscales.")
    decode: RoleAutoscalingStatus | None = Field(None, description="Decode, when it autoscales.")
    ratio_kept: bool | None = Field(
        None, description="Whether prefill:decode is inside spec.prefillDecodeRatio (absent without a band)."
    )
    ratio_message: str | None = Field(None, description="Why the band cannot be kept.", max_length=1024)


class WorkerKeyStatus(_Base):
    """Where the model's worker key stands."""

    state: Literal["Off", "On", "SwitchingOn", "SwitchingOff", "Rotating"] = Field(
        description="Off, On, or on the way: SwitchingOn, SwitchingOff, Rotating (one roll at a time)."
    )
    rotation: int | None = Field(None, description="The rotation of the key the router presents.")
    message: str | None = Field(
        None, description="On the way: who uses which key now, and what it waits for.", max_length=4096
    )


class DisaggregatedModelStatus(_Base):
    """Observed state, written by the operator."""

    model_config = ConfigDict(extra="allow")

    observed_generation: int | None = Field(None, description="The .metadata.generation last reconciled.")
    phase: Phase | None = Field(None, description="Pending, Progressing, Ready or Degraded.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing, Degraded, Wedged and FleetBrake.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: ReplicaStatus | None = Field(None, description="Prefill replicas (pods, or groups).")
    decode: ReplicaStatus | None = Field(None, description="Decode replicas (pods, or groups).")
    router: ReplicaStatus | None = Field(None, description="Router Deployment replicas.")
    watchdog: WatchdogStatus | None = Field(
        None, description="The watchdog's findings and state. Absent until a runtime pod is Ready."
    )
    autoscaling: AutoscalingStatus | None = Field(
        None, description="Autoscaled roles: desired against current replicas, and why."
    )
    worker_key: WorkerKeyStatus | None = Field(
        None, description="The worker key: on, off, or moving (switched on or off, rotated)."
    )
    remediations: list[RemediationStatus] | None = Field(
        None, description="The last remediations, oldest first.", max_length=MAX_REMEDIATIONS_KEPT
    )


# Root-level rules (they may read metadata.name).
ROOT_RULES = [
    cel(
        f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters (children append -prefill etc.)",
    ),
    cel(
        f"self.metadata.name.matches('{NAME_PATTERN}')",
        "metadata.name must be a DNS-1035 label (lowercase letters, digits, '-', starting with a letter)",
    ),
]


def parse_spec(spec: dict[str, Any]) -> DisaggregatedModelSpec:
    """Validate a resource's spec (raises pydantic.ValidationError with field paths)."""
    return DisaggregatedModelSpec.model_validate(spec)
