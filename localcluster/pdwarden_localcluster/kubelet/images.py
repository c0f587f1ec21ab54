"""The few images whose entrypoint the local kubelet knows: the monitoring stack's.

The local kubelet runs a container's `command` from the host (the project's environment); it
has no image store. prometheus-operator makes pods whose containers give only `args` and rely
on their image's entrypoint, or name the binary at its path in the image (`/bin/...`). For
those images, at exactly the versions the cluster carries, the entrypoint and that path are
the matching binary in the cache (all four built from go-monitoring's pins:
build.MONITORING_PARTS). Any other image without a `command`, or one of these at another tag,
is refused with a reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdwarden_localcluster import build


@dataclass(frozen=True)
class KnownImage:
    repository: str
    path: str  # the image's ENTRYPOINT, where the real image has it
    version: Callable[[], str]  # the tag the cluster carries
    binary: Callable[[], Path]  # what stands in for `path` here


class ImageError(ValueError):
    pass


PROMETHEUS_IMAGE = KnownImage(
    "quay.io/prometheus/prometheus",
    "/bin/prometheus",
    lambda: build.prometheus_release(build.monitoring_pin(build.PROMETHEUS_MODULE)),
    lambda: build.monitoring_bin_dir() / build.PROMETHEUS_COMMAND,
)
ALERTMANAGER_IMAGE = KnownImage(
    "quay.io/prometheus/alertmanager",
    "/bin/alertmanager",
    lambda: build.monitoring_pin(build.ALERTMANAGER_MODULE),
    lambda: build.monitoring_bin_dir() / build.ALERTMANAGER_COMMAND,
)
PROMETHEUS_OPERATOR_IMAGE = KnownImage(
    "quay.io/prometheus-operator/prometheus-operator",
    "/bin/operator",
    build.prometheus_operator_version,
    lambda: build.monitoring_bin_dir() / build.PROMETHEUS_OPERATOR_COMMAND,
)
CONFIG_RELOADER_IMAGE = KnownImage(
    "quay.io/prometheus-operator/prometheus-config-reloader",
    "/bin/prometheus-config-reloader",
    build.prometheus_operator_version,
    lambda: build.monitoring_bin_dir() / build.CONFIG_RELOADER_COMMAND,
)
KNOWN_IMAGES = {
    i.repository: i
    for i in (PROMETHEUS_IMAGE, ALERTMANAGER_IMAGE, PROMETHEUS_OPERATOR_IMAGE, CONFIG_RELOADER_IMAGE)
}


def reference(image: KnownImage) -> str:
    return f"{image.repository}:{image.version()}"


def split_reference(ref: str) -> tuple[str, str]:
    """("quay.io/prometheus/prometheus", "v2.42.0") from "quay.io/prometheus/prometheus:v2.42.0";
    the tag is "" when the reference names none (a digest counts as no tag the cluster has)."""
    name = ref.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :] if "@" not in ref else ""
    return name, ""


def known_image(ref: str) -> KnownImage | None:
    return KNOWN_IMAGES.get(split_reference(ref)[0])


def entrypoint(ref: str) -> list[str]:
    """The entrypoint of `ref`, or ImageError saying why the local kubelet cannot run it."""
    known = known_image(ref)
    if known is None:
        raise ImageError(
            "container has no `command`: the local kubelet runs commands from the project's "
            f"environment, not image entrypoints (it knows only {', '.join(sorted(KNOWN_IMAGES))})"
        )
    return [str(_binary(known, ref))]


def in_image(ref: str, command: list[str]) -> list[str]:
    """`command` with a known image's own binary path (its ENTRYPOINT) replaced by the binary
    that stands in for it; any other command as it is."""
    known = known_image(ref)
    if known is None or not command or command[0] != known.path:
        return command
    return [str(_binary(known, ref)), *command[1:]]


def _binary(known: KnownImage, ref: str) -> Path:
    if split_reference(ref)[1] != known.version():
        raise ImageError(
            f"image {ref!r}: the local cluster carries {reference(known)} only (another tag or a "
            "digest would be a different binary)"
        )
    binary = known.binary()
    if not binary.exists():
        raise ImageError(f"image {ref!r}: {binary} is missing (run `pdwarden cluster up --monitoring`)")
    return binary
