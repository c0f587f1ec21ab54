"""A container's isolation, applied in the process itself before it execs the container's command.

`python -m pdwarden_localcluster.kubelet.sandbox SPEC.json -- ARGV...` (after the pod's
`ip netns exec`, after cgroups.join_prefix): a mount namespace of its own, the pod's
volumes bind-mounted at their mount paths, a read-only view of the root when asked, then the
user, groups, capabilities and no_new_privs, and exec. The pid stays the container's. Any
failure exits 128 with the reason on stderr (the container's log), as a runtime's start error.

Only the standard library: this runs once per container start.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SLAVE = 0x80000
PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
CAP_LAST = 40
# Kernel mounts a read-only root leaves as they are (a runtime gives a container its own).
KERNEL_MOUNTS = ("/proc", "/sys", "/dev")
FLAG_NAMES = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

# seccompProfile RuntimeDefault: the system calls a container runtime's default profile
# refuses (EPERM) that no capability a pod can hold here brings back (kernel modules, kexec,
# mounts, namespaces, keyrings, bpf, perf, other processes' memory, clocks, swap, reboot...).
# The NUMA calls (mbind, get/set_mempolicy) stay allowed: UCX and torch query them.
SECCOMP_DENIED = (
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module",
    "finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "get_kernel_syms", "init_module",
    "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie", "mount",
    "mount_setattr", "move_mount", "name_to_handle_at", "nfsservctl", "open_by_handle_at",
    "open_tree", "perf_event_open", "pivot_root", "process_vm_readv", "process_vm_writev",
    "query_module", "quotactl", "reboot", "request_key", "setns", "settimeofday", "stime",
    "swapoff", "swapon", "sysfs", "_sysctl", "umount", "umount2", "unshare", "uselib",
    "userfaultfd", "ustat", "vm86", "vm86old",
)  # fmt: skip
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO_EPERM = 0x00050000 | 1


class SandboxError(Exception):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source or fstype} on {target}",
    )


def _mount_table() -> list[tuple[str, set[str]]]:
    """(mount point, its per-mount options) of this namespace, in mount order."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = parts[4].encode().decode("unicode_escape")
            out.append((point, set(parts[5].split(","))))
    return out


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _missing_top(target: str) -> str | None:
    """The outermost directory or file of `target` that does not exist yet (what creating it adds)."""
    top = None
    path = os.path.abspath(target)
    while not os.path.lexists(path):
        top, path = path, os.path.dirname(path)
    return top


def _record_created(target: str, log: str | None) -> None:
    """Note a mount point made on the host's filesystem (a path the image would have had), so
    `cluster down` can take it away again (teardown.remove_created_mount_points)."""
    top = _missing_top(target)
    if top is None or not log:
        return
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (top + "\n").encode())  # one small append: whole even with other writers
    finally:
        os.close(fd)


def _ensure_target(source: str, target: str) -> None:
    if os.path.exists(target):
        return
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "a"):
            pass


def _traversable(path: str) -> None:
    """Give a non-root user a way through `path` (e.g. /root, 0700), as an image's own files would be.

    A tmpfs (0711) goes over it, with each original entry bind-mounted back; entries keep
    their own permissions.
    """
    if not os.path.isdir(path) or os.stat(path).st_mode & 0o011 == 0o011:
        return
    original = os.open(path, os.O_PATH | os.O_DIRECTORY)
    entries = os.listdir(path)
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0711")
    for name in entries:
        src = f"/proc/self/fd/{original}/{name}"
        dst = os.path.join(path, name)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
            continue
        _ensure_target(src, dst)
        mount(src, dst, None, MS_BIND | MS_REC)
    os.close(original)


def _read_only_root(writable: list[str]) -> None:
    for point, opts in _mount_table():
        if _under(point, list(KERNEL_MOUNTS)) or _under(point, writable) or "ro" in opts:
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for name, bit in FLAG_NAMES.items():
            if name in opts:
                flags |= bit
        try:
            mount(None, point, None, flags)
        except SandboxError:
            if os.path.exists(point):  # a mount point hidden by a later mount cannot be reached
                raise


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_bounding(keep: list[int]) -> None:
    for cap in range(CAP_LAST + 1):
        if cap not in keep:
            ret = _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
            if ret != 0 and ctypes.get_errno() != 22:  # EINVAL: the kernel does not know it
                _check(ret, f"drop capability {cap} from the bounding set")


def _set_caps(keep: list[int], non_root: bool) -> None:
    """Permitted, effective and inheritable sets (after the user switch, which cleared effective)."""
    mask = sum(1 << c for c in keep)
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    for i in range(2):
        part = (mask >> (32 * i)) & 0xFFFFFFFF
        data[i].effective = data[i].permitted = data[i].inheritable = part
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    if non_root:  # a non-root user keeps added capabilities across exec only as ambient ones
        for cap in keep:
            _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0), f"ambient capability {cap}")


def _seccomp_runtime_default() -> None:
    """Load the RuntimeDefault filter (libseccomp): while still root with every capability, so
    no no_new_privs is needed, and after this process's own mounts."""
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise SandboxError(f"seccompProfile RuntimeDefault needs libseccomp: {exc}") from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SandboxError("seccomp_init failed")
    try:
        for call in SECCOMP_DENIED:
            nr = lib.seccomp_syscall_resolve_name(call.encode())
            if nr < 0:
                continue  # not a system call of this architecture
            ret = lib.seccomp_rule_add(ctx, SCMP_ACT_ERRNO_EPERM, nr, 0)
            if ret != 0:
                raise SandboxError(f"seccomp rule for {call}: {os.strerror(-ret)}")
        ret = lib.seccomp_load(ctx)
        if ret != 0:
            raise SandboxError(f"seccomp_load: {os.strerror(-ret)}")
    finally:
        lib.seccomp_release(ctx)


def _open_image(paths: list[str]) -> dict[str, int]:
    """O_PATH descriptors of the "image" (the project's checkout and interpreter, which every
    container runs from): a volume mounted over a directory holding them must not hide them."""
    out = {}
    for path in paths:
        with contextlib.suppress(OSError):
            out[os.path.abspath(path)] = os.open(path, os.O_PATH | os.O_DIRECTORY)
    return out


def _show_image_under(target: str, image: dict[str, int]) -> None:
    """Bind the image's directories that lie under `target` back over the volume just mounted
    there, as an image's files stay visible beside a volume (e.g. /tmp as an emptyDir while the
    checkout lives under /tmp)."""
    root = os.path.abspath(target).rstrip("/") + "/"
    for path, fd in image.items():
        if path.startswith(root):
            os.makedirs(path, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)


def apply(spec: dict[str, Any]) -> None:
    _check(_libc.unshare(CLONE_NEWNS), "unshare the mount namespace")
    # host mounts still reach the container; its own never reach the host
    mount(None, "/", None, MS_REC | MS_SLAVE)
    uid, gid = int(spec.get("uid", 0)), int(spec.get("gid", 0))
    if uid != 0:
        for path in spec.get("traversable") or []:
            _traversable(path)
    targets = []
    image = _open_image(spec.get("image") or [])
    mounts = spec.get("mounts") or []
    # Every source is opened before the first mount: a runtime resolves volume sources on the
    # node, so a volume mounted at /tmp must not hide a later source under /tmp.
    sources = [os.open(m["source"], os.O_PATH) for m in mounts]
    for m, fd in zip(mounts, sources, strict=True):
        source = f"/proc/self/fd/{fd}"
        _record_created(m["target"], spec.get("createdLog"))
        _ensure_target(source, m["target"])
        mount(source, m["target"], None, MS_BIND | MS_REC)
        os.close(fd)
        _show_image_under(m["target"], image)
        if m.get("readOnly"):
            mount(None, m["target"], None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        targets.append(m["target"])
    if spec.get("readOnlyRoot"):
        _read_only_root([m["target"] for m in spec.get("mounts") or []])
    if spec.get("seccompRuntimeDefault"):
        _seccomp_runtime_default()
    keep = [int(c) for c in spec.get("caps", list(range(CAP_LAST + 1)))]
    _drop_bounding(keep)
    if uid != 0 or gid != 0 or spec.get("groups"):
        _check(_libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep capabilities")
        os.setgroups([int(g) for g in spec.get("groups") or []])
        os.setgid(gid)
        os.setuid(uid)
    _set_caps(keep, uid != 0)
    if spec.get("noNewPrivs"):
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: sandbox SPEC.json -- ARGV...", file=sys.stderr)
        return 128
    try:
        with open(argv[0]) as f:
            spec = json.load(f)
        apply(spec)
        os.execvpe(argv[2], argv[2:], dict(os.environ))
    except (OSError, SandboxError) as exc:
        print(f"pdwarden sandbox: {exc}", file=sys.stderr)
        return 128
    return 0  # not reached: exec replaced the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
