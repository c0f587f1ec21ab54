"""Which model a DisaggregatedModel serves and where its weights come from (a Hugging Face
download into a cache, a PersistentVolumeClaim, a directory of the node)."""

from __future__ import annotations

from pydantic import Field

from pdwarden_operator.resource.rules import QUANTITY_RULE, Part, Quantity, Rule


class SecretKeyRef(Part):
    """A key of a Secret in the model's namespace (read by the kubelet, never by the operator)."""

    name: str = Field(description="Secret name.", min_length=1, max_length=253)
    key: str = Field("token", description="Key in the Secret.", min_length=1, max_length=253)


class ModelCache(Part):
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
        None, description="Size limit of the emptyDir cache.", json_schema_extra=QUANTITY_RULE
    )


class HuggingFaceSource(Part):
    """Download `path` (a Hugging Face id) into a cache volume at start; later starts reuse it."""

    token_secret_ref: SecretKeyRef | None = Field(
        None, description="The Hugging Face token (HF_TOKEN), for gated or private models."
    )
    cache: ModelCache = Field(
        default_factory=lambda: ModelCache.model_validate({}),
        description="The cache volume, mounted at /cache (HF_HOME=/cache/huggingface).",
    )


class PersistentVolumeClaimSource(Part):
    """Weights on a PersistentVolumeClaim, mounted read-only at /models."""

    claim_name: str = Field(description="PersistentVolumeClaim name.", min_length=1, max_length=253)
    sub_path: str | None = Field(
        None,
        description="Mount only this directory of the volume.",
        max_length=4096,
        pattern=r"^[^/].*",
    )


class HostPathSource(Part):
    """Weights in a directory of the node, mounted read-only at /models. hostPath volumes are
    refused by the baseline and restricted Pod Security levels."""

    path: str = Field(description="Absolute directory on the node.", pattern=r"^/.*", max_length=4096)


class ModelRef(Part):
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
