"""Pure container environment resolution, as the kubelet does it.

Order: a small base (PATH with the project's venv first, HOME, ...), POD_IP, then
`envFrom` sources, then `env` entries in order; literal values expand `$(VAR)` against
what is defined so far, and `$$` is a literal `$`. Lookups of Secrets and ConfigMaps are
injected callables, so this module makes no API calls.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pdwarden_localcluster.kubelet import images

JSON = dict[str, Any]
Lookup = Callable[[str, str], JSON | None]  # (namespace, name) -> object or None if absent

# Host variables a process needs to behave (caches, locale); nothing cluster-specific.
PASSTHROUGH = (
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "XDG_CACHE_HOME",
    "TORCHINDUCTOR_CACHE_DIR",
)


class EnvError(Exception):
    """The container's environment cannot be built (CreateContainerConfigError)."""


@dataclass(frozen=True)
class PodContext:
    pod: JSON
    pod_ip: str
    host_ip: str
    node_name: str


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names are replaced, others left as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(ch)
        i += 1
    return "".join(out)


def base_env(host_env: Mapping[str, str], venv_bin: str) -> dict[str, str]:
    env = {k: host_env[k] for k in PASSTHROUGH if k in host_env}
    env["PATH"] = f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env["VIRTUAL_ENV"] = venv_bin.rsplit("/", 1)[0]
    env["PYTHONUNBUFFERED"] = "1"  # container logs appear as they are written
    return env


def service_env(server: str) -> dict[str, str]:
    """The `kubernetes` Service's variables, as a kubelet sets them in every container."""
    url = urlsplit(server)
    host, port = url.hostname or "", str(url.port or 443)
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": port,
        "KUBERNETES_SERVICE_PORT_HTTPS": port,
        "KUBERNETES_PORT": f"tcp://{host}:{port}",
        "KUBERNETES_PORT_443_TCP": f"tcp://{host}:{port}",
    }


_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(ctx: PodContext, path: str) -> str:
    meta = ctx.pod.get("metadata", {})
    spec = ctx.pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ctx.node_name),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": ctx.pod_ip,
        "status.podIPs": ctx.pod_ip,
        "status.hostIP": ctx.host_ip,
        "status.hostIPs": ctx.host_ip,
    }
    if path in simple:
        return str(simple[path])
    m = _LABEL_REF.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise EnvError(f"unsupported fieldRef fieldPath {path!r}")


def resource_ref(container: JSON, ref: JSON) -> str:
    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None and kind == "limits":
        value = ((container.get("resources") or {}).get("requests") or {}).get(name)
    if value is None:
        raise EnvError(f"resourceFieldRef {resource!r}: no such request or limit on the container")
    return str(value)


def _key_ref(kind: str, ref: JSON, namespace: str, lookup: Lookup) -> str | None:
    name, key, optional = ref.get("name", ""), ref.get("key", ""), bool(ref.get("optional", False))
    obj = lookup(namespace, name)
    if obj is None:
        if optional:
            return None
        raise EnvError(f'{kind} "{name}" not found')
    value = _data(kind, obj).get(key)
    if value is None:
        if optional:
            return None
        raise EnvError(f"couldn't find key {key} in {kind} {namespace}/{name}")
    return value


def _data(kind: str, obj: JSON) -> dict[str, str]:
    raw = obj.get("data") or {}
    if kind == "Secret":
        return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in raw.items()}
    return {k: str(v) for k, v in raw.items()}


def resolve_env(
    ctx: PodContext,
    container: JSON,
    base: Mapping[str, str],
    secrets: Lookup,
    configmaps: Lookup,
) -> dict[str, str]:
    namespace = ctx.pod.get("metadata", {}).get("namespace", "default")
    env = dict(base)
    env["POD_IP"] = ctx.pod_ip
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, field, lookup in (
            ("ConfigMap", "configMapRef", configmaps),
            ("Secret", "secretRef", secrets),
        ):
            ref = source.get(field)
            if ref is None:
                continue
            obj = lookup(namespace, ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f'{kind} "{ref.get("name")}" not found')
            for key, data_value in _data(kind, obj).items():
                env[prefix + key] = data_value
    for item in container.get("env") or []:
        name = item.get("name")
        if not name:
            continue
        if "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        source = item["valueFrom"] or {}
        value: str | None
        if "fieldRef" in source:
            value = field_ref(ctx, str(source["fieldRef"].get("fieldPath", "")))
        elif "resourceFieldRef" in source:
            value = resource_ref(container, source["resourceFieldRef"])
        elif "secretKeyRef" in source:
            value = _key_ref("Secret", source["secretKeyRef"], namespace, secrets)
        elif "configMapKeyRef" in source:
            value = _key_ref("ConfigMap", source["configMapKeyRef"], namespace, configmaps)
        else:
            raise EnvError(f"env {name}: unsupported valueFrom {sorted(source)}")
        if value is not None:
            env[name] = value
    return env


def command_line(container: JSON, env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expanded; for one of the few images the local kubelet knows
    (images.py), the entrypoint when there is no command, and its binary where a command names it."""
    command = [expand(str(c), env) for c in container.get("command") or []]
    args = [expand(str(a), env) for a in container.get("args") or []]
    image = str(container.get("image") or "")
    try:
        command = images.in_image(image, command) if command else images.entrypoint(image)
    except images.ImageError as exc:
        raise EnvError(str(exc)) from None
    return command + args
