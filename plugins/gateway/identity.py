"""The gateway's own mesh identity: ``spiffe://<trust domain>/ns/<POD_NAMESPACE>/sa/
<SERVICE_ACCOUNT>``, its certificate from mounted files (``MESHCTL_CERT_DIR``: cert-chain.pem,
key.pem, root-cert.pem, as ``ztunnel run`` reads them) or else from the mesh CA
(``CA_ADDRESS``: CreateCertificate with the pod's token, renewed at half its life by the shared
kit's ``CaFeed``).

Owns which source applies and the current certificate. Invariants: mounted files win over the
CA (as for the sidecar); without a namespace or a source there is no identity, and meshed
endpoints then answer 503 saying so; a renewal failure keeps the current certificate.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from meshctl.core.pki.identity import SpiffeId
from meshctl.core.wire import channel
from meshctl.proxy.file_sources import has_cert_files, read_certs

from .settings import GatewaySettings

if TYPE_CHECKING:
    from meshctl.proxy.ca_client import CaFeed

log = logging.getLogger(__name__)


class MeshIdentity:
    def __init__(self, identity: SpiffeId, *, certs: channel.Certs | None = None) -> None:
        self.identity = identity
        self._certs = certs
        self.feed: CaFeed | None = None

    def certs(self) -> channel.Certs | None:
        if self.feed is not None:
            return self.feed.certs
        return self._certs

    def replace(self, certs: channel.Certs) -> None:
        """New certificates (a gateway worker's, from its supervisor)."""
        self._certs = certs

    async def run(self) -> None:
        """Keep the CA's certificate fresh (nothing to do for mounted files)."""
        if self.feed is not None:
            await self.feed.run()


def mesh_identity(settings: GatewaySettings) -> MeshIdentity | None:
    """The gateway's identity and where its certificate comes from, or None (plaintext only)."""
    if not settings.pod_namespace:
        return None
    identity = SpiffeId(
        settings.trust_domain, settings.pod_namespace, settings.service_account or "default"
    )
    folder = Path(settings.cert_dir)
    if has_cert_files(folder):
        log.info("mesh identity %s (certificates in %s)", identity, folder)
        return MeshIdentity(identity, certs=read_certs(folder, identity, 0))
    if not settings.ca_address:
        return None
    from meshctl.proxy.ca_client import CaClient, CaFeed  # grpc: only with a CA
    from meshctl.rpc import CallAuth

    auth = CallAuth.from_setting(settings.auth_token, cluster_id=settings.cluster_id)
    client = CaClient(settings.ca_address, auth=auth, server_name=settings.ca_server_name)
    log.info("mesh identity %s (certificates from the CA at %s)", identity, settings.ca_address)
    mesh = MeshIdentity(identity)
    mesh.feed = CaFeed(
        client=client,
        identity=identity,
        root_file=Path(settings.ca_root),
        ttl_seconds=int(settings.secret_ttl),
        local_config=None,
        warn=False,
    )
    return mesh
