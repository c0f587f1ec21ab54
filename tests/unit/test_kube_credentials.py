"""The one reader of credentials (the operator's and the tools' clients): a kubeconfig's current
context (inline certificates to owner-only files, a token to a bearer header, relative paths
from the file's directory), else the pod's service account; what it cannot use is refused with
what is missing."""

from __future__ import annotations

import base64
import gc
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdwarden_localcluster.kubeapi import KubeApi
from pdwarden_operator.kube import credentials
from pdwarden_operator.kube.credentials import KubeconfigError, from_kubeconfig

pytestmark = pytest.mark.unit


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _kubeconfig(path: Path, user: dict[str, Any], current: str = "ctx") -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": "https://198.18.0.1:6443/", "certificate-authority-data": _b64("CA")},
            }
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [
            {"name": "other", "context": {"cluster": "missing", "user": "u"}},
            {"name": "ctx", "context": {"cluster": "c", "user": "u"}},
        ],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_inline_certificates_are_written_owner_only(tmp_path: Path) -> None:
    config = _kubeconfig(
        tmp_path / "kubeconfig", {"client-certificate-data": _b64("CERT"), "client-key-data": _b64("KEY")}
    )
    files = tmp_path / "files"
    files.mkdir()
    creds = from_kubeconfig(config, files)
    assert creds.server == "https://198.18.0.1:6443" and creds.token is None
    assert creds.cert_file is not None and creds.key_file is not None
    assert (creds.ca_file.read_text(), creds.cert_file.read_text(), creds.key_file.read_text()) == (
        "CA",
        "CERT",
        "KEY",
    )
    assert stat.S_IMODE(creds.key_file.stat().st_mode) == 0o600


def test_a_token_user_needs_no_certificate(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "kubeconfig", {"token": "abc"})
    api = KubeApi.from_kubeconfig(config)
    assert api.creds.token == "abc" and api.creds.cert_file is None
    assert api._session().headers["Authorization"] == "Bearer abc"


def test_the_client_s_files_go_with_it(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "kubeconfig", {"token": "abc"})
    api = KubeApi.from_kubeconfig(config)
    files = api.creds.ca_file.parent
    assert files.is_dir()
    del api
    gc.collect()
    assert not files.exists()


@pytest.mark.parametrize(
    ("user", "current", "missing"),
    [
        ({}, "ctx", "neither a token nor a client certificate"),
        ({"client-certificate-data": _b64("CERT")}, "ctx", "neither a token nor a client certificate"),
        ({"token": "t"}, "other", "no cluster named 'missing'"),
        ({"token": "t"}, "", "no current-context"),
    ],
)
def test_an_unusable_kubeconfig_is_refused_naming_what_is_missing(
    tmp_path: Path, user: dict[str, Any], current: str, missing: str
) -> None:
    config = _kubeconfig(tmp_path / "kubeconfig", user, current)
    with pytest.raises(KubeconfigError, match=missing):
        KubeApi.from_kubeconfig(config)


def test_an_exec_plugin_user_is_refused_naming_the_plugin(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "kubeconfig", {"exec": {"command": "get-token"}})
    with pytest.raises(KubeconfigError, match="it uses exec, which pdwarden does not run"):
        from_kubeconfig(config, tmp_path)


def test_relative_paths_are_taken_from_the_kubeconfig_s_directory(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "token").write_text("first\n")
    config = _kubeconfig(tmp_path / "kubeconfig", {"tokenFile": "certs/token"})
    creds = from_kubeconfig(config, tmp_path)
    assert creds.token_file == tmp_path / "certs" / "token" and creds.bearer() == "first"
    (tmp_path / "certs" / "token").write_text("rotated\n")
    assert creds.bearer() == "rotated"  # read at each use, as a rotated token must be


def test_a_pod_uses_its_service_account_and_the_kubernetes_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("CA")
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "2001:db8::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config

    def no_files() -> Path:
        raise AssertionError("a pod's credentials need no file of ours (its root may be read-only)")

    creds = credentials.discover(None, no_files)
    assert creds.server == "https://[2001:db8::1]:443" and creds.bearer() == "sa-token"
    assert creds.ca_file == tmp_path / "ca.crt"


def test_outside_a_pod_without_a_kubeconfig_the_error_says_what_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT_DIR", tmp_path / "absent")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(KubeconfigError, match=r"no kubeconfig .*and not in a pod"):
        credentials.discover(None, lambda: tmp_path)


def test_an_explicit_kubeconfig_wins_over_kubeconfig_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'first'}{os.pathsep}{tmp_path / 'second'}")
    assert credentials.kubeconfig_path(None) == tmp_path / "first"
    assert credentials.kubeconfig_path(tmp_path / "mine") == tmp_path / "mine"
