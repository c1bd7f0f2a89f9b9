"""Capture settings: Istio's flags and env vars, flag > env > file, errors naming the source."""

from __future__ import annotations

import ipaddress

import pytest

from meshctl.config import resolve
from meshctl.core.capture.settings import ALL, CaptureSettings, nameservers, source_name
from meshctl.errors import EXIT_USAGE, ConfigError


def settings(flags=None, env=None, file=None) -> CaptureSettings:
    return resolve(CaptureSettings, flags=flags or {}, env=env or {}, file=file or {})


def test_defaults_are_what_istios_injector_passes():
    s = settings()
    assert (s.proxy_port, s.inbound_capture_port, s.inbound_tunnel_port) == (15001, 15006, 15008)
    assert s.proxy_uid == (1337,)
    assert s.gids == (1337,)  # gid defaults to the uid list
    assert s.interception_mode == "REDIRECT"
    assert s.inbound_ports == ALL
    assert s.inbound_ports_exclude == (15090, 15021, 15020)
    assert s.outbound_cidrs == ALL
    assert (s.redirect_dns, s.dual_stack, s.drop_invalid) == (False, False, False)


def test_istio_env_vars_are_read():
    s = settings(
        env={
            "ENVOY_PORT": "16001",
            "INBOUND_CAPTURE_PORT": "16006",
            "PROXY_UID": "1000,1001",
            "PROXY_GID": "2000",
            "ISTIO_INBOUND_INTERCEPTION_MODE": "tproxy",
            "ISTIO_INBOUND_PORTS": "80, 443",
            "ISTIO_SERVICE_CIDR": "10.0.0.0/8,fd00::/8",
            "ISTIO_SERVICE_EXCLUDE_CIDR": "10.96.0.1",
            "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE": "22",
            "KUBE_VIRT_INTERFACES": "k6t-eth0",
            "ISTIO_META_DNS_CAPTURE": "true",
            "INVALID_DROP": "1",
            "ISTIO_DUAL_STACK": "yes",
        }
    )
    assert (s.proxy_port, s.inbound_capture_port) == (16001, 16006)
    assert (s.proxy_uid, s.gids) == ((1000, 1001), (2000,))
    assert s.interception_mode == "TPROXY"
    assert s.inbound_ports == (80, 443)
    assert s.outbound_cidrs == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("fd00::/8"),
    )
    assert s.outbound_cidrs_exclude == (ipaddress.ip_network("10.96.0.1/32"),)
    assert s.outbound_ports_exclude == (22,)
    assert s.kube_virt_interfaces == ("k6t-eth0",)
    assert (s.redirect_dns, s.drop_invalid, s.dual_stack) == (True, True, True)


def test_flag_beats_env_beats_settings_file():
    env = {"ENVOY_PORT": "2"}
    file = {"proxy-port": 3}
    assert settings({"proxy_port": "1"}, env, file).proxy_port == 1
    assert settings({}, env, file).proxy_port == 2
    assert settings({}, {}, file).proxy_port == 3


def test_the_first_env_alias_that_is_set_wins():
    assert (
        settings(env={"REDIRECT_DNS": "false", "ISTIO_META_DNS_CAPTURE": "true"}).redirect_dns
        is False
    )
    assert settings(env={"ISTIO_META_DNS_CAPTURE": "true"}).redirect_dns is True


def test_empty_flag_values_mean_none_as_in_istio():
    s = settings({"inbound_ports": "", "outbound_cidrs": "", "inbound_ports_exclude": ""})
    assert (s.inbound_ports, s.outbound_cidrs, s.inbound_ports_exclude) == ((), (), ())


def test_cidrs_are_normalised_like_iptables_does():
    s = settings({"outbound_cidrs_exclude": "10.1.2.3/8,10.0.0.0/8,fd00::1"})
    assert [str(n) for n in s.outbound_cidrs_exclude] == ["10.0.0.0/8", "fd00::1/128"]


@pytest.mark.parametrize(
    ("flags", "env", "needle"),
    [
        ({"proxy_port": "99999"}, {}, "flag -p/--envoy-port: invalid value '99999'"),
        ({}, {"ENVOY_PORT": "http"}, "env ENVOY_PORT: invalid value 'http'"),
        ({"inbound_capture_port": "0"}, {}, "flag -z/--inbound-capture-port: invalid value '0'"),
        ({"proxy_uid": "istio"}, {}, "flag -u/--proxy-uid: invalid value 'istio'"),
        ({}, {"PROXY_GID": "-1"}, "env PROXY_GID: invalid value '-1'"),
        (
            {"interception_mode": "NAT"},
            {},
            "-m/--istio-inbound-interception-mode: invalid value 'NAT'",
        ),
        ({"mode": "daemonset"}, {}, "flag --mode: invalid value 'daemonset'"),
        (
            {"outbound_cidrs": "10.0.0.0/33"},
            {},
            "flag -i/--istio-service-cidr: invalid value '10.0.0.0/33'",
        ),
        (
            {},
            {"ISTIO_SERVICE_EXCLUDE_CIDR": "*"},
            "env ISTIO_SERVICE_EXCLUDE_CIDR: invalid value '*'",
        ),
        ({"inbound_ports": "*,80"}, {}, "flag -b/--istio-inbound-ports"),
        (
            {"exclude_interfaces": "eth0;rm"},
            {},
            "flag -c/--istio-exclude-interfaces: invalid value",
        ),
        ({"kube_virt_interfaces": "averyveryverylongname"}, {}, "-k/--kube-virt-interfaces"),
        ({"tproxy_route_table": "254"}, {}, "reserved by the kernel"),
        ({"tproxy_mark": "0"}, {}, "flag -t/--istio-inbound-tproxy-mark: invalid value '0'"),
        ({}, {"REDIRECT_DNS": "perhaps"}, "env REDIRECT_DNS: invalid value 'perhaps'"),
        ({"dns_servers": "dns.google"}, {}, "flag --dns-servers: invalid value 'dns.google'"),
    ],
)
def test_bad_values_name_the_flag_or_env_var_and_the_value(flags, env, needle):
    with pytest.raises(ConfigError) as info:
        settings(flags, env)
    assert needle in info.value.message
    assert info.value.exit_code == EXIT_USAGE
    assert info.value.hint


def test_port_collisions_name_both_flags():
    with pytest.raises(ConfigError) as info:
        settings({"proxy_port": "15006"})
    assert "-z/--inbound-capture-port / INBOUND_CAPTURE_PORT" in info.value.message
    assert "-p/--envoy-port / ENVOY_PORT" in info.value.message


def test_tproxy_with_ambient_mode_is_refused():
    with pytest.raises(ConfigError, match="TPROXY applies to --mode sidecar only"):
        settings({"mode": "ambient", "interception_mode": "TPROXY"})


def test_owner_group_include_and_exclude_are_exclusive():
    with pytest.raises(ConfigError, match="both set"):
        settings({"outbound_owner_groups": "a", "outbound_owner_groups_exclude": "b"})


def test_dns_capture_needs_capture_all_or_a_resolver():
    assert not settings({"redirect_dns": True}).dns_enabled
    assert settings({"redirect_dns": True, "capture_all_dns": True}).dns_enabled
    assert settings({"redirect_dns": True, "dns_servers": "10.96.0.10"}).dns_enabled


def test_source_name_lists_flag_and_every_env_alias():
    assert source_name("redirect_dns") == "--redirect-dns / REDIRECT_DNS / ISTIO_META_DNS_CAPTURE"


def test_nameservers_come_from_resolv_conf_in_order_skipping_junk():
    text = "# comment\nnameserver 10.96.0.10\nsearch x\nnameserver fe80::1%eth0\nnameserver bad\n"
    assert [str(a) for a in nameservers(text)] == ["10.96.0.10", "fe80::1"]
