"""A group's options and the SGLang flags they become (pure)."""

from __future__ import annotations

import pytest

from pdwarden_runtime.engines.sglang_engine import SglangArgumentError, plan_launch
from pdwarden_runtime.group import GroupOptions

pytestmark = pytest.mark.unit

USER = ["--model-path", "/models/m", "--tp", "16"]


def test_a_group_adds_sglangs_multi_node_flags() -> None:
    group = GroupOptions(2, 1, "m-decode-0-0.m-decode-ranks:5757")
    args = plan_launch("decode", "198.18.0.5", 30000, 8998, USER, group=group).sglang_args
    for flag, value in (("--nnodes", "2"), ("--node-rank", "1"), ("--dist-init-addr", group.dist_init_addr)):
        assert args[args.index(flag) + 1] == value


def test_a_single_pod_replica_adds_none_and_leaves_the_users_alone() -> None:
    assert "--nnodes" not in plan_launch("prefill", "198.18.0.5", 30000, 8998, USER).sglang_args
    mine = [*USER, "--nnodes", "2"]
    assert plan_launch("prefill", "198.18.0.5", 30000, 8998, mine).user == tuple(mine)


def test_a_users_flag_that_contradicts_the_group_is_refused() -> None:
    group = GroupOptions(4, 0, "leader:5757")
    with pytest.raises(SglangArgumentError, match="--nnodes 2"):
        plan_launch("prefill", "198.18.0.5", 30000, 8998, [*USER, "--nnodes", "2"], group=group)


@pytest.mark.parametrize(
    ("nnodes", "rank", "addr", "message"),
    [
        (1, 0, "h:1", "at least 2"),
        (2, 2, "h:1", "node-rank must be in 0..1"),
        (2, 0, "h", "HOST:PORT"),
        (2, 0, "h:0", "HOST:PORT"),
        (2, 0, ":5757", "HOST:PORT"),
    ],
)
def test_bad_group_options_are_clear_errors(nnodes: int, rank: int, addr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GroupOptions(nnodes, rank, addr)


def test_the_leader_is_rank_zero() -> None:
    assert GroupOptions(2, 0, "h:1").leader and not GroupOptions(2, 1, "h:1").leader
    assert GroupOptions(2, 0, "[::1]:5757").address() == ("::1", 5757)
