"""Helper of bench/gpu_pd_check.sh: a tiny random model, readiness waits, the load, the figures.

Subcommands (each prints what it did; `load` prints the check's JSON line last):

  make-model DIR        config.json (a small Llama) + a word-level tokenizer, made on the
                        spot; SGLang loads it with --load-format dummy (random weights).
  check-model DIR       loads the tokenizer and config the way SGLang does (dry run on CPU).
  plan ROLE ... -- ARGS the launcher's SGLang arguments for ROLE, checked by SGLang's parser.
  wait URL [URL...]     until every URL answers 200 (GET), or --timeout.
  wait-generate URL     until a tiny POST /generate through URL succeeds (router ready).
  load                  N requests through the router, a fraction cancelled mid-flight,
                        then drain and read the runtime metrics; one JSON line.

Nothing is downloaded: the tokenizer is built from a fixed vocabulary with `tokenizers`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.promtext import Sample, metric_sum, samples

# --- the model ---------------------------------------------------------------------------
VOCAB_WORDS = 4092  # + 4 specials = 4096 ids
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
# Llama shapes: 8 layers x 8 KV heads x head_dim 128, bf16 -> 32 KiB of KV per token, so a
# 1024-token prompt moves 32 MiB from prefill to decode (enough to measure GB/s).
MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": VOCAB_WORDS + len(SPECIALS),
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def kv_bytes_per_token(config: Mapping[str, Any] = MODEL_CONFIG, dtype_bytes: int = 2) -> int:
    return (
        int(config["num_hidden_layers"])
        * 2
        * int(config["num_key_value_heads"])
        * int(config["head_dim"])
        * dtype_bytes
    )


def make_model(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(MODEL_CONFIG, indent=2))
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3})
    )
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"w{i}": len(SPECIALS) + i for i in range(VOCAB_WORDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
    )
    fast.save_pretrained(str(directory))
    print(
        f"model: {directory} (random weights via --load-format dummy; "
        f"{kv_bytes_per_token()} KV bytes per token)"
    )


def prompt(n_tokens: int, rng: random.Random) -> str:
    return " ".join(f"w{rng.randrange(VOCAB_WORDS)}" for _ in range(n_tokens))


def check_model(directory: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(directory))
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    text = prompt(100, random.Random(0))
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 100 or max(ids) >= config.vocab_size or tokenizer.unk_token_id in ids:
        raise SystemExit(
            f"tokenizer/config mismatch: {len(ids)} ids, max {max(ids)}, vocab {config.vocab_size}"
        )
    if tokenizer.decode(ids) != text:
        raise SystemExit("tokenizer does not round-trip")
    # the loaders SGLang's tokenizer manager and model config use
    from sglang.srt.utils.hf_transformers.config import get_config
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    sgl_config = get_config(str(directory), trust_remote_code=False)
    sgl_tokenizer = get_tokenizer(str(directory))
    if (
        sgl_tokenizer.encode(text, add_special_tokens=False) != ids
        or sgl_config.vocab_size != config.vocab_size
    ):
        raise SystemExit("SGLang's loaders disagree with transformers' on the model")
    print(
        f"model ok: {config.model_type}, {config.num_hidden_layers} layers, vocab {config.vocab_size}, "
        f"tokenizer {type(tokenizer).__name__} round-trips, SGLang's loaders agree"
    )


def plan(role: str, host: str, port: int, bootstrap_port: int, user_args: Sequence[str]) -> None:
    """Print (and check with SGLang's own parser) the arguments the launcher will give SGLang."""
    import argparse as ap

    from sglang.srt.server_args import ServerArgs

    from pdwarden_runtime.engines.sglang_engine import plan_launch

    launch = plan_launch(role, host, port, bootstrap_port, user_args)
    parser = ap.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(launch.sglang_args)
    assert ns.disaggregation_mode == role and ns.disaggregation_transfer_backend == "nixl"
    assert (ns.port, ns.disaggregation_bootstrap_port) == (port, bootstrap_port)
    print(launch.describe())


# --- readiness ---------------------------------------------------------------------------
def wait_urls(urls: Sequence[str], timeout: float) -> None:
    for url in urls:
        wait_for(partial(_get_ok, url), timeout, f"{url} to answer 200", 1.0)
        print(f"ready: {url}", flush=True)


def _get_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return bool(resp.status == 200)


def wait_generate(url: str, timeout: float) -> None:
    body = json.dumps(
        {"text": "w1 w2 w3", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    ).encode()
    req = urllib.request.Request(f"{url}/generate", data=body, headers={"Content-Type": "application/json"})

    def generates() -> bool:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return bool(resp.status == 200)

    wait_for(generates, timeout, f"a successful /generate through {url}", 2.0)
    print(f"generate ok through {url}", flush=True)


# --- metrics -----------------------------------------------------------------------------
def scrape(url: str) -> list[Sample]:
    """The samples of a Prometheus text endpoint ([] if down)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return []
    return samples(text)


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


OUTCOMES = ("success", "failed", "aborted", "deadline")


def figures(
    results: Sequence[Mapping[str, Any]],
    before: Mapping[str, list[Sample]],
    after: Mapping[str, list[Sample]],
    load_seconds: float,
) -> dict[str, Any]:
    """The check's figures from per-request results and metric snapshots (pure)."""
    completed = [r for r in results if r["outcome"] == "completed"]
    latencies = [r["latency_s"] for r in completed]
    pre_b, pre_a = before.get("prefill", []), after.get("prefill", [])
    moved = metric_sum(pre_a, "pdwarden_kv_transfer_bytes_total") - metric_sum(
        pre_b, "pdwarden_kv_transfer_bytes_total"
    )
    speed_sum = sum(
        metric_sum(after.get(r, []), "sglang:kv_transfer_speed_gb_s_sum")
        - metric_sum(before.get(r, []), "sglang:kv_transfer_speed_gb_s_sum")
        for r in ("prefill_sglang",)
    )
    speed_n = sum(
        metric_sum(after.get(r, []), "sglang:kv_transfer_speed_gb_s_count")
        - metric_sum(before.get(r, []), "sglang:kv_transfer_speed_gb_s_count")
        for r in ("prefill_sglang",)
    )
    outcomes = {
        role: {
            o: metric_sum(after.get(role, []), "pdwarden_kv_transfers_total", outcome=o)
            - metric_sum(before.get(role, []), "pdwarden_kv_transfers_total", outcome=o)
            for o in OUTCOMES
        }
        for role in ("prefill", "decode")
    }
    wedged = {
        role: metric_sum(after.get(role, []), "pdwarden_inflight_requests") for role in ("prefill", "decode")
    }
    p50, p99 = percentile(latencies, 0.50), percentile(latencies, 0.99)
    return {
        "requests": len(results),
        "completed": len(completed),
        "aborted": sum(1 for r in results if r["outcome"] == "cancelled"),
        "errors": sum(1 for r in results if r["outcome"] == "error"),
        "timed_out": sum(1 for r in results if r["outcome"] == "timeout"),
        "wedged_rooms": int(sum(wedged.values())),
        "wedged_rooms_by_role": {k: int(v) for k, v in wedged.items()},
        "sglang_inflight_after_drain": {
            "prefill": metric_sum(after.get("prefill_sglang", []), "sglang:num_prefill_inflight_queue_reqs"),
            "decode": metric_sum(after.get("decode_sglang", []), "sglang:num_decode_transfer_queue_reqs"),
        },
        "latency_p50_s": None if p50 is None else round(p50, 4),
        "latency_p99_s": None if p99 is None else round(p99, 4),
        "kv_bytes": int(moved),
        "kv_transfer_gbps": round(moved / load_seconds / 1e9, 3) if load_seconds > 0 else None,
        "kv_transfer_gbps_per_transfer_sglang": round(speed_sum / speed_n, 3) if speed_n else None,
        "transfer_outcomes": outcomes,
        "status_writes_refused": int(
            metric_sum(after.get("prefill", []), "pdwarden_kv_status_writes_refused_total")
            - metric_sum(before.get("prefill", []), "pdwarden_kv_status_writes_refused_total")
        ),
        "load_seconds": round(load_seconds, 2),
    }


# --- the load ----------------------------------------------------------------------------
async def one_request(
    session: Any, url: str, body: dict[str, Any], cancel_after: float | None, timeout: float
) -> dict[str, Any]:
    import aiohttp

    start = time.monotonic()

    async def call() -> dict[str, Any]:
        async with session.post(f"{url}/generate", json=body) as resp:
            payload = await resp.read()
            if resp.status != 200:
                return {
                    "outcome": "error",
                    "status": resp.status,
                    "detail": payload[:200].decode(errors="replace"),
                }
            return {"outcome": "completed"}

    try:
        if cancel_after is not None:
            try:
                result = await asyncio.wait_for(call(), cancel_after)
            except TimeoutError:
                return {"outcome": "cancelled", "latency_s": time.monotonic() - start}
        else:
            result = await asyncio.wait_for(call(), timeout)
    except TimeoutError:
        result = {"outcome": "timeout"}
    except aiohttp.ClientError as err:
        result = {"outcome": "error", "detail": str(err)[:200]}
    result["latency_s"] = time.monotonic() - start
    return result


async def run_load(args: argparse.Namespace) -> list[dict[str, Any]]:
    import aiohttp

    rng = random.Random(args.seed)
    sem = asyncio.Semaphore(args.concurrency)
    connector = aiohttp.TCPConnector(limit=args.concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def bounded(i: int) -> dict[str, Any]:
            cancel = rng.random() < args.cancel_fraction
            n_tokens = rng.randint(args.prompt_tokens // 2, args.prompt_tokens)
            body = {
                "text": prompt(n_tokens, rng),
                "sampling_params": {
                    "max_new_tokens": args.max_new_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
                "stream": cancel,  # a cancelled client is a streaming one hanging up mid-way
            }
            cancel_after = rng.uniform(0.0, args.cancel_max_s) if cancel else None
            async with sem:
                return await one_request(session, args.router, body, cancel_after, args.request_timeout)

        return list(await asyncio.gather(*(bounded(i) for i in range(args.requests))))


def snapshot(args: argparse.Namespace) -> dict[str, list[Sample]]:
    return {
        "prefill": scrape(args.prefill_metrics),
        "decode": scrape(args.decode_metrics),
        "prefill_sglang": scrape(args.prefill_sglang_metrics),
        "decode_sglang": scrape(args.decode_sglang_metrics),
    }


def drain(args: argparse.Namespace) -> float:
    """Wait until no room is in flight on either role (or the drain window ends)."""
    start = time.monotonic()
    while time.monotonic() - start < args.drain_s:
        snap = snapshot(args)
        if all(metric_sum(snap[r], "pdwarden_inflight_requests") == 0 for r in ("prefill", "decode")):
            break
        time.sleep(1)
    return time.monotonic() - start


def load(args: argparse.Namespace) -> None:
    before = snapshot(args)
    start = time.monotonic()
    results = asyncio.run(run_load(args))
    load_seconds = time.monotonic() - start
    drained = drain(args)
    after = snapshot(args)
    report = {
        "bench": "gpu_pd_check",
        "cancel_fraction": args.cancel_fraction,
        **figures(results, before, after, load_seconds),
        "drain_seconds": round(drained, 1),
        **json.loads(args.extra or "{}"),
    }
    print(json.dumps(report, sort_keys=True), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make-model")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("check-model")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("plan")
    p.add_argument("role", choices=["prefill", "decode"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bootstrap-port", type=int, required=True)
    p.add_argument("sglang_args", nargs=argparse.REMAINDER)
    p = sub.add_parser("wait")
    p.add_argument("urls", nargs="+")
    p.add_argument("--timeout", type=float, default=240)
    p = sub.add_parser("wait-generate")
    p.add_argument("url")
    p.add_argument("--timeout", type=float, default=120)
    p = sub.add_parser("load")
    p.add_argument("--router", required=True)
    p.add_argument("--prefill-metrics", required=True)
    p.add_argument("--decode-metrics", required=True)
    p.add_argument("--prefill-sglang-metrics", required=True)
    p.add_argument("--decode-sglang-metrics", required=True)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--cancel-fraction", type=float, default=0.3)
    p.add_argument("--cancel-max-s", type=float, default=0.5)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--request-timeout", type=float, default=120)
    p.add_argument("--drain-s", type=float, default=45)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--extra", help="JSON object merged into the report (e.g. the doctor's verdict)")
    args = parser.parse_args(argv)
    if args.cmd == "make-model":
        make_model(args.dir)
    elif args.cmd == "check-model":
        check_model(args.dir)
    elif args.cmd == "plan":
        user = args.sglang_args[1:] if args.sglang_args[:1] == ["--"] else args.sglang_args
        plan(args.role, args.host, args.port, args.bootstrap_port, user)
    elif args.cmd == "wait":
        wait_urls(args.urls, args.timeout)
    elif args.cmd == "wait-generate":
        wait_generate(args.url, args.timeout)
    elif args.cmd == "load":
        load(args)


if __name__ == "__main__":
    main()
