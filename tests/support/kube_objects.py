"""Plain Kubernetes objects the local-cluster e2e tests create."""

from __future__ import annotations

from typing import Any


def deployment(name: str, replicas: int, container: dict[str, Any], grace_seconds: int = 5) -> dict[str, Any]:
    """A Deployment of `replicas` pods running `container`, selected by `app: <name>`."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"terminationGracePeriodSeconds": grace_seconds, "containers": [container]},
            },
        },
    }


def http_server_script(port: int, body: str) -> str:
    """A pod's own HTTP server: answers every GET with `body` (a Python expression giving bytes,
    evaluated per request, with `os` imported), on `$BIND` (default all addresses) and `port`."""
    return (
        "import http.server, os\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        f"        body = {body}\n"
        "        self.send_response(200)\n"
        "        self.send_header('Content-Length', str(len(body)))\n"
        "        self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "    def log_message(self, *args):\n"
        "        pass\n"
        f"http.server.ThreadingHTTPServer((os.environ.get('BIND', '0.0.0.0'), {port}), H).serve_forever()\n"
    )
