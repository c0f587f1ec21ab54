"""Plain Kubernetes objects the local-cluster e2e tests create."""

from __future__ import annotations

from typing import Any


def deployment(name: str, replicas: int, container: dict[str, Any], grace_seconds: int = 5) -> dict[str, Any]:
    """A Deployment of `replicas` pods running `container`, selected by `app: <name>`."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": grace_seconds, "containers": [container]},
            },
        },
    }
