"""How a pod asks for the simulated fleet: the fleet's node carries a taint no other pod
tolerates, and a label the pods select, so a model lands there only when its roles say so."""

from __future__ import annotations

from typing import Any, Final

NODE_LABEL: Final = "pdwarden.io/simulated-node"
TAINT_KEY: Final = "pdwarden.io/simulated"


def taint() -> dict[str, str]:
    return {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}


def pod_template() -> dict[str, Any]:
    """A role's podTemplate (router or runtime) that puts its pods on the fleet's node."""
    return {
        "spec": {
            "nodeSelector": {NODE_LABEL: "true"},
            "tolerations": [{"key": TAINT_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        }
    }
