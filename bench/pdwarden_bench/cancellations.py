"""Clients that cancel, through the project's router: nothing hangs, nothing is left behind.

The workload: ``--requests`` ``POST /generate`` sent to the router ``--concurrency`` at a
time, prompts of 1 to ``--prompt-max-chars`` characters, ``max_new_tokens`` 1 to 64; a
``--cancel-fraction`` of them is cancelled by its client (the connection is closed) after a
random 1 to ``--cancel-max-ms`` ms; the others wait up to ``--client-timeout`` seconds. The
same seeded workload without cancellations runs as the control, the two arms interleaved
(ABAB, ``--rounds`` pairs) against the same runtimes and router.

Meanwhile the operator's own wedge rule (``pdwarden_operator.watchdog``: parse, history,
judge) reads every runtime's ``/metrics`` each ``--scrape-interval`` with the model's
``--stuck-after``: a pod it judges wedged is a remediation the operator would have taken.
After the load, ``--settle`` seconds pass and every runtime must hold no room.

``--stream`` adds a third arm, interleaved with the two (ABC, CBA, ...): the same seeded
prompts as streamed chats (OpenAI's ``/v1/chat/completions`` through the router, server-sent
events), a ``--cancel-fraction`` of whose clients hang up mid-answer, once
``--hangup-after-events`` events came (a stream that hangs up asks for at least
``STREAM_TAIL_TOKENS`` more tokens than that, so it is cut mid-answer). Decode then paces its
tokens (``--token-interval-ms``, 10 ms with ``--stream``, else 0, for every arm alike), so a
stream lasts long enough to be cut.

No operator runs here: ``remediations`` counts the runtimes that the operator's own wedge rule,
run over their ``/metrics`` as the operator runs it, judged wedged (what the operator would
have remediated), over every arm.

One JSON line: ``requests``, ``cancelled``, ``ok``, ``failed``, ``hung`` (not cancelled, not
answered within the inflight deadline), ``failed_why``, ``p99_ok_seconds`` and the control's
(``control_ok``, ``control_hung``, ``control_p99_ok_seconds``, ``p99_over_control``),
``rooms_left_after_settle`` and ``requests_left_after_settle`` (every runtime, after the load
and ``--settle``), ``abandoned_rooms_max``, ``waiting_on_peer_max``, ``remediations``;
``tokens_after_hangup`` (decode tokens produced after their client had left: the goal is 0,
decode stops before its next step), ``decode_hangups`` (requests decode ended because their
client left) and ``tokens_produced``, summed over the decode runtimes' ``/debug/state`` over the
run (every arm), ``token_interval_ms``; with ``--stream``, ``stream``: the streaming arm's
``requests``, ``hung_up``, ``ok``, ``failed``, ``hung``, ``p99_ok_seconds`` and
``hangup_after_events``; ``router`` (name, version), ``prefills``, ``decodes``, ``seconds``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
import click

from pdwarden_bench import streams
from pdwarden_bench.arms import round_order
from pdwarden_localcluster.waits import wait_for
from pdwarden_operator.render.router import ROUTER_MODULE
from pdwarden_operator.watchdog.history import Histories, PodScrape
from pdwarden_operator.watchdog.parse import ParseError, parse_metrics
from pdwarden_operator.watchdog.rule import judge
from pdwarden_testkit.promtext import samples
from pdwarden_testkit.runtime_procs import (
    Fleet,
    Runtime,
    exit_on_sigterm,
    http_get,
    serve_flags,
    wait_healthy,
    wait_router,
)

OK, FAILED, CANCELLED, TIMED_OUT = streams.OK, streams.FAILED, streams.HUNG_UP, streams.TIMED_OUT
ARM_CANCELLING, ARM_CONTROL, ARM_STREAMING = "cancelling", "control", "streaming"
PAGE_TOKENS: Final = 16
# A stream that hangs up asks for at least this many tokens beyond its hang-up point.
STREAM_TAIL_TOKENS: Final = 32
STREAM_TOKEN_INTERVAL_MS: Final = 10.0  # decode's pace with --stream, unless given
HANGUP_AFTER_EVENTS: Final = 3
# What decode's /debug/state counts of the requests whose client left, summed over decodes.
DECODE_COUNTERS: Final = ("hangups", "tokens_after_hangup", "tokens_produced")


@dataclass(frozen=True)
class Workload:
    requests: int = 600
    concurrency: int = 64
    cancel_fraction: float = 0.3
    cancel_max_ms: float = 200.0
    prompt_max_chars: int = 2000
    max_new_tokens: int = 64
    client_timeout: float = 120.0
    seed: int = 29


DETAIL_BYTES = 200  # of a failed answer's body, kept to say why


@dataclass(frozen=True)
class PlannedRequest:
    chars: int
    max_new_tokens: int
    cancel_after: float | None  # seconds; None: the client waits for its answer

    @property
    def cancels(self) -> bool:
        return self.cancel_after is not None


@dataclass(frozen=True)
class PlannedStream:
    chars: int
    max_new_tokens: int
    hangup_after_events: int | None  # None: the client reads the stream to its end

    @property
    def cancels(self) -> bool:
        return self.hangup_after_events is not None


@dataclass(frozen=True)
class Result:
    planned: PlannedRequest | PlannedStream
    outcome: str
    seconds: float
    status: int | None = None
    detail: str = ""  # the start of a failed answer's body: why it failed


def plan(
    workload: Workload, *, cancelling: bool, count: int | None = None, offset: int = 0
) -> list[PlannedRequest]:
    """The seeded requests ``offset .. offset+count``: the same prompts in both arms; only the
    cancelling arm cancels."""
    rng = random.Random(workload.seed)
    out = []
    for i in range(offset + (workload.requests if count is None else count)):
        chars = rng.randint(1, workload.prompt_max_chars)
        max_new = rng.randint(1, workload.max_new_tokens)
        cancels = rng.random() < workload.cancel_fraction
        after = rng.uniform(0.001, workload.cancel_max_ms / 1000)
        if i >= offset:
            out.append(PlannedRequest(chars, max_new, after if cancelling and cancels else None))
    return out


def plan_streams(
    workload: Workload, hangup_after_events: int, count: int | None = None, offset: int = 0
) -> list[PlannedStream]:
    """The streaming arm's requests: the cancelling arm's prompts and picks, a cancelling
    client hanging up once ``hangup_after_events`` events came, its stream long enough
    (``STREAM_TAIL_TOKENS`` more tokens) to be cut mid-answer."""
    least = hangup_after_events + STREAM_TAIL_TOKENS
    return [
        PlannedStream(p.chars, max(p.max_new_tokens, least), hangup_after_events)
        if p.cancels
        else PlannedStream(p.chars, p.max_new_tokens, None)
        for p in plan(workload, cancelling=True, count=count, offset=offset)
    ]


def prompt(chars: int) -> str:
    return ("pdwarden cancellations " * (chars // 23 + 1))[:chars]


def request_body(planned: PlannedRequest, model: str | None = None) -> dict[str, Any]:
    """The request's body; ``model``: the model's served name (a router that discovers its
    workers routes by it)."""
    body: dict[str, Any] = {
        "text": prompt(planned.chars),
        "sampling_params": {"max_new_tokens": planned.max_new_tokens, "temperature": 0.0},
    }
    if model is not None:
        body["model"] = model
    return body


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    planned: PlannedRequest,
    client_timeout: float,
    model: str | None,
) -> Result:
    body = request_body(planned, model)
    start = time.monotonic()

    async def send() -> tuple[int, bytes]:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=client_timeout)) as resp:
            return resp.status, await resp.read()

    task = asyncio.ensure_future(send())
    try:
        status, answer = await asyncio.wait_for(asyncio.shield(task), planned.cancel_after)
    except TimeoutError:
        if planned.cancel_after is not None and not task.done():
            task.cancel()  # the client walks away: its connection closes
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            return Result(planned, CANCELLED, time.monotonic() - start)
        return Result(planned, TIMED_OUT, time.monotonic() - start)
    except (aiohttp.ClientError, OSError):
        return Result(planned, FAILED, time.monotonic() - start)
    finally:
        if not task.done():
            task.cancel()
    seconds = time.monotonic() - start
    if status == 200:
        return Result(planned, OK, seconds, status)
    return Result(planned, FAILED, seconds, status, answer[:DETAIL_BYTES].decode(errors="replace"))


async def run_load(
    url: str,
    requests: Sequence[PlannedRequest],
    concurrency: int,
    client_timeout: float,
    model: str | None = None,
) -> list[Result]:
    """Send every planned request, ``concurrency`` at a time; each one's result."""
    sem = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def bounded(planned: PlannedRequest) -> Result:
            async with sem:
                return await _one(session, url, planned, client_timeout, model)

        return list(await asyncio.gather(*(bounded(p) for p in requests)))


async def run_streams(
    url: str,
    planned: Sequence[PlannedStream],
    concurrency: int,
    client_timeout: float,
    model: str | None = None,
) -> list[Result]:
    """Every planned stream, ``concurrency`` at a time, through ``url`` (a router's chat
    completions); each one's result (CANCELLED: its client hung up as planned)."""
    sem = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def bounded(p: PlannedStream) -> Result:
            body = streams.chat_body(prompt(p.chars), p.max_new_tokens, model or streams.SYNTHETIC_MODEL)
            async with sem:
                got = await streams.stream_chat(
                    session, url, body, hangup_after=p.hangup_after_events, timeout=client_timeout
                )
            return Result(p, got.outcome, got.seconds, got.status, got.detail)

        return list(await asyncio.gather(*(bounded(p) for p in planned)))


def hung(results: Sequence[Result], within: float) -> int:
    """Requests not cancelled by their client and not answered within ``within`` seconds."""
    return sum(1 for r in results if not r.planned.cancels and (r.outcome == TIMED_OUT or r.seconds > within))


def decode_counters(states: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """``DECODE_COUNTERS`` summed over decode runtimes' /debug/state (0 where one lacks it)."""
    return {key: sum(int(state.get(key) or 0) for state in states) for key in DECODE_COUNTERS}


def counters_moved(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """How far each counter moved between two readings (a counter absent before counts from 0)."""
    return {key: value - before.get(key, 0) for key, value in after.items()}


# smg's gauge of each worker's health (1 healthy), labelled with the worker's URL.
WORKER_HEALTH: Final = "smg_worker_health"


def router_workers(metrics_url: str, roles: Mapping[str, str], timeout: float = 5.0) -> dict[str, int]:
    """Healthy workers per role as smg counts them (its `smg_worker_health` gauge, read on its
    metrics port: its worker list is its control plane, which a gated router answers no one);
    `roles` names each worker's role by its URL's host:port. Empty while smg does not answer."""
    status, text = http_get(metrics_url, timeout)
    try:
        found = samples(text, {WORKER_HEALTH}) if status == 200 else []
    except ValueError:
        found = []
    counts: dict[str, int] = {}
    for sample in found:
        role = roles.get(urlsplit(sample.labels.get("worker", "")).netloc)
        if role is not None and sample.value == 1:
            counts[role] = counts.get(role, 0) + 1
    return counts


def wait_router_workers(
    metrics_url: str, roles: Mapping[str, str], prefills: int, decodes: int, timeout: float = 120.0
) -> None:
    """Until smg routes to every pod: it discovers them itself, some seconds after they are
    ready, and a workload started before that meets 503 no_available_workers."""
    every = {"prefill": prefills, "decode": decodes}
    wait_for(lambda: router_workers(metrics_url, roles) == every, timeout, f"the router listing {every}", 1.0)


def failure_reasons(results: Sequence[Result], top: int = 3) -> dict[str, int]:
    """The commonest answers of failed requests ("<status> <body's start>"), with counts."""
    counts = collections.Counter(
        f"{r.status} {r.detail[:80]}".strip() for r in results if r.outcome == FAILED
    )
    return dict(counts.most_common(top))


def p99(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


@dataclass
class WedgeWatch:
    """The operator's wedge rule over the runtimes' /metrics, one scrape per interval."""

    urls: dict[str, str]  # pod name -> metrics URL
    stuck_after: float
    interval: float
    histories: Histories = field(init=False)
    wedged: dict[str, str] = field(default_factory=dict)  # pod -> the first wedge's reason
    abandoned_max: float = 0.0
    waiting_on_peer_max: float = 0.0
    scrapes: int = 0

    def __post_init__(self) -> None:
        self.histories = Histories(keep_seconds=self.stuck_after + 3 * self.interval)

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while not stop.is_set():
                await self.round(session)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval)

    async def round(self, session: aiohttp.ClientSession) -> None:
        abandoned = waiting = 0.0
        for pod, url in self.urls.items():
            at = time.monotonic()
            try:
                async with session.get(url) as resp:
                    sample = parse_metrics(await resp.read())
                observation = PodScrape(at, sample)
                abandoned += sample.abandoned or 0.0
                waiting += sample.bootstrapping or 0.0
            except (aiohttp.ClientError, TimeoutError, ParseError) as err:
                observation = PodScrape(at, None, str(err))
            verdict = judge(self.histories.add(pod, observation).observations(), self.stuck_after)
            if verdict.wedged and pod not in self.wedged:
                self.wedged[pod] = verdict.reason
        self.abandoned_max = max(self.abandoned_max, abandoned)
        self.waiting_on_peer_max = max(self.waiting_on_peer_max, waiting)
        self.scrapes += 1


@dataclass(frozen=True)
class Leftovers:
    """What the runtimes still hold after the load: rooms and requests, per runtime."""

    rooms: dict[str, dict[str, int]]
    requests: dict[str, int]

    @property
    def room_count(self) -> int:
        return sum(sum(by_state.values()) for by_state in self.rooms.values())

    @property
    def request_count(self) -> int:
        return sum(self.requests.values())


def leftovers(runtimes: Sequence[Runtime]) -> Leftovers:
    rooms: dict[str, dict[str, int]] = {}
    requests: dict[str, int] = {}
    for rt in runtimes:
        state = rt.state()
        name = f"{rt.role}:{rt.port}"
        if state.get("rooms"):
            rooms[name] = dict(state["rooms"])
        if state.get("pending_requests"):
            requests[name] = int(state["pending_requests"])
    return Leftovers(rooms, requests)


def router_identity(python: str | None, module: str) -> dict[str, str]:
    """The router's distribution and version, as installed for ``python``."""
    name = module.split(".", 1)[0].replace("_", "-")
    if python is None:
        try:
            return {"name": name, "version": metadata.version(name)}
        except metadata.PackageNotFoundError:
            return {"name": name, "version": "unknown"}
    code = f"import importlib.metadata as m; print(m.version({name!r}))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    return {"name": name, "version": done.stdout.strip() or "unknown"}


def _progress(message: str) -> None:
    print(f"[bench cancellations] {message}", file=sys.stderr, flush=True)


def arms(stream: bool) -> list[str]:
    """The arms in their order in even rounds (reversed in odd ones: ABAB, or ABC CBA)."""
    return [ARM_CANCELLING, ARM_CONTROL, *([ARM_STREAMING] if stream else [])]


async def _interleaved(
    router_url: str, workload: Workload, rounds: int, watch: WedgeWatch, hangup_events: int | None
) -> dict[str, list[Result]]:
    """Every arm's requests, round by round; ``hangup_events`` None: no streaming arm."""
    every = arms(hangup_events is not None)
    results: dict[str, list[Result]] = {arm: [] for arm in every}
    stop = asyncio.Event()
    watcher = asyncio.ensure_future(watch.run(stop))
    try:
        per_round = max(1, workload.requests // rounds)
        for i in range(rounds):
            offset = i * per_round
            count = per_round if i < rounds - 1 else workload.requests - offset
            for arm in round_order(every, i):
                _progress(f"round {i + 1}/{rounds}: {arm}, {count} requests")
                if arm == ARM_STREAMING and hangup_events is not None:
                    planned = plan_streams(workload, hangup_events, count=count, offset=offset)
                    results[arm] += await run_streams(
                        f"{router_url}{streams.CHAT_PATH}",
                        planned,
                        workload.concurrency,
                        workload.client_timeout,
                    )
                    continue
                requests = plan(workload, cancelling=arm == ARM_CANCELLING, count=count, offset=offset)
                results[arm] += await run_load(
                    f"{router_url}/generate", requests, workload.concurrency, workload.client_timeout
                )
    finally:
        stop.set()
        await watcher
    return results


def stream_figures(results: Sequence[Result], within: float, hangup_events: int) -> dict[str, Any]:
    """The streaming arm's part of the JSON line."""
    ok_s = p99([r.seconds for r in results if r.outcome == OK])
    return {
        "requests": len(results),
        "hung_up": sum(r.outcome == CANCELLED for r in results),
        "ok": sum(r.outcome == OK for r in results),
        "failed": sum(r.outcome == FAILED and not r.planned.cancels for r in results),
        "hung": hung(results, within),
        "p99_ok_seconds": None if ok_s is None else round(ok_s, 3),
        "hangup_after_events": hangup_events,
    }


@click.command("cancellations")
@click.option("--requests", type=click.IntRange(1, 100_000), default=600, show_default=True, help="Per arm.")
@click.option("--concurrency", type=click.IntRange(1, 512), default=64, show_default=True)
@click.option("--cancel-fraction", type=click.FloatRange(0, 1), default=0.3, show_default=True)
@click.option("--cancel-max-ms", type=click.FloatRange(min=1), default=200.0, show_default=True)
@click.option("--prompt-max-chars", type=click.IntRange(1, 16_000), default=2000, show_default=True)
@click.option(
    "--rounds", type=click.IntRange(1, 100), default=2, show_default=True, help="ABAB pairs of the two arms."
)
@click.option("--prefills", type=click.IntRange(1, 8), default=1, show_default=True)
@click.option("--decodes", type=click.IntRange(1, 8), default=1, show_default=True)
@click.option("--transfer-deadline", type=click.FloatRange(min=0.5), default=20.0, show_default=True)
@click.option("--inflight-deadline", type=click.FloatRange(min=1), default=30.0, show_default=True)
@click.option("--stuck-after", type=click.FloatRange(min=1), default=60.0, show_default=True)
@click.option("--scrape-interval", type=click.FloatRange(min=0.5), default=5.0, show_default=True)
@click.option("--settle", type=click.FloatRange(min=0), default=10.0, show_default=True)
@click.option("--seed", type=int, default=29, show_default=True)
@click.option(
    "--stream",
    is_flag=True,
    help="A third arm: the same prompts as streamed chats, the cancelling ones hung up mid-answer.",
)
@click.option(
    "--hangup-after-events",
    type=click.IntRange(1, 1000),
    default=HANGUP_AFTER_EVENTS,
    show_default=True,
    help="With --stream: a hanging-up client leaves once this many server-sent events came.",
)
@click.option(
    "--token-interval-ms",
    type=click.FloatRange(0, 1000),
    default=None,
    help=f"Decode's pace between two tokens (default {STREAM_TOKEN_INTERVAL_MS:g} with --stream, else 0).",
)
@click.option(
    "--router-python",
    default=None,
    help="Run the router from this interpreter (another router installation, to compare).",
)
@click.option("--router-module", default=ROUTER_MODULE, show_default=True, help="The router's launch module.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line on stdout.")
def cancellations(
    requests: int,
    concurrency: int,
    cancel_fraction: float,
    cancel_max_ms: float,
    prompt_max_chars: int,
    rounds: int,
    prefills: int,
    decodes: int,
    transfer_deadline: float,
    inflight_deadline: float,
    stuck_after: float,
    scrape_interval: float,
    settle: float,
    seed: int,
    stream: bool,
    hangup_after_events: int,
    token_interval_ms: float | None,
    router_python: str | None,
    router_module: str,
    as_json: bool,
) -> None:
    """Clients that cancel through the router, beside the same workload without cancellations."""
    exit_on_sigterm()
    t0 = time.monotonic()
    workload = Workload(
        requests=requests,
        concurrency=concurrency,
        cancel_fraction=cancel_fraction,
        cancel_max_ms=cancel_max_ms,
        prompt_max_chars=prompt_max_chars,
        seed=seed,
    )
    if token_interval_ms is None:
        token_interval_ms = STREAM_TOKEN_INTERVAL_MS if stream else 0.0
    flags = serve_flags(transfer_deadline=transfer_deadline, inflight_deadline=inflight_deadline)
    decode_flags = [*flags, "--token-interval-ms", f"{token_interval_ms:g}"]
    with Fleet() as fleet:
        _progress(f"starting {prefills} prefill and {decodes} decode runtimes and the router")
        p_rts = [fleet.runtime("prefill", extra=flags) for _ in range(prefills)]
        d_rts = [fleet.runtime("decode", extra=decode_flags) for _ in range(decodes)]
        runtimes = [*p_rts, *d_rts]
        wait_healthy(runtimes, timeout=300)
        router = fleet.router(p_rts, d_rts, python=router_python, module=router_module)
        wait_router(router, timeout=240)
        if router_module == ROUTER_MODULE:  # smg exports its workers' health; another router may not
            roles = {f"{rt.host}:{rt.port}": rt.role for rt in runtimes}
            wait_router_workers(router.metrics_url, roles, prefills, decodes)
        watch = WedgeWatch(
            {f"{rt.role}:{rt.port}": rt.metrics_url for rt in runtimes}, stuck_after, scrape_interval
        )
        before = decode_counters([rt.state() for rt in d_rts])
        hangup_events = hangup_after_events if stream else None
        results = asyncio.run(_interleaved(router.url, workload, rounds, watch, hangup_events))
        time.sleep(settle)
        left = leftovers(runtimes)
        moved = counters_moved(before, decode_counters([rt.state() for rt in d_rts]))
    cancelling, control = results[ARM_CANCELLING], results[ARM_CONTROL]
    ok_s = [r.seconds for r in cancelling if r.outcome == OK]
    control_ok_s = [r.seconds for r in control if r.outcome == OK]
    p99_ok, p99_control = p99(ok_s), p99(control_ok_s)
    line = {
        "requests": len(cancelling),
        "cancelled": sum(r.outcome == CANCELLED for r in cancelling),
        "ok": sum(r.outcome == OK for r in cancelling),
        "failed": sum(r.outcome == FAILED and not r.planned.cancels for r in cancelling),
        "hung": hung(cancelling, inflight_deadline),
        "failed_why": failure_reasons([r for arm in results.values() for r in arm]),
        "p99_ok_seconds": None if p99_ok is None else round(p99_ok, 3),
        "control_ok": sum(r.outcome == OK for r in control),
        "control_hung": hung(control, inflight_deadline),
        "control_p99_ok_seconds": None if p99_control is None else round(p99_control, 3),
        "p99_over_control": None if not (p99_ok and p99_control) else round(p99_ok / p99_control, 2),
        "rooms_left_after_settle": left.room_count,
        "requests_left_after_settle": left.request_count,
        "abandoned_rooms_max": watch.abandoned_max,
        "waiting_on_peer_max": watch.waiting_on_peer_max,
        "remediations": len(watch.wedged),
        "tokens_after_hangup": moved["tokens_after_hangup"],
        "decode_hangups": moved["hangups"],
        "tokens_produced": moved["tokens_produced"],
        "token_interval_ms": token_interval_ms,
        "router": router_identity(router_python, router_module),
        "prefills": prefills,
        "decodes": decodes,
        "seconds": round(time.monotonic() - t0, 1),
    }
    if stream:
        line["stream"] = stream_figures(results[ARM_STREAMING], inflight_deadline, hangup_after_events)
    if not as_json:
        for pod, reason in watch.wedged.items():
            _progress(f"the wedge rule judged {pod} wedged: {reason}")
        if left.room_count or left.request_count:
            _progress(f"left after {settle:g}s: rooms {left.rooms}, requests {left.requests}")
    print(json.dumps(line))
