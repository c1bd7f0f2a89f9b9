"""docs/controlplane.md's laptop flow, end to end: ``meshctl controlplane ca`` with no
``--serving-names`` and ``meshctl ztunnel run --ca-address 127.0.0.1:15012`` beside it (one
network namespace standing in for the laptop): the proxy verifies the CA, gets its certificate
and becomes ready (issue 24: it failed hostname verification forever)."""

from __future__ import annotations

import sys
import time

import pytest

from tests.harness.netns import node_with_pods
from tests.netns.ztunnel_harness import Sidecar
from tests.netns.ztunnel_topology import local_config

pytestmark = pytest.mark.netns


def test_a_proxy_dials_the_standalone_ca_on_loopback_and_is_ready(tmp_path):
    tokens = tmp_path / "tokens.csv"
    tokens.write_text("tok-client,system:serviceaccount:default:client,u1\n")
    token = tmp_path / "token"
    token.write_text("tok-client")
    with node_with_pods(1) as node:
        (pod,) = node.pods
        ca_log = (tmp_path / "ca.log").open("wb")
        ca = pod.ns.popen(
            [sys.executable, "-m", "meshctl", "controlplane", "ca", "--ca-dir",
             str(tmp_path / "ca"), "--tokens", str(tokens)],  # the default :15012
            stdout=ca_log, stderr=ca_log,
        )  # fmt: skip
        try:
            end = time.monotonic() + 30
            while True:
                assert ca.poll() is None, (tmp_path / "ca.log").read_text()
                with pod.ns.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", 15012)) == 0:
                        break
                assert time.monotonic() < end, "the CA did not listen"
                time.sleep(0.1)
            config = local_config(tmp_path / "local.yaml", pod.ip, "10.99.0.2", "10.99.0.3")
            car = Sidecar(
                pod.ns, "default/client/client", tmp_path / "no-certs", config,
                extra=("--ca-address", "127.0.0.1:15012", "--ca-root",
                       str(tmp_path / "ca" / "ca-cert.pem"), "--token-file", str(token)),
            )  # fmt: skip
            (tmp_path / "no-certs").mkdir()
            car.start()  # ready: it holds a certificate from the CA
            try:
                source = car.config_dump()["certificates"][0]["source"]
                assert source["kind"] == "ca"
                assert source["caAddress"] == "127.0.0.1:15012"
                assert "Hostname Verification" not in car.log_text(None)
            finally:
                car.stop()
        finally:
            ca.terminate()
            ca.wait(15)
            ca_log.close()
