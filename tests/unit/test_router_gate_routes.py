"""The router gate's allow-list (pure): which requests a client of the model may make. Only the
serving routes pass; smg's control plane and every admin route are refused, however the path is
spelled."""

from __future__ import annotations

import pytest

from pdwarden_runtime.router_gate import SERVING_ROUTES, Verdict, route_verdict

pytestmark = pytest.mark.unit

SERVED = [
    ("POST", "/generate"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/llama-8b"),
    ("HEAD", "/v1/models"),
    ("GET", "/get_model_info"),
    ("GET", "/health"),
    ("GET", "/health_generate"),
    ("GET", "/liveness"),
    ("GET", "/readiness"),
    ("POST", "/generate?trace=1"),
    ("post", "/generate"),
]

# smg 1.13.0's control plane and the workers' admin routes it would fan out, as a client with
# or without the key might spell them.
REFUSED = [
    ("GET", "/workers"),
    ("POST", "/workers"),
    ("DELETE", "/workers/abc"),
    ("GET", "/workers/abc"),
    ("GET", "/get_loads"),
    ("POST", "/flush_cache"),
    ("POST", "/start_profile"),
    ("POST", "/stop_profile"),
    ("GET", "/heap_profile"),
    ("POST", "/parse/reasoning"),
    ("POST", "/wasm"),
    ("GET", "/v1/tokenizers"),
    ("GET", "/get_server_info"),
    ("POST", "/update_weights_from_disk"),
    ("POST", "/load_lora_adapter"),
    ("POST", "/configure_logging"),
    ("POST", "/abort_request"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/resp_1"),
    ("POST", "/v1/conversations"),
    ("GET", "/metrics"),
    ("GET", "/"),
    ("GET", ""),
    # spellings that a normalising proxy or server could read as a served path, or the reverse
    ("POST", "/generate/"),
    ("POST", "//generate"),
    ("POST", "/generate/../workers"),
    ("POST", "/v1/../workers"),
    ("GET", "/health/../workers"),
    ("GET", "/%77orkers"),
    ("POST", "/%67enerate"),
    ("GET", "/v1/models/../../workers"),
    ("GET", "/v1/models/a/b"),
    ("GET", "/v1/models/.."),
    ("GET", "/v1/models/%2e%2e"),
    ("GET", "/v1/models/"),
    ("POST", "http://127.0.0.1:28000/workers"),
    ("GET", "http://router/generate"),
    ("GET", "/HEALTH"),
    ("GET", "/workers?x=/generate"),
]


@pytest.mark.parametrize(("method", "path"), SERVED)
def test_the_serving_routes_pass(method: str, path: str) -> None:
    assert route_verdict(method, path) is Verdict.SERVE


@pytest.mark.parametrize(("method", "path"), REFUSED)
def test_the_control_plane_and_every_other_path_are_refused(method: str, path: str) -> None:
    assert route_verdict(method, path) is Verdict.FORBIDDEN


def test_a_served_path_with_another_method_is_not_allowed() -> None:
    assert route_verdict("GET", "/generate") is Verdict.METHOD_NOT_ALLOWED
    assert route_verdict("DELETE", "/v1/models") is Verdict.METHOD_NOT_ALLOWED
    assert route_verdict("POST", "/v1/models/x") is Verdict.METHOD_NOT_ALLOWED
    assert route_verdict("POST", "/health") is Verdict.METHOD_NOT_ALLOWED


def test_no_served_route_is_one_of_smgs_control_plane_routes() -> None:
    control = {"/workers", "/get_loads", "/flush_cache", "/start_profile", "/stop_profile", "/heap_profile"}
    assert not control & set(SERVING_ROUTES)
    assert all(path.startswith("/") and ".." not in path for path in SERVING_ROUTES)
