"""Pure: a container's effective securityContext (pod defaults, container overrides).

What a runtime would apply: the user and groups, runAsNonRoot's check, the capabilities kept
(a container runtime's default set, less `drop`, plus `add`), no_new_privs, a read-only root.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]

# Linux capability numbers (linux/capability.h).
CAPS = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
]
CAP_NUMBERS = {name: i for i, name in enumerate(CAPS)}
# containerd's default set for a container that asks for nothing.
DEFAULT_CAPS = frozenset(
    [
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
    ]
)


class SecurityError(Exception):
    """The container cannot start as configured (CreateContainerConfigError)."""


@dataclass(frozen=True)
class Security:
    uid: int
    gid: int
    groups: tuple[int, ...]
    caps: tuple[str, ...]  # kept, sorted
    no_new_privs: bool
    read_only_root: bool
    seccomp_default: bool = False  # RuntimeDefault: sandbox.py's filter (Unconfined or unset: none)


def _cap_name(raw: str, where: str) -> str:
    name = raw.upper().removeprefix("CAP_")
    if name != "ALL" and name not in CAP_NUMBERS:
        raise SecurityError(f"{where}: unknown capability {raw!r}")
    return name


def effective(pod: JSON, container: JSON, where: str) -> Security:
    """`where` is the container's field path (spec.containers[i]) for messages."""
    pod_ctx = (pod.get("spec") or {}).get("securityContext") or {}
    ctx = container.get("securityContext") or {}

    def pick(key: str) -> Any:
        return ctx[key] if ctx.get(key) is not None else pod_ctx.get(key)

    # no image here: a container without runAsUser runs as root, as an image without USER would
    uid = int(pick("runAsUser") if pick("runAsUser") is not None else 0)
    gid = int(pick("runAsGroup") if pick("runAsGroup") is not None else 0)
    if pick("runAsNonRoot") and uid == 0:
        source = "runAsUser 0" if pick("runAsUser") is not None else "no runAsUser (the image user is root)"
        raise SecurityError(f"container has runAsNonRoot and image will run as root ({where}: {source})")
    groups = [int(g) for g in pod_ctx.get("supplementalGroups") or []]
    if pod_ctx.get("fsGroup") is not None:
        groups.append(int(pod_ctx["fsGroup"]))
    caps_spec = ctx.get("capabilities") or {}
    drop = {_cap_name(c, f"{where}.securityContext.capabilities.drop") for c in caps_spec.get("drop") or []}
    add = {_cap_name(c, f"{where}.securityContext.capabilities.add") for c in caps_spec.get("add") or []}
    kept = set(CAPS) if "ALL" in add else set(DEFAULT_CAPS)
    kept = set() if "ALL" in drop else kept - drop
    kept |= set(CAPS) if "ALL" in add else add
    # a kubelet's default is true; only an explicit false sets no_new_privs
    no_new_privs = ctx.get("allowPrivilegeEscalation") is False
    return Security(
        uid=uid,
        gid=gid,
        groups=tuple(sorted(set(groups))),
        caps=tuple(sorted(kept, key=CAP_NUMBERS.__getitem__)),
        no_new_privs=no_new_privs,
        read_only_root=bool(ctx.get("readOnlyRootFilesystem")),
        seccomp_default=(pick("seccompProfile") or {}).get("type") == "RuntimeDefault",
    )
