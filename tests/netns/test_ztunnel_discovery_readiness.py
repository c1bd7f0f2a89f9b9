"""A sidecar with ``--xds-address`` is not ready until discovery has answered: with no control
plane reachable it says so on readiness and in ``/config_dump``, and keeps retrying."""

from __future__ import annotations

import time

import pytest

from meshctl.core.pki.identity import SpiffeId
from tests.netns.ztunnel_harness import TD, Ca, Sidecar, http_get

pytestmark = pytest.mark.netns


def test_a_sidecar_without_its_control_plane_is_not_ready_and_says_why(node, tmp_path):
    pod = node.pods[0]
    ca = Ca.create(tmp_path / "certs")
    roots = tmp_path / "root-cert.pem"
    roots.write_bytes(ca.root.cert_pem)
    token = tmp_path / "token"
    token.write_text("t0ken")
    car = Sidecar(
        pod.ns,
        "default/web/web",
        ca.issue("web", SpiffeId(TD, "default", "web")),
        None,
        # The node's gateway: an address of the test's own bridge where nothing listens.
        extra=("--xds-address", f"{node.gateway}:15012", "--xds-root-ca", str(roots)),
        env={"AUTH_TOKEN": str(token), "POD_NAME": "web", "POD_NAMESPACE": "default"},
        log_path=tmp_path / "web.log",
    )
    car.start(wait_ready=False)
    try:
        # Generous: on a loaded machine the first retries can take seconds; a hang still fails.
        deadline = time.monotonic() + 60
        status, body = 0, ""
        while time.monotonic() < deadline:
            try:
                status, body = http_get(pod.ns, 15021, "/healthz/ready", timeout=1)
                dump = car.config_dump()
            except OSError:
                time.sleep(0.1)
                continue
            if dump["xds"] and dump["xds"]["connections"] >= 2 and "discovery:" in body:
                break
            time.sleep(0.1)
        assert status == 503
        assert "discovery: waiting for Address, Authorization" in body
        xds = dump["xds"]
        assert not xds["connected"]
        assert not xds["synced"]
        assert xds["lastError"]
        assert xds["node"] == "ztunnel~1.1.1.1~web.default~default.svc.cluster.local"
        assert car.proc is not None
        assert car.proc.poll() is None  # still running, still retrying
    finally:
        assert car.stop() == 0
