"""The reserved-ports list the local cluster keeps its listening ports in: its text parsed and
written back, and reserve/release on a file standing in for the sysctl."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pdwarden_localcluster import reserved_ports
from pdwarden_localcluster.cluster import Ports

pytestmark = pytest.mark.unit


def test_the_kernels_text_is_parsed_with_ranges_and_spaces() -> None:
    assert reserved_ports.parse("36249, 36256-36259,36600\n") == {36249, 36256, 36257, 36258, 36259, 36600}
    assert reserved_ports.parse("\n") == set()


@pytest.mark.parametrize("bad", ["0", "70000", "5-3", "x", "1-2-3"])
def test_text_that_is_no_port_list_is_an_error(bad: str) -> None:
    with pytest.raises(ValueError):
        reserved_ports.parse(bad)


def test_consecutive_ports_are_written_as_ranges() -> None:
    assert reserved_ports.render([36600, 36249, 36601, 36602, 36379]) == "36249,36379,36600-36602"
    assert reserved_ports.render([]) == ""


@given(st.sets(st.integers(min_value=1, max_value=65535), max_size=200))
def test_render_then_parse_gives_the_same_ports(ports: set[int]) -> None:
    assert reserved_ports.parse(reserved_ports.render(ports)) == ports


def test_release_keeps_what_others_reserved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reserved_ports, "LOCK", tmp_path / "lock")
    sysctl = tmp_path / "ip_local_reserved_ports"
    sysctl.write_text("5000-5002\n")
    ours = Ports(36000).listening(2)
    reserved_ports.reserve(ours, sysctl)
    assert reserved_ports.reserved(sysctl) == {5000, 5001, 5002, *ours}
    reserved_ports.release(ours, sysctl)
    assert sysctl.read_text() == "5000-5002\n"
    reserved_ports.release([5000, 5001, 5002], sysctl)
    assert sysctl.read_text() == "\n"  # a write of no bytes would leave the kernel's list as it was


def test_the_listening_ports_are_the_control_planes_and_one_endpoint_per_node() -> None:
    p = Ports(36000)
    assert set(p.listening(3)) == {*p.all().values(), 36600, 36601, 36602}


def test_the_kernels_ephemeral_range_is_read_from_its_sysctl(tmp_path: Path) -> None:
    sysctl = tmp_path / "ip_local_port_range"
    sysctl.write_text("32768\t60999\n")
    assert reserved_ports.ephemeral_range(sysctl) == (32768, 60999)


def test_the_default_clusters_ports_lie_below_the_ephemeral_range_and_apart_from_the_test_kits() -> None:
    from pdwarden_localcluster import network
    from pdwarden_localcluster.cluster import DEFAULT_PORT_BASE
    from pdwarden_testkit import ports as testkit_ports

    # the largest cluster: no outgoing connection can hold one of its ports before `up`
    ours = set(Ports(DEFAULT_PORT_BASE).listening(network.MAX_NODES))
    assert max(ours) < 32768  # Linux's default ephemeral range starts there
    free_lo, free_hi = testkit_ports.PORT_RANGE
    assert not any(free_lo <= port <= free_hi for port in ours)
    # every second cluster the test kit may start: its ports apart from ours and from the free
    # ports the test kit hands out beside it, in slots of their own
    offsets = Ports(0).listening(network.MAX_NODES)
    bases = testkit_ports.port_bases(offsets)
    assert len({network.plan(b).slot for b in bases} - {network.plan(DEFAULT_PORT_BASE).slot}) >= 8
    for base in bases:
        theirs = {base + off for off in offsets}
        assert not theirs & ours, base
        assert not any(free_lo <= port <= free_hi for port in theirs), base
        assert max(theirs) < 32768, base
