"""Prefill and decode: a role's replicas (pods, or multi-node groups), GPUs, tensor
parallelism, container and scaling."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, model_validator

from pdwarden_operator.resource.autoscaling import AutoscalingSpec
from pdwarden_operator.resource.containers import (
    GPU_RESOURCE,
    EnvVar,
    ResourceRequirements,
    RuntimePodTemplate,
)
from pdwarden_operator.resource.rules import QUANTITY_RULE, Part, Quantity, Rule

# Power-of-two tensor-parallel sizes that SGLang accepts on one node.
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8, 16, 32, 64)
# /dev/shm of a GPU pod when the role does not size it: NCCL and SGLang's tensor parallelism
# need far more than a container's 64 MiB.
DEFAULT_SHM_SIZE = "16Gi"
# What a runtime pod writes outside its volumes: /tmp (an emptyDir), where JIT and compile caches go.
RUNTIME_EPHEMERAL_STORAGE = "2Gi"


AUTOSCALING_GROUPS_MESSAGE = "autoscaling scales single-pod replicas only (nodesPerReplica 1)"


class RoleSpec(Part):
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
        json_schema_extra=QUANTITY_RULE,
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
