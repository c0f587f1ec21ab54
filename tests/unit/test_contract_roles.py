"""The roles: one `Role` enum in the contract, the tuples and names derived from it carrying the
same strings that labels, flags and status carry."""

from __future__ import annotations

import json

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_contract import Role

pytestmark = pytest.mark.unit


def test_the_roles_are_the_enums_values_and_the_runtime_ones_leave_the_router_out() -> None:
    assert [role.value for role in Role] == ["prefill", "decode", "router"]
    assert contract.ROLES == ("prefill", "decode", "router")
    assert contract.RUNTIME_ROLES == ("prefill", "decode")
    assert [role.runtime for role in Role] == [True, True, False]
    names = (contract.ROLE_PREFILL, contract.ROLE_DECODE, contract.ROLE_ROUTER)
    assert names == (Role.PREFILL, Role.DECODE, Role.ROUTER)


def test_a_role_is_its_string_wherever_it_goes() -> None:
    assert Role("decode") is Role.DECODE and f"{Role.DECODE}" == "decode"
    assert json.dumps({Role.PREFILL: Role.ROUTER}) == '{"prefill": "router"}'
    keyed: dict[str, int] = {Role.PREFILL: 1}
    assert keyed["prefill"] == 1  # a label read back finds what a member keyed
    # what is rendered or cached holds plain strings: YAML (golden files) and marshal take no member
    for role in (*contract.ROLES, *contract.RUNTIME_ROLES, contract.ROLE_PREFILL):
        assert type(role) is str
    assert yaml.safe_dump({"role": contract.ROLE_DECODE}) == "role: decode\n"
