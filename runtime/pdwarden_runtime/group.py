"""A multi-node replica's ranks: rendezvous at the leader over TCP, and fail together.

With ``--nnodes N`` (N > 1) a replica is N processes on N nodes. Rank 0, the leader, listens
at the port of ``--dist-init-addr``; every other rank connects to that address, says who it
is, and the two then exchange a heartbeat line every ``HEARTBEAT_S``. The leader is complete
(and may report ready) once every rank has joined. As SGLang does when a tensor-parallel peer
dies, the group never goes on with a rank missing: once a rank has joined, its connection
closing or its heartbeat stopping makes the leader fail (the process exits), and a worker
fails the same way when its leader goes. A restarted rank therefore never rejoins a stale
leader: the whole group starts again. The synthetic engine uses this; SGLang's own ranks
rendezvous through torch.distributed at the same address.

Wire format: one JSON object per line. Worker -> leader ``{"rank": r, "nnodes": n}``;
leader -> worker ``{"ok": true}`` or ``{"ok": false, "error": "..."}`` (then it closes);
then ``{"ping": true}`` both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Final

log = logging.getLogger(__name__)

HEARTBEAT_S: Final = 1.0
# A peer silent this long is gone. Generous: a starting leader's event loop can be held for many
# seconds by its engine's start (KV pool, NIXL registration); a crashed peer is seen at once
# anyway, by its connection closing.
DEAD_AFTER_S: Final = 60.0
# How long a worker keeps trying to reach its leader (its name may not resolve yet).
JOIN_TIMEOUT_S: Final = 600.0
CONNECT_RETRY_S: Final = 0.5
MAX_LINE: Final = 4096


class GroupError(Exception):
    """The group cannot go on: a rank or the leader is gone, or a rank was refused."""


@dataclass(frozen=True)
class GroupOptions:
    nnodes: int
    node_rank: int
    dist_init_addr: str  # host:port of the leader's rendezvous

    def __post_init__(self) -> None:
        if self.nnodes < 2:
            raise ValueError(f"--nnodes must be at least 2 for a group, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        self.address()  # raises on a malformed address

    @property
    def leader(self) -> bool:
        return self.node_rank == 0

    def address(self) -> tuple[str, int]:
        host, sep, port = self.dist_init_addr.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--dist-init-addr must be HOST:PORT, got {self.dist_init_addr!r}")
        return host.strip("[]"), int(port)


def _line(obj: dict[str, object]) -> bytes:
    return (json.dumps(obj) + "\n").encode()


async def _read(reader: asyncio.StreamReader, timeout: float) -> dict[str, object]:
    raw = await asyncio.wait_for(reader.readline(), timeout)
    if not raw:
        raise GroupError("connection closed")
    if len(raw) > MAX_LINE:
        raise GroupError("line too long")
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        raise GroupError("not a JSON object")
    return obj


async def _heartbeat(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    """Ping the peer and wait for its pings until it goes; returns why it is gone."""

    async def send() -> None:
        while True:
            writer.write(_line({"ping": True}))
            await writer.drain()
            await asyncio.sleep(HEARTBEAT_S)

    sender = asyncio.create_task(send())
    try:
        while True:
            await _read(reader, DEAD_AFTER_S)
    except TimeoutError:
        return f"no heartbeat for {DEAD_AFTER_S:g}s"
    except (GroupError, OSError, ValueError) as err:
        return str(err) or type(err).__name__
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await sender
        writer.close()


class Leader:
    """Rank 0: accepts the other ranks; `lost` is set (with the reason) when one goes."""

    def __init__(self, options: GroupOptions, host: str) -> None:
        self.options = options
        self.host = host
        self.joined: set[int] = set()
        self.lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def complete(self) -> bool:
        return len(self.joined) == self.options.nnodes - 1

    def describe(self) -> str:
        return f"{len(self.joined) + 1}/{self.options.nnodes} ranks joined"

    async def start(self) -> None:
        _, port = self.options.address()
        self._server = await asyncio.start_server(self._accept, self.host, port, reuse_address=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            rank = await self._handshake(reader, writer)
        except (GroupError, OSError, ValueError, TimeoutError) as err:
            log.warning("group: refused a rank: %s", err)
            writer.close()
            return
        log.info("group: rank %d joined (%s)", rank, self.describe())
        why = await _heartbeat(reader, writer)
        self._fail(f"rank {rank} left the group: {why}")

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        hello = await _read(reader, DEAD_AFTER_S)
        rank, nnodes = hello.get("rank"), hello.get("nnodes")
        error = None
        if nnodes != self.options.nnodes:
            error = f"nnodes {nnodes} differs from the leader's {self.options.nnodes}"
        elif not isinstance(rank, int) or not 0 < rank < self.options.nnodes:
            error = f"rank {rank!r} is not a worker rank of a {self.options.nnodes}-node group"
        elif rank in self.joined:
            error = f"rank {rank} has already joined"
        elif self.lost.done():
            error = "the group has failed"
        if error is not None:
            writer.write(_line({"ok": False, "error": error}))
            await writer.drain()
            raise GroupError(error)
        assert isinstance(rank, int)
        self.joined.add(rank)
        writer.write(_line({"ok": True}))
        await writer.drain()
        return rank

    def _fail(self, reason: str) -> None:
        if not self.lost.done():
            log.error("group: %s", reason)
            self.lost.set_result(reason)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()


class Worker:
    """Rank > 0: joins the leader; `lost` is set when the leader goes."""

    def __init__(self, options: GroupOptions) -> None:
        self.options = options
        self.joined = False
        self.lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None

    async def join(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Connect (retrying while the leader is not there yet) and be accepted."""
        host, port = self.options.address()
        end = time.monotonic() + timeout
        while True:
            try:
                reader, writer = await asyncio.open_connection(host, port)
                break
            except OSError as err:
                if time.monotonic() > end:
                    raise GroupError(
                        f"leader {self.options.dist_init_addr} unreachable for {timeout:g}s: {err}"
                    ) from err
                await asyncio.sleep(CONNECT_RETRY_S)
        writer.write(_line({"rank": self.options.node_rank, "nnodes": self.options.nnodes}))
        await writer.drain()
        try:
            answer = await _read(reader, DEAD_AFTER_S)
        except (TimeoutError, ValueError, OSError) as err:
            writer.close()
            raise GroupError(f"no answer from the leader: {err}") from err
        if answer.get("ok") is not True:
            writer.close()
            raise GroupError(f"the leader refused rank {self.options.node_rank}: {answer.get('error')}")
        self.joined = True
        log.info("group: rank %d joined %s", self.options.node_rank, self.options.dist_init_addr)
        self._task = asyncio.create_task(self._watch(reader, writer))

    async def _watch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        why = await _heartbeat(reader, writer)
        if not self.lost.done():
            log.error("group: the leader is gone: %s", why)
            self.lost.set_result(f"the leader is gone: {why}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
