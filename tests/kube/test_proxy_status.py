"""``meshctl proxy-status``'s server side against the real kube-apiserver: ``meshctl
controlplane run`` answers ``istio.io/debug/syncz`` (asked by the CLI's own client code, with a
TokenRequest token for the mesh namespace's ``default`` account, as the CLI mints it) with
every proxy stream's per-type sent/ACK/NACK and what its CA signed; xDS clients written from the
protos drive real streams with TokenReview-checked pod tokens.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from meshctl_plugins.proxystatus import fetch

from meshctl.core.proxystatus import report
from meshctl.kube.client import Kube
from meshctl.kube.tokens import request_token
from meshctl.rpc import RpcError
from tests.harness import controlplane as cp
from tests.harness import xds_client as tc
from tests.harness.kube import KubeCluster, create_namespace, delete_namespace
from tests.harness.kube import request_token as harness_token

pytestmark = pytest.mark.kube


@pytest.fixture(scope="module")
def mesh(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    system = f"psys-{secrets.token_hex(3)}"
    apps = f"papp-{secrets.token_hex(3)}"
    with kube_cluster.api_client() as api:
        create_namespace(api, system)
        create_namespace(api, apps)
        try:
            with cp.running(kube_cluster, system, tmp_path_factory.mktemp("pstatus")) as plane:
                yield kube_cluster, plane, cp.root_pem(api, system), system, apps
        finally:
            delete_namespace(api, apps)
            delete_namespace(api, system)


def product_kube(cluster: KubeCluster) -> Kube:
    from meshctl.kube.client import KubeSettings, connect

    return connect(KubeSettings(kubeconfig=str(cluster.kubeconfig), request_timeout=10.0))


async def ask(plane: Any, root: bytes, token: str) -> Any:
    replica = fetch.Replica(pod="replica-under-test", server_name=plane.server_name)
    return await fetch.ask(plane.grpc_port, replica, root=root, token=token, timeout=10.0)


def test_syncz_shows_synced_and_nacked_streams_with_the_nack_message_and_cert_expiry(mesh):
    cluster, plane, root, system, apps = mesh
    web = cp.pod_token(cluster, apps, "web", "web-1")
    bad = cp.pod_token(cluster, apps, "bad", "bad-1")
    # The CLI's token: TokenRequest for the mesh namespace's default account (it must exist).
    harness_token(cluster, system, "default", "istio-ca")
    debug = request_token(product_kube(cluster), system, "default", ["istio-ca"], 600)

    async def scenario():
        web_channel, web_stream = await tc.open_stream(
            f"127.0.0.1:{plane.grpc_port}",
            root_pem=root,
            token=web,
            server_name=plane.server_name,
        )
        bad_channel, bad_stream = await tc.open_stream(
            f"127.0.0.1:{plane.grpc_port}",
            root_pem=root,
            token=bad,
            server_name=plane.server_name,
        )
        node = tc.ztunnel_node(pod="web-1", ns=apps)
        for type_url in (tc.ADDRESS, tc.AUTHORIZATION):
            await web_stream.subscribe(type_url, node=node)
            await web_stream.ack(await web_stream.recv())
        await bad_stream.subscribe(tc.ADDRESS, node=tc.ztunnel_node(pod="bad-1", ns=apps))
        await bad_stream.nack(await bad_stream.recv(), "bad-1: refused on purpose")
        ca = plane.channel(root, web)
        csr, _ = cp.csr(f"spiffe://cluster.local/ns/{apps}/sa/web")
        await cp.create_certificate(ca, csr, ttl=3600)
        await ca.close()
        # Give the server a moment to read the ACK/NACK (they are one-way messages).
        for _ in range(50):
            got = await ask(plane, root, debug)
            states = {p["requester"]: p["status"] for p in got["proxies"]}
            if states.get(f"{apps}/bad-1") == "NACK" and states.get(f"{apps}/web-1") == "SYNCED":
                break
            await asyncio.sleep(0.1)
        for channel in (web_channel, bad_channel):
            await channel.close()
        return got

    got = asyncio.run(scenario())
    merged = report.merge([got])
    by_name = {p["requester"]: p for p in merged.proxies}
    good, refused = by_name[f"{apps}/web-1"], by_name[f"{apps}/bad-1"]
    assert good["status"] == "SYNCED", good
    assert good["kind"] == "sidecar"
    assert good["node"] == "node-1"  # from the stream's Node metadata
    assert set(good["types"]) == {tc.ADDRESS, tc.AUTHORIZATION}
    address = good["types"][tc.ADDRESS]
    assert address["acked"]["nonce"] == address["sent"]["nonce"] != ""
    (cert,) = good["certificates"]
    assert cert["identity"] == f"spiffe://cluster.local/ns/{apps}/sa/web"
    left = datetime.fromisoformat(cert["notAfter"]) - datetime.now(UTC)
    assert 3000 < left.total_seconds() <= 3600
    assert refused["status"] == "NACK"
    assert refused["types"][tc.ADDRESS]["nacked"]["error"] == "bad-1: refused on purpose"
    rows = report.table(merged, datetime.now(UTC))
    assert rows[0]["NAME"] == f"{apps}/bad-1"  # the problem stands out first
    assert rows[0]["STATUS"] == "NACK"
    assert "refused on purpose" in " ".join(report.problems(merged))


def test_syncz_is_refused_to_accounts_outside_the_mesh_namespace_and_to_no_token(mesh):
    cluster, plane, root, _system, apps = mesh
    outsider = harness_token(cluster, apps, "default", "istio-ca")

    async def scenario():
        with pytest.raises(RpcError) as denied:
            await ask(plane, root, outsider)
        assert denied.value.code == "PERMISSION_DENIED"
        assert "served to service accounts of" in denied.value.message
        with pytest.raises(RpcError) as anonymous:
            await ask(plane, root, "")
        assert anonymous.value.code == "UNAUTHENTICATED"

    asyncio.run(scenario())


def _with_context_namespace(kubeconfig: Any, namespace: str, where: Any) -> Any:
    import yaml

    config = yaml.safe_load(kubeconfig.read_text())
    for entry in config["contexts"]:
        entry["context"]["namespace"] = namespace
    scoped = where / "scoped.kubeconfig"
    scoped.write_text(yaml.safe_dump(config))
    return scoped


def test_the_cli_says_what_is_missing_in_one_error_line(mesh, tmp_path):
    from tests.harness.cli import run_meshctl

    cluster, _plane, _root, _system, apps = mesh
    base = ("--kubeconfig", str(cluster.kubeconfig))
    # The replica of this module runs as a process, not a pod: no control plane pod to ask.
    status = run_meshctl(*base, "proxy-status", "--mesh-namespace", apps)
    assert status.returncode == 1, status.stderr
    assert status.stderr.startswith(f"Error: no running control plane pod in namespace {apps}")
    config = run_meshctl(*base, "proxy-config", "certs", "nope", "-n", apps)
    assert config.returncode == 1, config.stderr
    assert config.stderr.startswith(f"Error: pod {apps}/nope not found"), config.stderr
    # Without -n: the kubeconfig context's namespace (kubectl's rule), else default.
    scoped = _with_context_namespace(cluster.kubeconfig, apps, tmp_path)
    by_context = run_meshctl("--kubeconfig", str(scoped), "proxy-config", "certs", "nope")
    assert by_context.stderr.startswith(f"Error: pod {apps}/nope not found"), by_context.stderr
    plain = run_meshctl(*base, "proxy-config", "certs", "nope")
    assert plain.stderr.startswith("Error: pod default/nope not found"), plain.stderr
    for done in (status, config):
        assert "Traceback" not in done.stderr
        assert done.stderr.count("Error: ") == 1
