"""The test port range's shares: parallel workers never hand out the same port."""

from __future__ import annotations

import pytest

from pdwarden_testkit import ports

pytestmark = pytest.mark.unit


@pytest.mark.unit
def test_shares_split_the_range_without_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    def share(index: int) -> tuple[int, int]:
        monkeypatch.setenv(ports.ENV_PORT_RANGE, ports.share_of_port_range(index, 2))
        return ports.port_range()

    (lo0, hi0), (lo1, hi1) = share(0), share(1)
    assert lo0 == ports.PORT_RANGE[0] and hi0 < lo1 and hi1 <= ports.PORT_RANGE[1]


@pytest.mark.integration  # binds sockets
def test_free_port_stays_in_this_process_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ports.ENV_PORT_RANGE, ports.share_of_port_range(1, 2))
    lo, hi = ports.port_range()
    assert all(lo <= ports.free_port() <= hi for _ in range(20))


@pytest.mark.unit
@pytest.mark.parametrize("given", ["31000", "abc-def", "30000-31100", "31500-31400"])
def test_a_bad_share_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    monkeypatch.setenv(ports.ENV_PORT_RANGE, given)
    with pytest.raises(ValueError, match=ports.ENV_PORT_RANGE):
        ports.port_range()


@pytest.mark.unit
def test_port_bases_keep_every_offset_inside_the_range() -> None:
    offsets = [249, 380, 614]
    bases = ports.port_bases(offsets, lo=1000, hi=2000)
    assert bases == [800, 900, 1000, 1100, 1200, 1300]  # 800 + 249 >= 1000; 1300 + 614 <= 2000
    assert ports.port_bases(offsets, lo=1000, hi=1300) == []  # the span does not fit
