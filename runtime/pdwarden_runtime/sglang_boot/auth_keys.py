"""SGLang's HTTP port takes a second worker key while the model's key rotates.

SGLang's ``--api-key`` is one key. During a rotation the operator gives a worker the key it
uses (``--worker-key-file``, SGLang's ``--api-key``) and the one the router may present
instead (``--worker-key-accept-file``): ``accept_also`` wraps SGLang's pure auth decision
(``decide_request_auth``, looked up by its middleware at each request) so that a request
refused with the first key is decided again with each accepted one. Admin routes stay as
SGLang decides them: with an admin key set, no worker key opens them, whichever it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, Final

AUTH_MODULE: Final = "sglang.srt.utils.auth"
WRAPPED_MARK: Final = "_pdwarden_accepts_also"


def accept_also(module: ModuleType, keys: Sequence[str]) -> None:
    """Make ``module.decide_request_auth`` also accept ``keys`` where it accepts the api key."""
    original = module.decide_request_auth
    if getattr(original, WRAPPED_MARK, None) is not None:
        original = getattr(original, WRAPPED_MARK)
    others = tuple(keys)

    def decide_request_auth(*, api_key: str | None = None, **kwargs: Any) -> Any:
        decision = original(api_key=api_key, **kwargs)
        if decision.allowed or not api_key:
            return decision  # no api key: nothing to widen
        for key in others:
            again = original(api_key=key, **kwargs)
            if again.allowed:
                return again
        return decision

    setattr(decide_request_auth, WRAPPED_MARK, original)
    module.decide_request_auth = decide_request_auth  # type: ignore[attr-defined]
