"""Pod annotations -> ``meshctl iptables apply`` flags: validation, mapping, the CNI fixed point."""

from __future__ import annotations

import pytest

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.core.k8s.inject.interception import (
    Interception,
    capture_args,
    cni_annotations,
    interception_of,
)

DEFAULT_ARGS = [
    "-p", "15001", "-z", "15006", "-u", "1337", "-g", "1337", "-m", "REDIRECT",
    "-i", "*", "-b", "*", "-d", "15090,15021,15020",
]  # fmt: skip


def test_no_annotations_capture_everything_but_the_proxy_ports():
    assert capture_args({}) == DEFAULT_ARGS


@pytest.mark.parametrize(
    ("key", "value", "flag", "expected"),
    [
        (
            ann.INCLUDE_OUTBOUND_IP_RANGES,
            "10.0.0.0/8, 172.16.0.0/12",
            "-i",
            "10.0.0.0/8,172.16.0.0/12",
        ),
        (ann.INCLUDE_OUTBOUND_IP_RANGES, "", "-i", None),
        (ann.EXCLUDE_OUTBOUND_IP_RANGES, "169.254.169.254/32", "-x", "169.254.169.254/32"),
        (ann.EXCLUDE_OUTBOUND_IP_RANGES, "10.1.2.3/8,10.0.0.0/8", "-x", "10.0.0.0/8"),
        (ann.EXCLUDE_OUTBOUND_IP_RANGES, "fd00::1/8", "-x", "fd00::/8"),
        (ann.EXCLUDE_OUTBOUND_IP_RANGES, "10.0.0.1", "-x", "10.0.0.1/32"),
        (ann.INCLUDE_INBOUND_PORTS, "8080,8443", "-b", "8080,8443"),
        (ann.INCLUDE_INBOUND_PORTS, "", "-b", None),
        (ann.EXCLUDE_INBOUND_PORTS, "22, 9100", "-d", "15090,15021,15020,22,9100"),
        (ann.EXCLUDE_INBOUND_PORTS, "15021", "-d", "15090,15021,15020"),
        (ann.INCLUDE_OUTBOUND_PORTS, "5432", "-q", "5432"),
        (ann.EXCLUDE_OUTBOUND_PORTS, "25,587,25", "-o", "25,587"),
        (ann.EXCLUDE_INTERFACES, "eth1,eth2", "-c", "eth1,eth2"),
        (ann.KUBEVIRT_INTERFACES, "net1", "-k", "net1"),
        (ann.INTERCEPTION_MODE, "TPROXY", "-m", "TPROXY"),
    ],
)
def test_each_annotation_sets_its_flag(key, value, flag, expected):
    args = capture_args({key: value})
    values = dict(zip(args[::2], args[1::2], strict=True))
    assert values.get(flag) == expected


def test_reroute_virtual_interfaces_wins_over_kubevirt_interfaces():
    args = capture_args({ann.KUBEVIRT_INTERFACES: "old0", ann.REROUTE_VIRTUAL_INTERFACES: "new0"})
    assert args[args.index("-k") + 1] == "new0"


def test_mode_none_means_no_capture():
    assert capture_args({ann.INTERCEPTION_MODE: "NONE"}) == []


def test_proxy_uid_and_gid_are_passed():
    args = capture_args({}, proxy_uid=2000, proxy_gid=3000)
    assert args[args.index("-u") + 1] == "2000"
    assert args[args.index("-g") + 1] == "3000"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (ann.EXCLUDE_INBOUND_PORTS, "x"),
        (ann.EXCLUDE_INBOUND_PORTS, "0"),
        (ann.EXCLUDE_INBOUND_PORTS, "65536"),
        (ann.EXCLUDE_INBOUND_PORTS, "*"),  # the wildcard is for includeInboundPorts only
        (ann.INCLUDE_INBOUND_PORTS, "80-90"),
        (ann.INCLUDE_OUTBOUND_PORTS, "-1"),
        (ann.EXCLUDE_OUTBOUND_PORTS, "http"),
        (ann.INCLUDE_OUTBOUND_IP_RANGES, "10.0.0.300/8"),
        (ann.INCLUDE_OUTBOUND_IP_RANGES, "*,10.0.0.0/8"),
        (ann.INCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/33"),
        (ann.EXCLUDE_OUTBOUND_IP_RANGES, "*"),
        (ann.EXCLUDE_INTERFACES, "this-name-is-too-long"),
        (ann.KUBEVIRT_INTERFACES, "a/b"),
        (ann.INTERCEPTION_MODE, "redirect"),
        (ann.INTERCEPTION_MODE, "DNAT"),
    ],
)
def test_invalid_values_are_refused_with_the_annotation_named(key, value):
    with pytest.raises(InvalidAnnotationError) as caught:
        capture_args({key: value})
    assert caught.value.message == f"invalid value {value!r} for annotation {key!r}"
    assert caught.value.hint


def test_the_message_matches_the_documented_form():
    with pytest.raises(InvalidAnnotationError, match=r"^invalid value 'x' for annotation "
                       r"'traffic\.sidecar\.istio\.io/excludeInboundPorts'$"):  # fmt: skip
        capture_args({ann.EXCLUDE_INBOUND_PORTS: "x"})


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {ann.INCLUDE_INBOUND_PORTS: ""},
        {ann.INCLUDE_OUTBOUND_IP_RANGES: ""},
        {ann.EXCLUDE_INBOUND_PORTS: "9090", ann.EXCLUDE_OUTBOUND_IP_RANGES: "10.1.0.0/16"},
        {ann.REROUTE_VIRTUAL_INTERFACES: "net1", ann.KUBEVIRT_INTERFACES: "net2"},
        {ann.INTERCEPTION_MODE: "TPROXY", ann.EXCLUDE_INTERFACES: "eth1"},
        {ann.INTERCEPTION_MODE: "NONE"},
    ],
)
def test_cni_annotations_map_back_to_the_same_rules(annotations):
    first = interception_of(annotations)
    written = {**annotations, **cni_annotations(first)}
    assert interception_of(written) == first
    assert capture_args(written) == capture_args(annotations)


def test_cni_annotations_keep_an_empty_include_that_means_capture_none():
    written = cni_annotations(Interception(include_inbound_ports=""))
    assert written[ann.INCLUDE_INBOUND_PORTS] == ""
    assert ann.EXCLUDE_OUTBOUND_PORTS not in written
