"""The control-plane process: one asyncio loop composing the CA, the services, the webhook, the
leader's writers and the status ports, on istiod's port numbers.

Owns the order of life: status ports first (not ready) -> the CA loaded (``cacerts`` or our
root) -> a serving certificate from it -> gRPC on 15012 (CA plus every ``Part``'s service,
one server) and the injection webhook on 15017 -> leader election, whose leader runs the writers
(root ConfigMaps, the webhook's caBundle) -> ready. On SIGTERM: not ready at once, the gRPC server
stops accepting and lets in-flight calls finish within the drain deadline (then GOAWAY and cancel:
proxies reconnect to another replica), the webhook drains, components stop, the Lease is
released, exit 0. Invariants: the serving certificate is reissued at half its lifetime and
whenever the CA changes, without a restart; no part's failure after start takes the process down
(each logs and retries); every wait has a deadline.

Parts (discovery, #12 part B, and whatever follows) plug in through ``Part``: they get
the ``Plane`` on start (register a servicer on ``plane.server``, subscribe to the process's
shared ``plane.informers``, run background work with ``plane.spawn``, authenticate callers with
``plane.authenticator``) and report readiness. One informer per resource and selector serves
the whole process (discovery and the root publisher share the Namespaces).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import secrets
import socket
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from meshctl import logs, rpc, webhook
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.k8s.inject.webhook_config import configuration_name
from meshctl.core.pki import ca
from meshctl.core.pki.issued import IssuedLedger
from meshctl.kube.client import Kube
from meshctl.kube.informer import Informers
from meshctl.proto import citadel_pb2_grpc
from meshctl.shutdown import StopSignals
from meshctl.tasks import Tasks

from .authn import Authenticator
from .authority import AuthorityStore
from .ca import CertificateService
from .cabundle import CaBundlePatcher
from .leader import LeaderElection, Timing
from .metrics import Metrics
from .roots import RootPublisher
from .settings import ControlPlaneSettings, address, duration
from .status import MetricsApp, ReadinessApp

log = logging.getLogger(__name__)
WHAT = "control plane"  # how the listening and ready lines name this daemon

T = TypeVar("T")
_QUIET = 0.2  # seconds without a new CA call that count as "nothing in flight"
_LISTENER_CLOSE = 0.1  # seconds for grpc core to close the listener and send GOAWAY


class Part(Protocol):
    """A part of the control plane that serves on the shared gRPC server (e.g. discovery)."""

    name: str

    async def start(self, plane: Plane) -> None:
        """Register services on ``plane.server`` and start background work; return promptly."""

    def drain(self) -> None:
        """Called once the gRPC server stopped accepting (GOAWAY sent): end long-lived calls
        (discovery streams) so their clients reconnect to another replica."""

    async def stop(self) -> None:
        """Called after the gRPC server stopped: end background work."""

    def not_ready(self) -> str | None:
        """Why this component cannot serve yet (e.g. caches not synced), or None."""


@dataclass(slots=True, kw_only=True)
class Plane:
    """What components get: settings, clients and the shared servers of this process."""

    settings: ControlPlaneSettings
    kube: Kube
    informers: Informers
    server: rpc.Server
    metrics: Metrics
    authenticator: Authenticator
    authorities: AuthorityStore
    leader: LeaderElection
    issued: IssuedLedger = field(default_factory=IssuedLedger)  # what the CA signed, per caller
    tasks: Tasks = field(default_factory=lambda: Tasks(log))

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` for the life of the process; a failure is logged, never fatal."""
        return self.tasks.spawn(coro, name)


def leader_identity(settings: ControlPlaneSettings) -> str:
    """The Lease holder name: the pod (or host) name plus a random suffix, as client-go."""
    return f"{settings.pod_name or socket.gethostname()}_{secrets.token_hex(4)}"


class ControlPlane:
    """One replica of the control plane."""

    def __init__(
        self,
        settings: ControlPlaneSettings,
        kube: Kube,
        inject: InjectSettings,
        components: Sequence[Part] = (),
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.inject = inject
        self.components = list(components)
        self.metrics = Metrics()
        self.informers = Informers(kube)
        self.authorities = AuthorityStore(
            kube,
            self.informers,
            namespace=settings.namespace,
            trust_domain=settings.trust_domain,
            key_type=settings.self_signed_ca_key,
        )
        self.authenticator = Authenticator(
            kube,
            trust_domain=settings.trust_domain,
            node_accounts=settings.node_accounts,
            on_review=lambda result: self.metrics.token_reviews.labels(result).inc(),
        )
        lease, renew, retry = settings.timing()
        self.leader = LeaderElection(
            kube,
            namespace=settings.namespace,
            name=f"{settings.service_name}-leader",
            identity=leader_identity(settings),
            timing=Timing(lease_duration=lease, renew_deadline=renew, retry=retry),
            on_change=lambda leading: self.metrics.leader.set(1 if leading else 0),
        )
        self.roots = RootPublisher(
            self.informers, kube, self._bundle, names=settings.root_configmaps
        )
        self.cabundle = CaBundlePatcher(
            self.informers,
            kube,
            configuration_name(settings.revision),
            settings.revision,
            self._bundle,
        )
        self.leader.add("root distribution", self.roots.run)
        self.leader.add("webhook caBundle", self.cabundle.run)
        self.authorities.subscribe(self._ca_changed)
        self._stop = asyncio.Event()
        self._reissue = asyncio.Event()
        self._draining = False
        self._serving_until: datetime | None = None
        self._server: rpc.Server | None = None
        self._webhook: webhook.TlsConfig | None = None
        self._grpc_port = 0
        self._ca: CertificateService | None = None
        self.issued = IssuedLedger()

    # -- state read by the status ports and tests ----------------------------------------------

    def _bundle(self) -> str | None:
        authority = self.authorities.current
        return None if authority is None else authority.roots_pem

    def not_ready(self) -> list[str]:
        if self._draining:
            return ["draining"]
        reasons = []
        if self.authorities.current is None:
            reasons.append("loading the CA")
        if self._server is None:
            reasons.append("gRPC server not started")
        if self._webhook is None:
            reasons.append("webhook not started")
        for component in self.components:
            why = component.not_ready()
            if why:
                reasons.append(f"{component.name}: {why}")
        return reasons

    def stop(self) -> None:
        self._stop.set()

    def _ca_changed(self, authority: ca.Authority) -> None:
        self.metrics.root_expiry.set(authority.anchor.not_valid_after_utc.timestamp())
        self._reissue.set()
        self.roots.bundle_changed()
        self.cabundle.bundle_changed()

    # -- life ----------------------------------------------------------------------------------

    async def run(self) -> int:
        signals = StopSignals(self._stop.set)
        signals.install()
        status_stop = asyncio.Event()
        tasks: set[asyncio.Task[Any]] = set()
        try:
            for app, name in (
                (ReadinessApp(self.not_ready), "readiness_address"),
                (MetricsApp(self.metrics.registry), "metrics_address"),
            ):
                host, port = address(getattr(self.settings, name), name)
                config = webhook.plain_config(host, port)  # bound now: a port in use fails here
                tasks.add(asyncio.ensure_future(webhook.serve(app, config, status_stop)))
            return signals.exit_code(await self._serve(tasks))
        finally:
            status_stop.set()
            if tasks:
                await asyncio.wait(tasks, timeout=2.0)
            for task in tasks:
                task.cancel()
            signals.remove()

    async def _serve(self, status_tasks: set[asyncio.Task[Any]]) -> int:
        loading = Tasks(log).spawn(self.authorities.run(), "CA")  # before the plane's own
        try:
            authority = await self._until_stopped(self.authorities.wait_loaded())
            if authority is None:
                return 0
            self.metrics.root_expiry.set(authority.anchor.not_valid_after_utc.timestamp())
            pair = self._serving_pair(authority)
            self._reissue.clear()  # this pair is already from the CA just loaded
            server = rpc.Server(
                rpc.KeyPair(cert_chain_pem=pair.cert_chain_pem, key_pem=pair.key_pem),
                max_message_bytes=self.settings.max_message_bytes,
            )
            self._ca = CertificateService(
                authenticator=self.authenticator,
                authority=lambda: self.authorities.current,
                metrics=self.metrics,
                default_ttl=self.settings.default_ttl,
                max_ttl=self.settings.max_ttl,
                issued=self.issued,
            )
            server.add(citadel_pb2_grpc.add_IstioCertificateServiceServicer_to_server, self._ca)
            plane = Plane(
                settings=self.settings,
                kube=self.kube,
                informers=self.informers,
                server=server,
                metrics=self.metrics,
                authenticator=self.authenticator,
                authorities=self.authorities,
                leader=self.leader,
                issued=self.issued,
            )
            for component in self.components:
                await component.start(plane)
            host, port = address(self.settings.grpc_address, "grpc-address")
            self._grpc_port = server.listen(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
            await server.start()
            self._server = server

            wh_host, wh_port = address(self.settings.webhook_address, "webhook-address")
            config = webhook.config_for(
                wh_host, wh_port, pair=pair, graceful_seconds=self._deadline() / 2
            )
            webhook_stop = asyncio.Event()
            serving = asyncio.ensure_future(
                webhook.serve(webhook.WebhookApp(self.inject), config, webhook_stop)
            )
            serving.set_name("webhook")
            self._webhook = config
            grpc_what = "".join(f", {c.name}" for c in self.components)
            logs.listening(
                log,
                WHAT,
                [
                    f"gRPC (CA{grpc_what}) {self.settings.grpc_address}",
                    f"https://{config.where}/inject",
                    f"readiness {self.settings.readiness_address}",
                    f"metrics {self.settings.metrics_address}",
                ],
            )
            plane.spawn(self._announce_ready(), "ready line")

            election_stop = asyncio.Event()
            electing = plane.spawn(self.leader.run(election_stop), "leader election")
            plane.spawn(self._rotate_serving(), "serving certificate")
            gc.freeze()  # start-up objects live forever: keep them out of full collections
            stopping = asyncio.ensure_future(self._stop.wait())
            servers = {serving, *status_tasks}
            await asyncio.wait({stopping, *servers}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            ended = [t for t in servers if t.done()]
            for task in ended:  # a server that stopped on its own: say why, then shut down
                error = task.exception() if not task.cancelled() else None
                log.error("a listener stopped unexpectedly: %s", error or "cancelled")
            code = await self._drain(plane, server, serving, webhook_stop, election_stop, electing)
            return 1 if ended else code
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await loading

    async def _announce_ready(self) -> None:
        """The one ready line, once /ready would first answer 200 (CA, servers, components)."""
        while self.not_ready():
            await asyncio.sleep(0.1)
        logs.ready(log, WHAT, f"revision {self.settings.revision}")

    async def _until_stopped(self, awaitable: Coroutine[Any, Any, T]) -> T | None:
        work = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if work.done():
            return work.result()
        work.cancel()
        return None

    def _deadline(self) -> float:
        return duration(self.settings.drain_deadline, "drain deadline").total_seconds()

    async def _drain(
        self,
        plane: Plane,
        server: rpc.Server,
        serving: asyncio.Task[None],
        webhook_stop: asyncio.Event,
        election_stop: asyncio.Event,
        electing: asyncio.Task[Any],
    ) -> int:
        started = time.monotonic()
        deadline = self._deadline()
        self._draining = True
        log.info("draining: in-flight calls have %.1fs to finish", deadline)
        webhook_stop.set()
        election_stop.set()
        await self._quiesce(min(deadline / 2, 5.0))
        # grpcio: stop accepting, GOAWAY to every client, cancel what runs past the grace.
        stopping = asyncio.ensure_future(server.stop(max(0.0, deadline - 1.0)))
        # Once the listener is closed (the shutdown starts as the task first runs), streams
        # that would otherwise last until the grace ends are ended: their proxies reconnect
        # to a replica that accepts, while in-flight signing still finishes here.
        await asyncio.sleep(_LISTENER_CLOSE)
        for component in self.components:
            try:
                component.drain()
            except Exception:
                log.exception("%s did not drain cleanly", component.name)
        await stopping
        for component in self.components:
            try:
                await asyncio.wait_for(component.stop(), timeout=2.0)
            except Exception:
                log.exception("%s did not stop cleanly", component.name)
        left = max(0.5, deadline - (time.monotonic() - started))
        await asyncio.wait({serving, electing}, timeout=left)
        plane.tasks.cancel()
        serving.cancel()
        await asyncio.wait({serving, *plane.tasks}, timeout=1.0)
        log.info("control plane stopped after %.1fs", time.monotonic() - started)
        return 0

    async def _quiesce(self, limit: float) -> None:
        """Keep serving (not ready: the endpoint is being removed) until no CA call has started
        for a moment, at most ``limit`` s. grpc's core cancels calls that reached the server but
        were not yet handed to a handler when it shuts down; this lets them be handled first."""
        service = self._ca
        if service is None:
            return
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if service.active == 0 and time.monotonic() - service.last_started > _QUIET:
                return
            await asyncio.sleep(0.02)

    # -- serving certificate -------------------------------------------------------------------

    def _serving_pair(self, authority: ca.Authority) -> webhook.Pair:
        dns, ips = self.settings.serving_dns_and_ips()
        ttl = duration(self.settings.serving_cert_ttl, "serving cert TTL")
        now = datetime.now(UTC)
        leaf, key = ca.issue_serving(authority, dns_names=dns, ip_addresses=ips, ttl=ttl, now=now)
        self._serving_until = min(now + ttl, authority.cert.not_valid_after_utc)
        chain = (leaf + authority.serving_chain_pem()).encode()
        return webhook.Pair(cert_chain_pem=chain, key_pem=key)

    async def _rotate_serving(self) -> None:
        """Reissue at half the lifetime, or at once when the CA changes."""
        ttl = duration(self.settings.serving_cert_ttl, "serving cert TTL")
        while True:
            until = self._serving_until or datetime.now(UTC)
            wait = max(1.0, (until - datetime.now(UTC) - ttl / 2).total_seconds())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reissue.wait(), wait)
            self._reissue.clear()
            authority = self.authorities.current
            if authority is None or self._server is None or self._webhook is None:
                continue
            pair = self._serving_pair(authority)
            self._server.set_key_pair(
                rpc.KeyPair(cert_chain_pem=pair.cert_chain_pem, key_pem=pair.key_pem)
            )
            self._webhook.load_pair(pair)
            log.info("serving certificate reissued (valid until %s)", self._serving_until)

    @property
    def grpc_port(self) -> int:
        return self._grpc_port
