"""What each mode of ``ztunnel run`` builds, and the handover to the exec'd supervisor."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from meshctl_plugins.ztunnel.settings import ZtunnelSettings
from meshctl_plugins.ztunnel.supervisor import modes
from meshctl_plugins.ztunnel.supervisor.handover import Handover

from meshctl import config
from meshctl.core.pki import certs
from meshctl.core.pki.identity import SpiffeId
from meshctl.core.wire import channel
from meshctl.errors import UserError
from meshctl.proxy.identities import LocalCa
from tests.harness.cacerts import write_istio_cacerts


def node_settings(tmp_path: Path, **env: str) -> ZtunnelSettings:
    root = tmp_path / "root-cert.pem"
    root.write_text("-----BEGIN CERTIFICATE-----\n")
    ca = tmp_path / "ca"
    ca.mkdir(exist_ok=True)
    pair = certs.mint_root(trust_domain="cluster.local", now=datetime.now(UTC), ttl=timedelta(1))
    (ca / certs.CA_CERT_FILE).write_bytes(pair.cert_pem)
    (ca / certs.CA_KEY_FILE).write_bytes(pair.key_pem)
    base = {
        "PROXY_MODE": "node",
        "MESHCTL_CA_DIR": str(ca),
        "XDS_ADDRESS": "cp.mesh.svc:15012",
        "XDS_ROOT_CA": str(root),
    }
    return config.resolve(ZtunnelSettings, env={**base, **env})


def test_node_mode_takes_workloads_from_discovery_unless_a_local_config_is_given(tmp_path):
    sources = modes.node_sources(node_settings(tmp_path), quiet=True)
    assert sources.xds is not None
    assert sources.xds.address  # discovery's client settings, checked before the exec
    local = tmp_path / "local.yaml"
    local.write_text("workloads: []\n")
    sources = modes.node_sources(node_settings(tmp_path, LOCAL_XDS_PATH=str(local)), quiet=True)
    assert sources.xds is None  # the file wins, as in sidecar mode (ztunnel run warns)


def test_node_mode_refuses_a_ca_dir_that_cannot_sign_before_the_exec(tmp_path):
    settings = node_settings(tmp_path)
    (Path(settings.ca_dir or "") / certs.CA_KEY_FILE).write_text("not a key")
    with pytest.raises(UserError, match=r"cannot sign: ca-key\.pem is not a PEM private key"):
        modes.node_sources(settings, quiet=True)


def test_pod_certificates_from_an_istio_rsa_intermediate_carry_its_chain_and_root(tmp_path):
    folder = write_istio_cacerts(tmp_path / "cacerts")
    issuer = LocalCa(folder, "cluster.local")
    who = SpiffeId("cluster.local", "apps", "client")
    issued = asyncio.run(issuer.issue(who, timedelta(hours=1)))
    chain = certs.describe(issued.chain.encode())
    assert [f.uri_sans for f in chain] == [(str(who),), (), ()]  # leaf, intermediate, root
    assert issued.roots.encode() == (folder / certs.ROOT_CERT_FILE).read_bytes()
    assert certs.key_matches(issued.chain.encode(), issued.key.encode())


def test_the_handover_carries_settings_listeners_and_certificates_exactly(tmp_path):
    settings = node_settings(tmp_path)
    bare = Handover(
        settings=settings,
        listeners={"metrics": 7, "readiness": 8},
        certs=None,
        cert_digest="",
        log_level="info",
        dataplane_log_level="warning",
        log_format="json",
    )
    assert Handover.from_json(bare.to_json()) == bare
    held = channel.Certs(
        identity="",
        cert_chain="chain",
        key="key",
        roots="roots",
        generation=0,
        chain_facts=(),
        root_facts=(),
    )
    sidecar = dataclasses.replace(bare, certs=held, cert_digest="abc")
    assert Handover.from_json(sidecar.to_json()) == sidecar
