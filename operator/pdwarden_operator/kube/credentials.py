"""Where the Kubernetes API is and how to prove who we are: a kubeconfig's current context, or
the pod's service account. One reader for the operator and for the development tools.

Only what a file can hold is understood (a token, a client certificate, a CA); a user that
needs a program to run (an exec plugin, an auth provider) is refused with the file named.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The pod's service account, as the kubelet mounts it.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeconfigError(ValueError):
    """Credentials that cannot be used; the message names the file and what is missing."""


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    token: str | None = None
    # Read at each use instead of `token`: the kubelet rotates a service account's token.
    token_file: Path | None = None

    def bearer(self) -> str | None:
        """The token to send now, if the credentials carry one."""
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip() or None
            except OSError as exc:
                raise KubeconfigError(f"{self.token_file}: cannot read the token: {exc}") from exc
        return self.token


def _entry(doc: Any, kind: str, name: str, path: Path) -> dict[str, Any]:
    for entry in doc.get(f"{kind}s") or []:
        if entry.get("name") == name:
            return dict(entry.get(kind) or {})
    raise KubeconfigError(f"{path}: no {kind} named {name!r}")


def from_kubeconfig(path: Path, files: Path) -> Credentials:
    """The current context's server and credentials. Inline data (`*-data`) is written to
    files under `files` (owner-only), as TLS libraries read certificates from files; a
    relative path is taken from the kubeconfig's own directory, as kubectl takes it."""
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise KubeconfigError(f"{path}: cannot read the kubeconfig: {exc}") from exc
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{path}: not a kubeconfig (a YAML mapping)")
    context_name = doc.get("current-context")
    if not context_name:
        raise KubeconfigError(f"{path}: no current-context")
    context = _entry(doc, "context", context_name, path)
    cluster = _entry(doc, "cluster", str(context.get("cluster")), path)
    user = _entry(doc, "user", str(context.get("user")), path)

    def file_of(entry: dict[str, Any], key: str, name: str) -> Path | None:
        if entry.get(f"{key}-data"):
            target = files / name
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(base64.b64decode(entry[f"{key}-data"]))
            return target
        return path.parent / str(entry[key]) if entry.get(key) else None

    ca = file_of(cluster, "certificate-authority", "ca.crt")
    if ca is None or not cluster.get("server"):
        raise KubeconfigError(f"{path}: cluster {context.get('cluster')!r} needs a server and a CA")
    token_file = user.get("tokenFile")
    creds = Credentials(
        server=str(cluster["server"]).rstrip("/"),
        ca_file=ca,
        cert_file=file_of(user, "client-certificate", "client.crt"),
        key_file=file_of(user, "client-key", "client.key"),
        token=user.get("token"),
        token_file=path.parent / str(token_file) if token_file else None,
    )
    has_cert = creds.cert_file is not None and creds.key_file is not None
    if creds.token is None and creds.token_file is None and not has_cert:
        how = next((k for k in ("exec", "auth-provider") if user.get(k)), None)
        needs = f" (it uses {how}, which pdwarden does not run)" if how else ""
        raise KubeconfigError(
            f"{path}: user {context.get('user')!r} has neither a token nor a client certificate{needs}"
        )
    return creds


def in_cluster() -> Credentials:
    """The pod's service account and the API server's Service, as the kubelet provides them."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    token, ca = SERVICE_ACCOUNT_DIR / "token", SERVICE_ACCOUNT_DIR / "ca.crt"
    if not host or not port or not token.exists() or not ca.exists():
        raise KubeconfigError(
            "no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not in a pod "
            f"(KUBERNETES_SERVICE_HOST/PORT and {SERVICE_ACCOUNT_DIR}/token, ca.crt)"
        )
    host = f"[{host}]" if ":" in host else host
    return Credentials(server=f"https://{host}:{port}", ca_file=ca, token_file=token)


def kubeconfig_path(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The kubeconfig to read: `explicit`, else the first of $KUBECONFIG, else ~/.kube/config
    when it exists; None: in a pod."""
    if explicit:
        return Path(explicit).expanduser()
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return Path(listed[0]).expanduser()
    home = Path("~/.kube/config").expanduser()
    return home if home.exists() else None


def discover(explicit: str | os.PathLike[str] | None, files: Callable[[], Path]) -> Credentials:
    """The credentials `kubeconfig_path` points at (`files()`: where to write its inline data),
    else the pod's own, which need no file of ours (a pod's root filesystem is often read-only,
    with no temporary directory)."""
    path = kubeconfig_path(explicit)
    return from_kubeconfig(path, files()) if path is not None else in_cluster()
