"""What the prefill's NIXL bootstrap thread can take without raising (SGLang 0.5.23's layout).

SGLang's ``bootstrap_thread`` asserts that a message that is not WATERMARK, STAGING_RSP or
ABORT starts with ``GUARD``, then parses it as a decode's registration (room ``None``) or a
room's transfer info; the assert or any parse error ends the thread for good (its guard
re-raises). ``prefill_message_problem`` runs the same parsers first, so such a message is
dropped before the thread sees it. It never says why in the peer's own bytes (it is logged).
"""

from __future__ import annotations

from typing import Final

from sglang.srt.disaggregation.common.conn import ABORT_TAG
from sglang.srt.disaggregation.nixl.conn import GUARD, KVArgsRegisterInfo, TransferInfo

# Tags SGLang's thread handles itself without raising (staging: ignored unless enabled;
# ABORT: parsed leniently by AbortNotification.from_zmq).
PASSED_TAGS: Final = frozenset({b"WATERMARK", b"STAGING_RSP", ABORT_TAG})
# GUARD, room, endpoint, port, agent name: what the thread indexes before it parses.
MIN_GUARDED_FRAMES: Final = 5
REGISTRATION_ROOM: Final = b"None"


def prefill_message_problem(frames: list[bytes]) -> str | None:
    """None when SGLang's prefill bootstrap thread can take ``frames``; else why not."""
    if not frames:
        return "empty message"
    tag = frames[0]
    if tag in PASSED_TAGS:
        return None
    if tag != GUARD:
        return "unknown message tag"
    if len(frames) < MIN_GUARDED_FRAMES:
        return f"{len(frames)} frame(s), fewer than {MIN_GUARDED_FRAMES}"
    body = frames[1:]
    what = "registration" if body[0] == REGISTRATION_ROOM else "transfer info"
    try:
        body[3].decode("ascii")  # the agent name, decoded before anything else
        if body[0] == REGISTRATION_ROOM:
            KVArgsRegisterInfo.from_zmq(body)
        else:
            int(body[0].decode("ascii"))
            TransferInfo.from_zmq(body)
    except Exception as err:
        return f"unparsable {what} ({type(err).__name__})"
    return None
