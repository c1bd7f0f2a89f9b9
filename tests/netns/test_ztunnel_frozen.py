"""The frozen binary as a sidecar: ``ztunnel run`` re-executes itself as its data plane.

Runs the one-file binary and the one-dir tree (the image's form) that ``bash packaging/build.sh``
writes, named by ``MESHCTL_FROZEN_BINARY`` and ``MESHCTL_FROZEN_TREE`` (``.ci/run`` sets them
after the build). Without them the test skips and says why; under ``CI=true`` that skip fails the
run (it is a netns test). One pod's
sidecar is frozen and the other runs from the source tree, in both roles, so HBONE is proven
between the frozen binary and an independent build of the same code, with the frozen side's
lazily imported pieces (uvloop, h2/hpack/hyperframe, prometheus-client's multiprocess mode with
two workers, the TLS stack) all exercised.
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import pytest

from tests.harness.frozen import frozen_binary, frozen_tree
from tests.netns.ztunnel_harness import echo_roundtrip, metric_sum
from tests.netns.ztunnel_topology import APP_PORT, SVC_PORT, two_pod_mesh

pytestmark = [pytest.mark.netns, pytest.mark.slow]

CLIENT = "spiffe://cluster.local/ns/default/sa/client"
SERVER = "spiffe://cluster.local/ns/prod/sa/server"


@pytest.mark.parametrize(
    ("frozen_side", "form"), [("client", "one-file"), ("server", "one-file"), ("server", "tree")]
)
def test_frozen_sidecar_moves_bytes_over_hbone_with_an_unfrozen_peer(tmp_path, frozen_side, form):
    binary = frozen_binary() if form == "one-file" else frozen_tree() / "meshctl"
    workers = ("--workers", "2")
    if frozen_side == "client":
        mesh = two_pod_mesh(tmp_path, binary_a=str(binary), extra_a=workers)
    else:
        mesh = two_pod_mesh(tmp_path, binary_b=str(binary), extra_b=workers)
    with mesh as m:
        frozen, unfrozen = (m.car_a, m.car_b) if frozen_side == "client" else (m.car_b, m.car_a)
        # The supervisor started its data plane from the frozen binary itself (self-exec), and
        # the peer's data plane is the source tree's interpreter.
        for pid in frozen.dataplane_pids(2):
            assert Path(f"/proc/{pid}/exe").resolve() == binary
        for pid in unfrozen.dataplane_pids(1):
            assert Path(f"/proc/{pid}/exe").resolve() != binary
        payload = secrets.token_bytes(1_500_000)
        for addr in [(m.b.ip, APP_PORT)] * 3 + [(m.vip, SVC_PORT)] * 3:
            reply = echo_roundtrip(m.a.ns, addr, payload)
            assert reply == hashlib.sha256(payload).digest() + payload
        identities = {"source_principal": CLIENT, "destination_principal": SERVER}
        opened = "istio_tcp_connections_opened_total"
        # Both workers' counters, summed by prometheus-client's multiprocess mode, frozen.
        assert metric_sum(m.car_a.metrics(), opened, reporter="source", **identities) == 6
        assert metric_sum(m.car_b.metrics(), opened, reporter="destination", **identities) == 6
        received = metric_sum(
            m.car_b.metrics(), "istio_tcp_received_bytes_total", reporter="destination"
        )
        assert received == 6 * (len(payload) + 1)
        dump = frozen.config_dump()
        assert dump["worker"]["of"] == 2
        assert dump["identity"] == (CLIENT if frozen_side == "client" else SERVER)
        assert dump["certificates"][0]["state"] == "Available"
        assert f"src.identity={CLIENT}" in frozen.log_text()  # the access log, frozen
    assert frozen.proc is not None
    assert frozen.proc.returncode == 0  # drained and exited cleanly on SIGTERM
