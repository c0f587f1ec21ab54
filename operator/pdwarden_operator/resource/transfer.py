"""How KV caches move from prefill to decode (NIXL, RDMA, the node's network) and the
runtime's self-heal deadlines."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

import pdwarden_contract as contract
from pdwarden_operator.resource.containers import GPU_RESOURCE
from pdwarden_operator.resource.rules import Part, Rule

# Extended resource names (a domain prefix is required for device-plugin resources).
EXTENDED_RESOURCE_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class RdmaSpec(Part):
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


class TransferSpec(Part):
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
