"""``meshctl ztunnel run``'s part of docs/cli.md's exit codes, in a namespace (it binds Istio's
fixed ports): a port in use is 1 in the words every daemon uses, Ctrl-C is 130 once drained,
SIGTERM 0 (the kubelet's way). tests/cli/test_exit_codes.py walks the other commands."""

from __future__ import annotations

import signal

import pytest

from meshctl.core.pki.identity import SpiffeId
from tests.harness.netns import node_with_pods
from tests.netns.ztunnel_harness import TD, Ca, Sidecar
from tests.netns.ztunnel_topology import local_config

pytestmark = pytest.mark.netns


def _sidecar(tmp_path, pod) -> Sidecar:
    cert = Ca.create(tmp_path / "certs").issue("a", SpiffeId(TD, "default", "client"))
    config = local_config(tmp_path / "local.yaml", pod.ip, "10.99.0.2", "10.99.0.3")
    return Sidecar(pod.ns, "default/client/client", cert, config, log_path=tmp_path / "a.log")


def test_a_port_in_use_is_exit_1_in_the_words_every_daemon_uses(tmp_path):
    with node_with_pods(1) as node:
        (pod,) = node.pods
        with pod.ns.socket() as holder:
            holder.bind(("0.0.0.0", 15006))  # noqa: S104 -- where the proxy wants to listen
            holder.listen()
            car = _sidecar(tmp_path, pod).start(wait_ready=False)
            assert car.proc is not None
            code = car.proc.wait(60)
            car.stop()
    assert code == 1, car.log_text()
    errors = [line for line in car.log_text().splitlines() if line.startswith("Error: ")]
    assert errors == [
        "Error: cannot listen on 0.0.0.0:15006 (inbound_plaintext): the port is already in use"
    ]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_ctrl_c_is_130_and_sigterm_0_once_drained(tmp_path, sig, code):
    with node_with_pods(1) as node:
        (pod,) = node.pods
        car = _sidecar(tmp_path, pod).start()
        assert car.proc is not None
        car.proc.send_signal(sig)
        assert car.proc.wait(30) == code, car.log_text()
        car.stop()
