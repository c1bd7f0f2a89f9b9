"""The cheap nf_tables table probe agrees with the kernel and keeps pyroute2 off the fast path."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

pytestmark = pytest.mark.netns

PROBE = (
    "import json, sys\n"
    "from meshctl.core.capture.rules import Family\n"
    "from meshctl.net.iptables import nft_presence\n"
    "from meshctl.net.nftables_probe import table_families\n"
    "p = nft_presence((Family.IPV4, Family.IPV6))\n"
    "print(json.dumps({'families': sorted(table_families()), 'rules': p.rules,\n"
    "                  'pyroute2': 'pyroute2' in sys.modules}))\n"
)


def probe(netns) -> dict[str, object]:
    return json.loads(netns.run([sys.executable, "-c", PROBE]).stdout)


def test_fresh_namespace_has_no_tables_and_pyroute2_is_not_imported(netns):
    assert probe(netns) == {"families": [], "rules": False, "pyroute2": False}


def test_tables_of_each_family_are_seen_and_read_in_full(netns):
    netns.run(["iptables-nft", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-j", "RETURN"])
    seen = probe(netns)
    assert seen == {"families": [2], "rules": True, "pyroute2": True}
    netns.run(["ip6tables-nft", "-A", "INPUT", "-j", "ACCEPT"])
    assert probe(netns)["families"] == [2, 10]


def test_tables_of_other_families_do_not_count(netns):
    if shutil.which("nft") is None:
        pytest.skip("the nft command is not installed (apt-get install nftables)")
    netns.run(["nft", "add", "table", "inet", "other"])
    seen = probe(netns)
    assert seen["families"] == [1]  # NFPROTO_INET
    assert seen["rules"] is False
    assert seen["pyroute2"] is False
