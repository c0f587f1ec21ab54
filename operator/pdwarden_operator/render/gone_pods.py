"""The ConfigMap in which the watchdog lists the model's deleted runtime pods, and where the
runtime pods read it."""

from __future__ import annotations

import pdwarden_contract as contract
from pdwarden_operator.render.meta import Obj, Owner, child_metadata, child_name

GONE_PODS_DIR = "/etc/pdwarden/gone-pods"  # the watchdog's list of deleted runtime pods, read-only


def gone_pods_name(model: str) -> str:
    """The ConfigMap in which the watchdog lists the model's deleted runtime pods."""
    return child_name(model, contract.GONE_PODS_SUFFIX)


def gone_pods_configmap(owner: Owner, document: str) -> Obj:
    """The watchdog's list of the model's gone runtime pods (``watchdog/gone_pods.py``), as the
    runtime pods mount it (``runtime.runtime_volumes``)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(owner, gone_pods_name(owner.name), contract.GONE_PODS_SUFFIX),
        "data": {contract.GONE_PODS_KEY: document},
    }
