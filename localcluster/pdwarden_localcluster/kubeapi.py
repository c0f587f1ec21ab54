"""A small JSON client for the Kubernetes API, authenticated by a client certificate.

The process kubelet and the cluster manager talk to the apiserver only through this module.
It works on plain dicts (what the API serves), one requests.Session per thread.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import urllib3

JSON = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_file: Path
    cert_file: Path
    key_file: Path


class KubeApi:
    def __init__(self, creds: Credentials, timeout: float = 15.0) -> None:
        self.creds = creds
        self.timeout = timeout
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # REQUESTS_CA_BUNDLE/proxies from the environment would override our own CA
            session.trust_env = False
            session.verify = str(self.creds.ca_file)
            session.cert = (str(self.creds.cert_file), str(self.creds.key_file))
            self._local.session = session
        return session

    def request(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> JSON:
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
        if not resp.content:
            return {}
        try:
            result: JSON = resp.json()
        except ValueError:  # /readyz, /healthz answer plain text
            return {"text": resp.text}
        return result

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
