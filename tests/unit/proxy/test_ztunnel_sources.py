"""The supervisor's local-config reader: refusals as user errors, ztunnel drift as warnings."""

from __future__ import annotations

import logging

import pytest

from meshctl.errors import UserError
from meshctl.proxy.file_sources import read_certs, read_local_config


def test_a_file_ztunnel_reads_differently_loads_with_a_warning_per_field(tmp_path, caplog):
    path = tmp_path / "local.yaml"
    path.write_text(
        "workloads:\n"
        "  - {uid: a, name: a, namespace: x, serviceAccount: a, clusterId: c,\n"
        "     workloadIps: [10.1.1.1], services: {}}\n"
    )
    with caplog.at_level(logging.WARNING):
        doc = read_local_config(path)
    assert doc["workloads"][0]["name"] == "a"
    (record,) = caplog.records
    assert record.getMessage() == (
        f"local config {path}: workloads[0].trustDomain: not set; ztunnel reads that as empty, "
        "meshctl as 'cluster.local' (it changes the workload's identity): "
        "write trustDomain: cluster.local"
    )


def test_a_workload_without_services_is_refused_as_ztunnel_refuses_it(tmp_path):
    path = tmp_path / "local.yaml"
    path.write_text("workloads:\n  - {uid: a, name: a, namespace: x, workloadIps: []}\n")
    with pytest.raises(UserError) as info:
        read_local_config(path)
    assert "workloads[0].services: required field is missing" in info.value.message
    assert "services: {}" in info.value.message


def test_certificates_signed_by_an_istio_rsa_intermediate_are_accepted(tmp_path):
    from datetime import UTC, datetime, timedelta

    from meshctl.core.pki import certs
    from meshctl.core.pki.identity import SpiffeId
    from tests.harness.cacerts import write_istio_cacerts

    folder = write_istio_cacerts(tmp_path / "cacerts")
    ca = certs.signing_ca(
        ca_cert=(folder / "ca-cert.pem").read_bytes(),
        ca_key=(folder / "ca-key.pem").read_bytes(),
        root_cert=(folder / "root-cert.pem").read_bytes(),
        cert_chain=(folder / "cert-chain.pem").read_bytes(),
        trust_domain="cluster.local",
    )
    who = SpiffeId("cluster.local", "x", "a")
    leaf = certs.mint_workload(ca.signer, who, now=datetime.now(UTC), ttl=timedelta(hours=1))
    out = tmp_path / "w"
    out.mkdir()
    (out / certs.CERT_CHAIN_FILE).write_bytes(leaf.cert_pem + ca.chain_pem)
    (out / certs.KEY_FILE).write_bytes(leaf.key_pem)
    (out / certs.ROOT_CERT_FILE).write_bytes(ca.root_pem)
    loaded = read_certs(out, who, 0)
    assert [f["uriSans"] for f in loaded.chain_facts] == [[str(who)], [], []]
