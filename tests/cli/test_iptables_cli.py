"""``meshctl iptables`` as a user runs it (no kernel needed): help, settings sources, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from meshctl.cli import main
from tests.harness.cli import isolate_capture_settings

SUBCOMMANDS = ("render", "apply", "check", "clean", "trace", "validate")


@pytest.fixture
def run(capsys, monkeypatch, tmp_path):
    isolate_capture_settings(monkeypatch, tmp_path)

    def invoke(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def test_group_help_lists_every_subcommand_in_a_fresh_interpreter():
    # click's rule for lazily loaded commands: only a real --help run catches import errors.
    result = subprocess.run(
        [sys.executable, "-c", "from meshctl.entry import run; run()", "iptables", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HOME": "/nonexistent"},
    )
    assert result.returncode == 0, result.stderr
    for name in SUBCOMMANDS:
        assert f"  {name} " in result.stdout


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help(run, name):
    code, out, _ = run("iptables", name, "--help")
    assert code == 0
    assert "Usage: meshctl iptables" in out


def test_istio_short_flags_are_accepted(run):
    args = ["-p", "15101", "-z", "15106", "-e", "15108", "-u", "7", "-g", "8", "-m", "REDIRECT"]
    args += ["-b", "80", "-d", "22", "-i", "10.0.0.0/8", "-x", "10.1.0.0/16", "-q", "3306"]
    args += ["-o", "25", "-c", "eth9", "-k", "k6t-eth0"]
    code, out, err = run("iptables", "render", *args)
    assert code == 0, err
    for needle in ("--to-ports 15101", "--to-ports 15106", "--dport 15108", "--uid-owner 7"):
        assert needle in out
    for needle in ("--gid-owner 8", "--dport 80", "-d 10.1.0.0/16", "-o eth9", "-i k6t-eth0"):
        assert needle in out


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["-p", "0"], {}, "flag -p/--envoy-port: invalid value '0'"),
        ([], {"ENVOY_PORT": "x"}, "env ENVOY_PORT: invalid value 'x'"),
        (["-u", "root"], {}, "flag -u/--proxy-uid: invalid value 'root'"),
        (["-i", "300.0.0.0/8"], {}, "flag -i/--istio-service-cidr: invalid value '300.0.0.0/8'"),
        ([], {"ISTIO_INBOUND_INTERCEPTION_MODE": "BPF"}, "env ISTIO_INBOUND_INTERCEPTION_MODE"),
        (["--mode", "node"], {}, "flag --mode: invalid value 'node'"),
    ],
)
def test_bad_input_exits_2_naming_the_source_and_value(run, monkeypatch, args, env, needle):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, out, err = run("iptables", "render", *args)
    assert code == 2
    assert out == ""
    assert f"Error: {needle}" in err
    assert "\nHint: " in err


def test_apply_with_an_unknown_namespace_is_a_usage_error(run):
    code, _, err = run("iptables", "apply", "--netns", "mt-does-not-exist-0")
    assert code == 2
    assert "network namespace 'mt-does-not-exist-0' not found" in err


def test_bad_settings_are_reported_before_the_namespace_is_looked_at(run):
    code, _, err = run("iptables", "apply", "-p", "70000", "--netns", "mt-does-not-exist-0")
    assert code == 2
    assert "-p/--envoy-port" in err


def test_the_iptables_section_of_the_settings_file_is_used_and_flags_win(run, tmp_path):
    conf = tmp_path / "meshctl.yaml"
    conf.write_text("iptables:\n  proxy-port: 16001\n  inbound-ports: '8080'\n")
    code, out, _ = run("--config", str(conf), "iptables", "render")
    assert code == 0
    assert "--to-ports 16001" in out
    assert "--dport 8080" in out
    code, out, _ = run("--config", str(conf), "iptables", "render", "-p", "17001")
    assert "--to-ports 17001" in out


def test_a_bad_file_value_names_the_file_key(run, tmp_path):
    conf = tmp_path / "meshctl.yaml"
    conf.write_text("iptables:\n  proxy-uid: nobody\n")
    code, _, err = run("--config", str(conf), "iptables", "render")
    assert code == 2
    assert "key 'proxy-uid': invalid value 'nobody'" in err


def test_render_prints_ipv6_only_with_dual_stack(run):
    code, out, _ = run("iptables", "render", "--dual-stack")
    assert code == 0
    assert "# IPv4: iptables-restore" in out
    assert "# IPv6: ip6tables-restore" in out
    code, _, err = run("iptables", "render", "--family", "ipv6")
    assert code == 2
    assert "--dual-stack" in err


def test_render_of_tproxy_lists_the_policy_routing(run):
    code, out, _ = run("iptables", "render", "-m", "TPROXY")
    assert code == 0
    assert "#   ip rule add fwmark 0x539 lookup 133" in out
    assert "#   ip route add local default dev lo table 133" in out


def test_trace_as_json_is_data(run):
    code, out, _ = run("iptables", "trace", "--dst", "10.96.0.10:80", "--output", "json")
    assert code == 0
    data = json.loads(out)
    assert (data["verdict"], data["port"]) == ("redirected", 15001)
    assert data["steps"][0]["rule"] == "-j MESH_OUTPUT"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--dst", "10.0.0.1"], "'--dst': '10.0.0.1' is not IP:PORT"),
        (["--dst", "nope:80"], "'--dst': 'nope:80': 'nope' is not an IP address"),
        (["--dst", "10.0.0.1:70000"], "port 70000 is out of range (1-65535)"),
        (
            ["--dst", "10.0.0.1:80", "--direction", "sideways"],
            "Invalid value for '--direction': 'sideways' is not one of out, in",
        ),
        (["--dst", "10.0.0.1:80", "--src", "fd00::1"], "not the same IP version"),
        (["--dst", "[fd00::1]:80"], "IPv6 rules are off"),
        (["--dst", "10.0.0.1:80", "--mark", "lots"], "--mark: invalid value 'lots'"),
    ],
)
def test_trace_bad_input_exits_2(run, args, needle):
    code, _, err = run("iptables", "trace", *args)
    assert code == 2
    assert needle in err


def test_validate_refuses_ambient_mode(run):
    code, _, err = run("iptables", "validate", "--mode", "ambient")
    assert code == 2
    assert "validate checks sidecar capture" in err
