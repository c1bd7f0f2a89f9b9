"""``meshctl iptables validate``: passes only when a probe really is redirected (else exit 126)."""

from __future__ import annotations

import pytest

from tests.netns.capture_support import Meshctl, listen, serving

pytestmark = pytest.mark.netns


@pytest.fixture
def meshctl(capsys, monkeypatch, tmp_path):
    return Meshctl(capsys, monkeypatch, tmp_path)


@pytest.mark.parametrize("mode", ["REDIRECT", "TPROXY"])
def test_validation_passes_once_capture_is_applied(netns, meshctl, mode):
    meshctl.ok("iptables", "apply", "--netns", netns.name, "-m", mode)
    _, err = meshctl.ok("iptables", "validate", "--netns", netns.name, "-m", mode)
    assert "validation passed: 127.0.0.6:15002 was redirected to port 15006" in err


def test_validation_fails_with_exit_126_without_capture(netns, meshctl):
    code, _, err = meshctl("iptables", "validate", "--netns", netns.name, "--probe-timeout", "2")
    assert code == 126
    assert "Error: validation failed: connecting to 127.0.0.6:15002 failed" in err
    assert "Hint: traffic capture is not set up" in err


def test_validation_fails_when_the_capture_port_is_taken(netns, meshctl):
    meshctl.ok("iptables", "apply", "--netns", netns.name)
    with serving(listen(netns, "127.0.0.1", 15006, "squatter")):
        code, _, err = meshctl("iptables", "validate", "--netns", netns.name)
    assert code == 126
    assert "cannot listen on 127.0.0.1:15006" in err


def test_validation_uses_the_configured_probe_port_and_proxy_uid(netns, meshctl):
    meshctl.ok("iptables", "apply", "--netns", netns.name, "-u", "2000")
    _, err = meshctl.ok(
        "iptables",
        "validate",
        "--netns",
        netns.name,
        "-u",
        "2000",
        "--iptables-probe-port",
        "15999",
    )
    assert "127.0.0.6:15999 was redirected" in err
    # the probe only hairpins when it is the proxy's traffic: as another uid it is not captured
    code, _, _ = meshctl("iptables", "validate", "--netns", netns.name, "-u", "3000")
    assert code == 126
