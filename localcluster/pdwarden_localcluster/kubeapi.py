"""A small JSON client for the Kubernetes API, authenticated by a client certificate or a
bearer token.

The process kubelet, the cluster manager and the development tools (the test kit, the
benchmarks, the demo) talk to the apiserver through this module; the operator has its own
client (``pdwarden_operator.kube``), whose kubeconfig reader this one shares. It works on
plain dicts (what the API serves), one requests.Session per thread.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
import urllib3

from pdwarden_operator.kube.credentials import Credentials, from_kubeconfig

JSON = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class KubeApi:
    def __init__(self, creds: Credentials, timeout: float = 15.0) -> None:
        self.creds = creds
        self.timeout = timeout
        self._local = threading.local()

    @classmethod
    def from_kubeconfig(cls, path: Path, timeout: float = 15.0) -> KubeApi:
        """A client for a kubeconfig's current context; the certificate files it needs live
        in a private directory removed with the client."""
        files = Path(tempfile.mkdtemp(prefix="pdwarden-kubeapi-"))
        try:
            api = cls(from_kubeconfig(Path(path), files), timeout)
        except BaseException:
            shutil.rmtree(files, ignore_errors=True)
            raise
        weakref.finalize(api, shutil.rmtree, files, True)
        return api

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # REQUESTS_CA_BUNDLE/proxies from the environment would override our own CA
            session.trust_env = False
            session.verify = str(self.creds.ca_file)
            if self.creds.cert_file is not None and self.creds.key_file is not None:
                session.cert = (str(self.creds.cert_file), str(self.creds.key_file))
            if (token := self.creds.bearer()) is not None:
                session.headers["Authorization"] = f"Bearer {token}"
            self._local.session = session
        return session

    def _send(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> requests.Response:
        """One call; an answer of 400 or more raises ApiError with the API's message."""
        data = json.dumps(body) if body is not None else None
        try:
            resp = self._session().request(
                method,
                self.creds.server + path,
                data=data,
                params=params,
                headers={"Content-Type": content_type, "Accept": "application/json"},
                timeout=timeout or self.timeout,
            )
        except requests.RequestException as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from exc
        if resp.status_code >= 400:
            try:
                message = resp.json().get("message", resp.text)
            except ValueError:
                message = resp.text
            raise ApiError(resp.status_code, f"{method} {path}: {message}")
        return resp

    def request(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> JSON:
        resp = self._send(method, path, body, params, content_type, timeout)
        if not resp.content:
            return {}
        try:
            result: JSON = resp.json()
        except ValueError:  # /readyz, /healthz answer plain text
            return {"text": resp.text}
        return result

    def text(self, path: str, params: dict[str, Any] | None = None) -> str:
        """A GET whose answer is plain text (a pod's log, /metrics)."""
        return self._send("GET", path, params=params).text

    def get(self, path: str, params: dict[str, Any] | None = None) -> JSON:
        return self.request("GET", path, params=params)

    def get_or_none(self, path: str) -> JSON | None:
        try:
            return self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def post(self, path: str, body: JSON) -> JSON:
        return self.request("POST", path, body=body)

    def put(self, path: str, body: JSON) -> JSON:
        return self.request("PUT", path, body=body)

    def merge_patch(self, path: str, body: JSON) -> JSON:
        return self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self.request("DELETE", path, body=body)

    def watch(
        self, path: str, params: dict[str, Any], timeout_seconds: int = 60
    ) -> Iterator[tuple[str, JSON]]:
        """Yield (type, object) watch events until the server closes the stream."""
        query = dict(params, watch="1", timeoutSeconds=str(timeout_seconds), allowWatchBookmarks="true")
        try:
            resp = self._session().get(
                self.creds.server + path,
                params=query,
                stream=True,
                timeout=(self.timeout, timeout_seconds + 15),
            )
        except requests.RequestException as exc:
            raise ApiError(0, f"WATCH {path}: {exc}") from exc
        with resp:
            if resp.status_code >= 400:
                raise ApiError(resp.status_code, f"WATCH {path}: {resp.text[:300]}")
            try:
                for line in resp.iter_lines():
                    if line:
                        event = json.loads(line)
                        yield str(event.get("type", "")), event.get("object") or {}
            except (requests.RequestException, urllib3.exceptions.HTTPError, ValueError) as exc:
                raise ApiError(0, f"WATCH {path}: stream broken: {exc}") from exc
