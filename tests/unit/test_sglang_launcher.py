"""The sglang engine's launcher: SGLang arguments for a pdwarden pod (pure logic)."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

from pdwarden_runtime.engines.sglang_engine import (
    LaunchPlan,
    SglangArgumentError,
    check_options,
    config_file_args,
    hardening_config,
    launch_env_preview,
    plan_launch,
)
from pdwarden_runtime.sglang_boot import ENV_HARDENING, ENV_HARDENING_CONFIG, SITE_DIR, seam_env

pytestmark = pytest.mark.unit

MODEL = ["--model-path", "/models/llama", "--mem-fraction-static", "0.8"]


def plan(role: str = "prefill", user: list[str] | None = None, **kw: object) -> LaunchPlan:
    args = dict(host="10.0.0.7", port=30000, bootstrap_port=8998)
    args.update(kw)  # type: ignore[arg-type]
    return plan_launch(role, user_args=MODEL if user is None else user, **args)  # type: ignore[arg-type]


def pairs(tokens: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 0
    while i < len(tokens):
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[tokens[i]] = tokens[i + 1]
            i += 2
        else:
            out[tokens[i]] = None
            i += 1
    return out


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_role_ports_and_nixl_are_added_and_user_args_pass_through(role: str) -> None:
    p = plan(role)
    added = pairs(p.added)
    assert added == {
        "--disaggregation-mode": role,
        "--disaggregation-transfer-backend": "nixl",
        "--disaggregation-bootstrap-port": "8998",
        "--host": "10.0.0.7",
        "--port": "30000",
        "--enable-metrics": None,
    }
    assert p.user == tuple(MODEL)
    assert p.sglang_args == [*p.added, *MODEL]
    assert p.command("/py")[:3] == ["/py", "-m", "sglang.launch_server"]
    assert p.tp_size == 1


def test_describe_prints_added_and_untouched_arguments() -> None:
    text = plan("decode").describe()
    assert "arguments added to SGLang: --disaggregation-mode decode" in text
    assert "--enable-metrics" in text
    assert "(untouched): --model-path /models/llama --mem-fraction-static 0.8" in text


@pytest.mark.parametrize("tp_flag", ["--tp-size", "--tensor-parallel-size", "--tp"])
def test_tensor_parallel_passes_through_and_is_reported(tp_flag: str) -> None:
    user = [*MODEL, tp_flag, "4", "--dp-size", "2"]
    p = plan("prefill", user)
    assert (p.tp_size, p.dp_size) == (4, 2)
    assert p.user == tuple(user)
    assert pairs(p.added)["--disaggregation-mode"] == "prefill"
    assert "tp=4, dp=2" in p.describe()


def test_tensor_parallel_with_equals_form() -> None:
    assert plan("decode", [*MODEL, "--tp-size=8"]).tp_size == 8


@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_bad_tensor_parallel_size_is_a_clear_error(bad: str) -> None:
    with pytest.raises(SglangArgumentError, match="--tp-size must be a positive integer"):
        plan("prefill", [*MODEL, "--tp-size", bad])


@pytest.mark.parametrize(
    ("user", "named"),
    [
        (
            ["--disaggregation-mode", "decode"],
            "--disaggregation-mode decode (pdwarden sets --disaggregation-mode prefill)",
        ),
        (["--disaggregation-mode=null"], "--disaggregation-mode null"),
        (["--disaggregation-transfer-backend", "mooncake"], "--disaggregation-transfer-backend mooncake"),
        (["--port", "31000"], "--port 31000 (pdwarden sets --port 30000)"),
        (["--host=0.0.0.0"], "--host 0.0.0.0 (pdwarden sets --host 10.0.0.7)"),
        (["--disaggregation-bootstrap-port", "9000"], "--disaggregation-bootstrap-port 9000"),
    ],
)
def test_conflicting_user_arguments_are_a_clear_error(user: list[str], named: str) -> None:
    with pytest.raises(SglangArgumentError) as err:
        plan("prefill", [*MODEL, *user])
    assert named in str(err.value)
    assert "prefill pod" in str(err.value)


def test_all_conflicts_are_named_at_once() -> None:
    with pytest.raises(SglangArgumentError) as err:
        plan("decode", [*MODEL, "--port", "1", "--disaggregation-mode", "prefill"])
    assert "--port 1" in str(err.value) and "--disaggregation-mode prefill" in str(err.value)


def test_user_argument_equal_to_ours_is_kept_once_not_duplicated() -> None:
    user = [*MODEL, "--port", "30000", "--disaggregation-transfer-backend=nixl", "--enable-metrics"]
    p = plan("decode", user)
    assert "--port" not in p.added and "--disaggregation-transfer-backend" not in p.added
    assert "--enable-metrics" not in p.added
    assert p.user == tuple(user)
    assert set(p.already_given) == {
        "--port 30000",
        "--disaggregation-transfer-backend nixl",
        "--enable-metrics",
    }
    merged = p.sglang_args
    assert merged.count("--port") == 1 and merged.count("--enable-metrics") == 1


def test_same_port_written_differently_is_not_a_conflict() -> None:
    assert "--port" not in plan("prefill", [*MODEL, "--port", "030000"]).added


def test_abbreviated_managed_flag_is_refused() -> None:
    with pytest.raises(SglangArgumentError, match="abbreviates --disaggregation-mode"):
        plan("prefill", [*MODEL, "--disaggregation-m", "decode"])


def test_unrelated_flags_sharing_a_prefix_are_not_mistaken() -> None:
    user = [
        *MODEL,
        "--enable-metrics-for-all-schedulers",
        "--disaggregation-ib-device",
        "mlx5_0",
        "--port-range-unused-by-sglang",
    ]
    # the last one is not an SGLang flag, SGLang itself will reject it; we only pass it on
    p = plan("prefill", user)
    assert p.user == tuple(user)
    assert "--enable-metrics" in p.added


def test_role_switch_is_refused() -> None:
    with pytest.raises(SglangArgumentError, match="one fixed role"):
        plan("decode", [*MODEL, "--enable-pd-role-switch"])


def test_managed_flag_without_value_is_an_error() -> None:
    with pytest.raises(SglangArgumentError, match="--port needs a value"):
        plan("prefill", [*MODEL, "--port"])


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"port": 0}, "port must be in 1..65535"),
        ({"bootstrap_port": 70000}, "bootstrap port must be in"),
        ({"port": 8998}, "must differ"),
    ],
)
def test_bad_pdwarden_options_are_errors(kw: dict[str, int], match: str) -> None:
    with pytest.raises(SglangArgumentError, match=match):
        plan("prefill", None, **kw)


def test_unknown_role_is_an_error() -> None:
    with pytest.raises(SglangArgumentError, match="unknown role 'router'"):
        plan("router")


def test_config_file_conflict_is_detected(tmp_path) -> None:
    cfg = tmp_path / "sglang.yaml"
    cfg.write_text("model_path: /models/x\ndisaggregation_mode: decode\nenable_metrics: true\n")
    user = ["--config", str(cfg)]
    expanded = config_file_args(user)
    assert expanded == ["--model-path", "/models/x", "--disaggregation-mode", "decode", "--enable-metrics"]
    with pytest.raises(SglangArgumentError, match="--disaggregation-mode decode"):
        plan_launch("prefill", "127.0.0.1", 30000, 8998, user, expanded)


def test_unreadable_config_file_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(SglangArgumentError, match="cannot read SGLang --config file"):
        config_file_args([f"--config={tmp_path / 'missing.yaml'}"])


def test_hardening_config_carries_deadlines_and_fault() -> None:
    options = SimpleNamespace(
        role="prefill",
        host="h",
        port=1,
        bootstrap_port=2,
        metrics_port=3,
        inflight_deadline=120.0,
        transfer_deadline=30.0,
        fault="none",
        hardening="on",
        race_window=5.0,
        allow_fault_injection=False,
    )
    assert hardening_config(options) == {
        "engine": "sglang",
        "inflight_deadline": 120.0,
        "transfer_deadline": 30.0,
        "fault": "none",
        "hardening": "on",
        "race_window": 5.0,
    }


def test_inflight_deadline_off_is_passed_as_off_not_dropped() -> None:
    from pdwarden_runtime.hardening.config import HardeningConfig

    config = hardening_config(SimpleNamespace(inflight_deadline=None))
    assert config == {"engine": "sglang", "inflight_deadline": None}
    assert HardeningConfig.from_mapping(config).inflight_deadline is None


def test_hardening_config_is_accepted_by_the_hardening() -> None:
    from pdwarden_runtime.hardening.config import HardeningConfig

    options = SimpleNamespace(
        inflight_deadline=60.0, transfer_deadline=7.0, fault="drop-abort", hardening="off", race_window=2.0
    )
    config = HardeningConfig.from_mapping(hardening_config(options))
    assert config.inflight_deadline == 60.0 and config.transfer_deadline == 7.0
    assert config.fault.active == "drop-abort"
    assert config.active_fixes()["sticky_status"] is False


def test_runtime_fault_switching_is_refused_for_sglang() -> None:
    with pytest.raises(SglangArgumentError, match="--allow-fault-injection is not supported"):
        check_options(SimpleNamespace(allow_fault_injection=True))
    check_options(SimpleNamespace(allow_fault_injection=False))


def test_bench_hardening_modes_are_refused_for_sglang() -> None:
    with pytest.raises(SglangArgumentError, match="bench-stock-prompt-wake is a benchmark mode"):
        check_options(SimpleNamespace(allow_fault_injection=False, hardening="bench-stock-prompt-wake"))
    for mode in ("on", "off", "emulated-port"):
        check_options(SimpleNamespace(allow_fault_injection=False, hardening=mode))


def test_seam_env_puts_the_hook_first_and_keeps_user_paths() -> None:
    base = {"PYTHONPATH": f"/user/lib{os.pathsep}{SITE_DIR}", "HOME": "/root"}
    env = seam_env(base, {"engine": "sglang"}, prom_dir="/tmp/prom")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SITE_DIR), "/user/lib"]
    assert env[ENV_HARDENING] == "1"
    assert env[ENV_HARDENING_CONFIG] == '{"engine": "sglang"}'
    assert env["PROMETHEUS_MULTIPROC_DIR"] == "/tmp/prom"
    assert env["HOME"] == "/root"
    assert base["PYTHONPATH"].startswith("/user/lib")  # input not modified
    assert (SITE_DIR / "sitecustomize.py").is_file()
    assert sorted(p.name for p in SITE_DIR.iterdir() if p.suffix == ".py") == ["sitecustomize.py"]


def test_launch_env_preview_matches_options() -> None:
    options = SimpleNamespace(
        role="decode",
        host="h",
        port=1,
        bootstrap_port=2,
        metrics_port=3,
        inflight_deadline=None,
        transfer_deadline=5.0,
        fault=None,
    )
    env = launch_env_preview(options, {})
    assert json.loads(env[ENV_HARDENING_CONFIG]) == {
        "engine": "sglang",
        "inflight_deadline": None,
        "transfer_deadline": 5.0,
    }
    assert env["PDWARDEN_HARDENING_ON_ERROR"] == "exit"
    assert sys.executable  # the launcher runs SGLang with this very interpreter
