"""A pod's volumes under its state dir, and the plan of what each container mounts where.

Files volumes (configMap, secret, downwardAPI, projected with serviceAccountToken) are
written as a kubelet's atomic writer does: a timestamped directory, `..data` pointing at it,
top-level links through `..data`, so a refresh swaps one link and containers see it whole.
emptyDir is a directory (medium Memory: a tmpfs of its sizeLimit); hostPath and
persistentVolumeClaim (the bound PersistentVolume's local/hostPath path) are bound as they are.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import posixpath
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdwarden_localcluster.kubelet import cgroups, envvars
from pdwarden_localcluster.kubelet.sandbox import mount

JSON = dict[str, Any]
Get = Callable[[str], JSON | None]  # API path -> object, None when absent
Post = Callable[[str, JSON], JSON]
FILE_KINDS = ("configMap", "secret", "downwardAPI", "projected")
DATA = "..data"
DEFAULT_MODE = 0o644
TOKEN_SECONDS = 3600
REFRESH_S = 60.0
USAGE_CHECK_S = 10.0  # how often disk emptyDirs with a sizeLimit are measured (a kubelet: ~10 s)
MNT_DETACH = 2


class VolumeError(Exception):
    """A volume cannot be set up yet (FailedMount: the pod waits in ContainerCreating)."""


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool

    def to_json(self) -> JSON:
        return {"source": self.source, "target": self.target, "readOnly": self.read_only}


def kind_of(volume: JSON) -> str:
    return next((k for k in volume if k != "name"), "emptyDir")


def mount_plan(container: JSON, volumes: list[JSON], sources: dict[str, str], where: str) -> list[Mount]:
    """Pure: the container's volumeMounts as bind mounts, in order; ValueError names the field."""
    by_name = {v["name"]: v for v in volumes}
    out = []
    for i, m in enumerate(container.get("volumeMounts") or []):
        vol = by_name.get(m.get("name", ""))
        if vol is None or m["name"] not in sources:
            raise ValueError(f"{where}.volumeMounts[{i}].name: no volume {m.get('name')!r}")
        source = sources[m["name"]]
        sub = str(m.get("subPath") or "")
        if sub:
            if posixpath.isabs(sub) or ".." in sub.split("/"):
                raise ValueError(f"{where}.volumeMounts[{i}].subPath: must be a relative path without '..'")
            source = posixpath.join(source, sub)
        kind = kind_of(vol)
        read_only = bool(m.get("readOnly")) or kind in FILE_KINDS
        if kind == "persistentVolumeClaim" and vol[kind].get("readOnly"):
            read_only = True
        out.append(Mount(source, str(m["mountPath"]), read_only))
    return out


def write_atomic(directory: Path, files: dict[str, tuple[bytes, int]], gid: int | None) -> bool:
    """Publish `files` (relative path -> (content, mode)) in `directory`; False if unchanged."""
    current = directory / DATA
    if current.is_symlink() and _same(current, files):
        return False
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / f"..{time.time_ns()}"
    stamp.mkdir()
    for rel, (content, mode) in files.items():
        path = stamp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if gid is not None:
            os.chown(path, 0, gid)
            mode |= 0o040
        path.chmod(mode)
    if gid is not None:
        for d in [stamp, *(p for p in stamp.rglob("*") if p.is_dir())]:
            os.chown(d, 0, gid)
    tmp = directory / "..data_tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(stamp.name)
    tmp.replace(current)
    tops = {rel.split("/", 1)[0] for rel in files}
    for top in tops:
        link = directory / top
        if not link.is_symlink():
            link.symlink_to(f"{DATA}/{top}")
    for child in directory.iterdir():
        if child.name.startswith("..") and child.name not in (DATA, stamp.name):
            shutil.rmtree(child, ignore_errors=True)
        elif not child.name.startswith("..") and child.name not in tops:
            child.unlink(missing_ok=True)
    return True


def _same(current: Path, files: dict[str, tuple[bytes, int]]) -> bool:
    root = current.resolve()
    have = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    if have != set(files):
        return False
    return all((root / rel).read_bytes() == content for rel, (content, _) in files.items())


@dataclass
class PodVolumes:
    """The volumes of one pod: prepared before its containers start, refreshed, torn down."""

    pod_dir: Path
    get: Get
    post: Post
    ctx: envvars.PodContext
    sources: dict[str, str] = field(default_factory=dict)
    tmpfs: list[Path] = field(default_factory=list)
    tokens: dict[str, tuple[float, float]] = field(default_factory=dict)  # key -> (got at, lifetime)
    refreshed_at: float = 0.0
    usage_checked_at: float = 0.0

    @property
    def root(self) -> Path:
        return self.pod_dir / "volumes"

    @property
    def pod(self) -> JSON:
        return self.ctx.pod

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    def fs_group(self) -> int | None:
        group = ((self.pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
        return int(group) if group is not None else None

    def prepare(self) -> None:
        """Set up every volume not yet set up; VolumeError names what is missing."""
        added = False
        for i, vol in enumerate((self.pod.get("spec") or {}).get("volumes") or []):
            if vol["name"] in self.sources:
                continue
            kind = kind_of(vol)
            where = f"spec.volumes[{i}].{kind}"
            self.sources[vol["name"]] = getattr(self, f"_{kind}")(vol, vol.get(kind) or {}, where)
            added = True
        if added:  # just written: the next refresh is due a period from now (not from every call)
            self.refreshed_at = time.monotonic()

    def refresh(self) -> None:
        """Rewrite files volumes whose data changed, tokens near the end of their lifetime."""
        if time.monotonic() - self.refreshed_at < REFRESH_S and not self._token_due():
            return
        for i, vol in enumerate((self.pod.get("spec") or {}).get("volumes") or []):
            kind = kind_of(vol)
            if kind in FILE_KINDS:
                with contextlib.suppress(VolumeError):
                    getattr(self, f"_{kind}")(vol, vol.get(kind) or {}, f"spec.volumes[{i}].{kind}")
        self.refreshed_at = time.monotonic()

    def over_limit(self) -> tuple[str, str] | None:
        """(volume, its sizeLimit) of a disk emptyDir using more than its limit, as a kubelet's
        eviction manager measures it; None while none is (checked every USAGE_CHECK_S)."""
        t = time.monotonic()
        if t - self.usage_checked_at < USAGE_CHECK_S:
            return None
        self.usage_checked_at = t
        for vol in (self.pod.get("spec") or {}).get("volumes") or []:
            spec = vol.get("emptyDir") if kind_of(vol) == "emptyDir" else None
            if spec is None or spec.get("medium") == "Memory" or spec.get("sizeLimit") is None:
                continue  # a Memory emptyDir is a tmpfs of its size: the kernel limits it
            source = self.sources.get(vol["name"])
            if source is not None and disk_usage(Path(source)) > cgroups.quantity(spec["sizeLimit"]):
                return vol["name"], str(spec["sizeLimit"])
        return None

    def _token_due(self) -> bool:
        t = time.monotonic()
        return any(t - got > 0.8 * life for got, life in self.tokens.values())

    def teardown(self) -> None:
        for path in self.tmpfs:
            umount(path)
        self.tmpfs.clear()
        shutil.rmtree(self.root, ignore_errors=True)
        self.sources.clear()

    # --- kinds ------------------------------------------------------------------------
    def _emptyDir(self, vol: JSON, spec: JSON, where: str) -> str:
        path = self.root / vol["name"]
        path.mkdir(parents=True, exist_ok=True)
        if spec.get("medium") == "Memory" and not os.path.ismount(path):
            size = spec.get("sizeLimit")
            opts = "mode=1777" + (f",size={int(cgroups.quantity(size))}" if size is not None else "")
            mount("tmpfs", str(path), "tmpfs", 0x2 | 0x4, opts)  # nosuid, nodev
            self.tmpfs.append(path)
        path.chmod(0o1777 if spec.get("medium") == "Memory" else 0o777)
        return str(path)

    def _hostPath(self, vol: JSON, spec: JSON, where: str) -> str:
        path = Path(str(spec.get("path", "")))
        kind = spec.get("type") or ""
        if kind == "DirectoryOrCreate":
            path.mkdir(parents=True, exist_ok=True)
        elif kind == "FileOrCreate" and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(0o644)
        elif kind == "Directory" and not path.is_dir():
            raise VolumeError(f"{where}.path: hostPath type check failed: {path} is not a directory")
        elif kind == "File" and not path.is_file():
            raise VolumeError(f"{where}.path: hostPath type check failed: {path} is not a file")
        elif not path.exists():
            raise VolumeError(f"{where}.path: {path} does not exist")
        return str(path)

    def _persistentVolumeClaim(self, vol: JSON, spec: JSON, where: str) -> str:
        claim = spec.get("claimName", "")
        pvc = self.get(f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim}")
        if pvc is None:
            raise VolumeError(f'{where}.claimName: persistentvolumeclaim "{claim}" not found')
        pv_name = (pvc.get("spec") or {}).get("volumeName")
        if not pv_name or (pvc.get("status") or {}).get("phase") != "Bound":
            raise VolumeError(f'{where}.claimName: persistentvolumeclaim "{claim}" is not bound')
        pv = self.get(f"/api/v1/persistentvolumes/{pv_name}")
        pv_spec = (pv or {}).get("spec") or {}
        path = (pv_spec.get("local") or pv_spec.get("hostPath") or {}).get("path")
        if not path:
            raise VolumeError(
                f"{where}.claimName: PersistentVolume {pv_name} is neither local nor hostPath "
                "(the only kinds this kubelet can mount)"
            )
        if not Path(path).exists():
            raise VolumeError(f"{where}.claimName: PersistentVolume {pv_name}'s path {path} does not exist")
        return str(path)

    def _configMap(self, vol: JSON, spec: JSON, where: str) -> str:
        return self._files(vol["name"], self._object_files("ConfigMap", spec, where), spec)

    def _secret(self, vol: JSON, spec: JSON, where: str) -> str:
        ref = {**spec, "name": spec.get("secretName", "")}
        return self._files(vol["name"], self._object_files("Secret", ref, where), spec)

    def _downwardAPI(self, vol: JSON, spec: JSON, where: str) -> str:
        return self._files(vol["name"], self._downward_files(spec, where), spec)

    def _projected(self, vol: JSON, spec: JSON, where: str) -> str:
        files: dict[str, tuple[bytes, int | None]] = {}
        for j, source in enumerate(spec.get("sources") or []):
            at = f"{where}.sources[{j}]"
            if "configMap" in source:
                files.update(self._object_files("ConfigMap", source["configMap"], f"{at}.configMap"))
            elif "secret" in source:
                files.update(self._object_files("Secret", source["secret"], f"{at}.secret"))
            elif "downwardAPI" in source:
                files.update(self._downward_files(source["downwardAPI"], f"{at}.downwardAPI"))
            elif "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                files[str(token.get("path", "token"))] = (self._token(vol["name"], j, token, at), None)
        return self._files(vol["name"], files, spec)

    # --- helpers ----------------------------------------------------------------------
    def _files(self, name: str, files: dict[str, tuple[bytes, int | None]], spec: JSON) -> str:
        default = int(spec.get("defaultMode", DEFAULT_MODE))
        resolved = {rel: (data, default if mode is None else mode) for rel, (data, mode) in files.items()}
        path = self.root / name
        write_atomic(path, resolved, self.fs_group())
        return str(path)

    def _object_files(self, kind: str, ref: JSON, where: str) -> dict[str, tuple[bytes, int | None]]:
        name = ref.get("name", "")
        plural = "configmaps" if kind == "ConfigMap" else "secrets"
        obj = self.get(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
        if obj is None:
            if ref.get("optional"):
                return {}
            raise VolumeError(f'{where}: {kind.lower()} "{name}" not found')
        data: dict[str, bytes] = {}
        for key, value in (obj.get("data") or {}).items():
            data[key] = base64.b64decode(value) if kind == "Secret" else str(value).encode()
        for key, value in (obj.get("binaryData") or {}).items():
            data[key] = base64.b64decode(value)
        items = ref.get("items")
        if not items:
            return {key: (value, None) for key, value in data.items()}
        out: dict[str, tuple[bytes, int | None]] = {}
        for k, item in enumerate(items):
            key = item.get("key", "")
            if key not in data:
                if ref.get("optional"):
                    continue
                raise VolumeError(f'{where}.items[{k}].key: no key "{key}" in {kind.lower()} "{name}"')
            mode = item.get("mode")
            out[str(item.get("path", key))] = (data[key], int(mode) if mode is not None else None)
        return out

    def _downward_files(self, spec: JSON, where: str) -> dict[str, tuple[bytes, int | None]]:
        out: dict[str, tuple[bytes, int | None]] = {}
        containers = {c["name"]: c for c in (self.pod.get("spec") or {}).get("containers") or []}
        for k, item in enumerate(spec.get("items") or []):
            try:
                if "fieldRef" in item:
                    value = envvars.field_ref(self.ctx, str(item["fieldRef"].get("fieldPath", "")))
                else:
                    ref = item.get("resourceFieldRef") or {}
                    value = envvars.resource_ref(containers.get(ref.get("containerName", ""), {}), ref)
            except envvars.EnvError as exc:
                raise VolumeError(f"{where}.items[{k}]: {exc}") from exc
            mode = item.get("mode")
            out[str(item.get("path", ""))] = (value.encode(), int(mode) if mode is not None else None)
        return out

    def _token(self, volume: str, index: int, source: JSON, where: str) -> bytes:
        key = f"{volume}/{index}"
        cache = self.root / f".{volume}.{index}.token"
        got = self.tokens.get(key)
        if got is not None and time.monotonic() - got[0] < 0.8 * got[1] and cache.is_file():
            return cache.read_bytes()
        sa = (self.pod.get("spec") or {}).get("serviceAccountName") or "default"
        seconds = int(source.get("expirationSeconds") or TOKEN_SECONDS)
        body: JSON = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": self.pod["metadata"]["name"],
                    "uid": self.pod["metadata"]["uid"],
                },
            },
        }
        if source.get("audience"):
            body["spec"]["audiences"] = [source["audience"]]
        try:
            resp = self.post(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{sa}/token", body)
        except Exception as exc:  # the API's refusal, named, keeps the pod waiting
            raise VolumeError(f"{where}.serviceAccountToken: cannot get a token for {sa}: {exc}") from exc
        token = str(resp["status"]["token"]).encode()
        self.root.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(token)
        cache.chmod(0o600)
        self.tokens[key] = (time.monotonic(), float(seconds))
        return token


def disk_usage(root: Path) -> int:
    """Bytes of the blocks the files under `root` hold (du's count; no link is followed)."""
    total = 0
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(base, name)).st_blocks * 512
    return total


def umount(path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(str(path).encode(), MNT_DETACH)
