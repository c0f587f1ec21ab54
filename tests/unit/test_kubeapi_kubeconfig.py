"""The tools' Kubernetes client reads a kubeconfig's current context: inline certificates go
to owner-only files, a token becomes a bearer header, and a kubeconfig it cannot use is
refused with what is missing."""

from __future__ import annotations

import base64
import gc
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdwarden_localcluster.kubeapi import KubeApi, KubeconfigError, credentials_from_kubeconfig

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
    creds = credentials_from_kubeconfig(config, files)
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
