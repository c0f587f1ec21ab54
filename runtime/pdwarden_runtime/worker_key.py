"""The model's worker key: what a worker requires on its HTTP port, and how it is read.

The operator mounts a per-model key into the router and every worker. A worker answers 401 to
a request without ``Authorization: Bearer <key>``, except on the paths SGLang's own
``--api-key`` leaves open (``/health*``, ``/metrics``), so that probes and scrapes need none.
Only the model's router holds the key, so no one else can hand a worker a PD request (naming
any prefill as its peer), read its debug state or inject a fault.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware

import pdwarden_contract as c

# A generated key is 43 characters (32 random bytes); a shorter one is a mistake.
MIN_KEY_CHARS: Final = 16
MAX_KEY_BYTES: Final = 4096


class WorkerKeyError(ValueError):
    """The key file cannot be used (missing, empty, too short, not one line of text)."""


def read_key_file(path: str | Path) -> str:
    """The key in `path` (surrounding whitespace dropped), or a WorkerKeyError saying why not."""
    try:
        raw = Path(path).read_bytes()[: MAX_KEY_BYTES + 1]
    except OSError as err:
        raise WorkerKeyError(f"cannot read the worker key file {path}: {err.strerror or err}") from err
    if len(raw) > MAX_KEY_BYTES:
        raise WorkerKeyError(f"the worker key file {path} is over {MAX_KEY_BYTES} bytes")
    try:
        key = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise WorkerKeyError(f"the worker key file {path} is not ASCII text") from None
    if len(key) < MIN_KEY_CHARS or any(ch.isspace() or not ch.isprintable() for ch in key):
        raise WorkerKeyError(
            f"the worker key in {path} must be one word of at least {MIN_KEY_CHARS} printable characters"
        )
    return key


def is_open(path: str) -> bool:
    """Whether `path` is served without the key (SGLang's rule for its --api-key)."""
    return path.startswith(c.WORKER_KEY_OPEN_PREFIXES)


def bearer(key: str) -> str:
    return f"Bearer {key}"


def auth_headers(key: str | None) -> dict[str, str]:
    """The headers that present `key` (none for None: a worker that requires no key)."""
    return {} if key is None else {"Authorization": bearer(key)}


def authorized(header: str | None, keys: str | Sequence[str]) -> bool:
    """Whether an Authorization header carries `keys` (one, or any of several while the key
    rotates; each compared in constant time)."""
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    given = token.strip().encode()
    accepted = (keys,) if isinstance(keys, str) else tuple(keys)
    # every key compared, so the time says nothing of which one matched
    return sum(hmac.compare_digest(given, key.encode()) for key in accepted) > 0


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def require_key(keys: str | Sequence[str]) -> Middleware:
    """An aiohttp middleware that answers 401 (SGLang's body shape) without the key (or one
    of the keys, while the key rotates)."""
    accepted = (keys,) if isinstance(keys, str) else tuple(keys)
    if not accepted:
        raise ValueError("require_key needs at least one key")

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if is_open(request.path) or authorized(request.headers.get("Authorization"), accepted):
            return await handler(request)
        return web.json_response(
            {"error": {"message": "Unauthorized: this worker takes requests from its model's router only"}},
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    return middleware
