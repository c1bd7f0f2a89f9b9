"""The remembered IP parser answers exactly as ``ipaddress.ip_address`` does."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.mesh.addresses import ip
from meshctl.core.wire.hbone.headers import parse_authority


@given(st.ip_addresses())
def test_same_answer_as_the_stdlib_for_every_address_and_its_text(addr):
    assert ip(str(addr)) == ipaddress.ip_address(str(addr))
    assert ip(addr) == addr


@pytest.mark.parametrize("bad", ["", "1.2.3", "1.2.3.256", "::g", "10.0.0.1 "])
def test_bad_literals_fail_every_time_not_only_the_first(bad):
    for _ in range(2):  # a failure must not be remembered as an answer
        with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
            ip(bad)


def test_a_bad_authority_fails_every_time():
    for _ in range(2):
        with pytest.raises(ValueError, match="bad port"):
            parse_authority("10.0.0.1:99999")
