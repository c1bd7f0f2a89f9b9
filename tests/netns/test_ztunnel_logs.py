"""``meshctl ztunnel run`` at its default level: one line once listening, one once ready."""

from __future__ import annotations

import pytest

from meshctl.core.pki.identity import SpiffeId
from tests.harness.netns import node_with_pods
from tests.harness.wait import eventually
from tests.netns.ztunnel_harness import TD, Ca, Sidecar
from tests.netns.ztunnel_topology import local_config

pytestmark = pytest.mark.netns


def test_run_says_where_it_listens_and_when_it_is_ready(tmp_path):
    with node_with_pods(1) as node:
        (pod,) = node.pods
        cert = Ca.create(tmp_path / "certs").issue("a", SpiffeId(TD, "default", "client"))
        config = local_config(tmp_path / "local.yaml", pod.ip, "10.99.0.2", "10.99.0.3")
        car = Sidecar(
            pod.ns, "default/client/client", cert, config, log_path=tmp_path / "a.log",
            log_level=None,
        )  # fmt: skip
        try:
            car.start()
            eventually("the ready line", lambda: "ztunnel ready" in car.log_text(None), 20)
        finally:
            car.stop()
    lines = car.log_text(None).splitlines()
    listening = [line for line in lines if "ztunnel listening on" in line]
    assert len(listening) == 1, lines
    for where in (
        "outbound 0.0.0.0:15001",
        "inbound_plaintext 0.0.0.0:15006",
        "inbound 0.0.0.0:15008",
        "readiness 0.0.0.0:15021",
        "admin 127.0.0.1:15000",
    ):
        assert where in listening[0]
    ready = [line for line in lines if "ztunnel ready" in line]
    assert len(ready) == 1, lines
    assert " INFO " in ready[0]
    assert (
        "serving default/client/client as spiffe://cluster.local/ns/default/sa/client" in (ready[0])
    )
    assert "1 data-plane worker" in ready[0]
