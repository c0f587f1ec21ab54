"""The launcher's view of SGLang's flags agrees with SGLang 0.5.23's real parser."""

from __future__ import annotations

import argparse

import pytest

from pdwarden_runtime.engines.sglang_engine import (
    DP_FLAGS,
    FORBIDDEN_FLAGS,
    MANAGED_FLAGS,
    MANAGED_SWITCHES,
    TP_FLAGS,
    plan_launch,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    return p


def spellings(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    return {a.dest: set(a.option_strings) for a in parser._actions if a.option_strings}


def test_every_spelling_of_a_managed_flag_is_known(parser: argparse.ArgumentParser) -> None:
    real = spellings(parser)
    for dest, flags in {**MANAGED_FLAGS, **MANAGED_SWITCHES}.items():
        assert real[dest] == set(flags), dest
    assert real["tp_size"] <= set(TP_FLAGS)
    assert real["dp_size"] <= set(DP_FLAGS)
    for abbreviation, dest in (("--tp", "tp_size"), ("--dp", "dp_size")):
        assert abbreviation in TP_FLAGS + DP_FLAGS
        ns = parser.parse_args(["--model-path", "/m", abbreviation, "3"])
        assert getattr(ns, dest) == 3
    every = set().union(*real.values())
    assert set(FORBIDDEN_FLAGS) <= every


def test_switches_are_switches(parser: argparse.ArgumentParser) -> None:
    by_dest = {a.dest: a for a in parser._actions}
    for dest in MANAGED_SWITCHES:
        assert by_dest[dest].nargs == 0, dest


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_sglang_parses_the_launch_plan_as_intended(parser: argparse.ArgumentParser, role: str) -> None:
    user = ["--model-path", "/models/m", "--tp-size", "2", "--port", "31000", "--enable-metrics"]
    plan = plan_launch(role, "127.0.0.9", 31000, 31001, user)
    ns = parser.parse_args(plan.sglang_args)
    assert ns.disaggregation_mode == role
    assert ns.disaggregation_transfer_backend == "nixl"
    assert ns.disaggregation_bootstrap_port == 31001
    assert (ns.host, ns.port) == ("127.0.0.9", 31000)
    assert ns.enable_metrics is True
    assert ns.tp_size == 2 and plan.tp_size == 2
    assert ns.model_path == "/models/m"


@pytest.mark.parametrize("key", ["plain-key_0", "-starts-with-a-dash", "--looks-like-a-flag"])
def test_sglang_reads_any_worker_key_as_its_api_key(parser: argparse.ArgumentParser, key: str) -> None:
    """A urlsafe key starts with "-" one time in 64: it must still be the value, not an option."""
    from pdwarden_runtime.engines.sglang_engine import worker_key_args

    ns = parser.parse_args(["--model-path", "/models/m", *worker_key_args(key, [])])
    assert ns.api_key == key
