"""The command the operator renders for a runtime pod is the command the runtime parses: every
rendered command of every example spec goes through the runtime's own `serve` parser, and the
values it reads are the spec's."""

from __future__ import annotations

import re
from typing import Any

import click
import pytest

import pdwarden_contract as contract
from pdwarden_operator.models import parse_spec
from pdwarden_operator.render.meta import Owner
from pdwarden_operator.render.runtime import runtime_command
from pdwarden_operator.worker_key_secret import KeyUse
from pdwarden_runtime.cli import serve

from .test_operator_render import CASES, KEY_SECRET, UID

pytestmark = pytest.mark.unit

POD_IP = "198.18.128.7"


def _commands(name: str) -> list[tuple[str, int | None, list[str]]]:
    spec_body, annotations = CASES[name]
    spec = parse_spec(spec_body)
    owner = Owner(
        name="m1", namespace="ns1", uid=UID, annotations=annotations, worker_key=KeyUse.final(KEY_SECRET)
    )
    out: list[tuple[str, int | None, list[str]]] = []
    for role in contract.RUNTIME_ROLES:
        nodes = spec.role(role).nodes_per_replica
        groups: list[int | None] = list(range(nodes)) if nodes > 1 else [None]
        out += [(role, g, runtime_command(owner, spec, role, g)) for g in groups]
    return out


def _parse(cmd: list[str], rank: int = 0) -> dict[str, Any]:
    assert cmd[:3] == ["pdwarden", "runtime", "serve"]
    # the kubelet expands $(VAR) from the pod's env before the runtime sees it
    env = {contract.ENV_POD_IP: POD_IP, contract.ENV_NODE_RANK: str(rank)}
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in cmd[3:]]
    with serve.make_context("serve", args) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_rendered_runtime_command_parses_to_the_specs_values(name: str) -> None:
    spec = parse_spec(CASES[name][0])
    for role, group, cmd in _commands(name):
        params = _parse(cmd, rank=group or 0)
        where = f"{name} {role} group {group}: {cmd}"
        assert params["role"] == role and params["engine"] == spec.engine, where
        assert params["host"] == POD_IP, where
        assert params["port"] == spec.transfer.port(contract.DEFAULT_HTTP_PORT), where
        assert params["bootstrap_port"] == spec.transfer.port(contract.DEFAULT_BOOTSTRAP_PORT), where
        assert params["metrics_port"] == spec.transfer.port(contract.DEFAULT_METRICS_PORT), where
        assert float(params["transfer_deadline"]) == spec.transfer.transfer_deadline_seconds, where
        assert float(params["inflight_deadline"]) == spec.transfer.inflight_deadline_seconds, where
        if spec.engine == "sglang":
            # SGLang's own flags pass through untouched, after the runtime's
            tail = cmd[cmd.index("--") + 1 :]
            assert list(params["sglang_args"]) == tail, where
            assert "--model-path" in tail and "--served-model-name" in tail, where
        else:
            assert params["model"] == (spec.model.served_name or "m1"), where


def test_a_flag_the_runtime_does_not_know_is_refused() -> None:
    """Guards the test above: the parser refuses what it does not define."""
    _, _, cmd = _commands("synthetic-basic")[0]
    with pytest.raises(click.UsageError):
        _parse([*cmd, "--no-such-flag", "1"])


def test_every_flag_of_the_contract_is_an_option_of_the_runtime() -> None:
    """The operator renders and the runtime declares the flags of contract.ServeFlag: each one
    names an option of `serve`, whose parameter is the flag's name."""
    options = {opt: param.name for param in serve.params for opt in getattr(param, "opts", ())}
    for flag in contract.ServeFlag:
        assert flag.value in options, flag
        assert options[flag.value] == flag.name.lower(), flag
