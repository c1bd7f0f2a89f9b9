"""One workload this data plane serves: its identity, certificates, pool, listeners and paths.

Owns what the traffic paths know about "us". Sidecar (dedicated) mode has one ``Local``: the pod
the sidecar sits in, its listeners inherited from the supervisor. Node (ambient) mode has one per
enrolled pod: the pod's own listeners (opened by the supervisor inside the pod's netns) and the
pod's netns, in which every connection made for the pod is created, marked, so it leaves with
the pod's address and the pod's capture rules let it pass. The paths see a ``Local`` where they
used to see the runtime: process-wide state (store, telemetry, config, drain) is delegated.
Invariants: a ``Local`` accepts only while it holds a certificate and the runtime is ready, so a
connection it cannot serve waits in the kernel's backlog; ``stop`` closes its listeners and
tunnels and releases the netns descriptor; inbound deliveries in node mode come from the client's
own address (IP_TRANSPARENT; the in-pod connmark routes the replies back), as ztunnel's do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from meshctl.core.mesh.addresses import ip as parse_ip
from meshctl.core.mesh.records import Workload
from meshctl.core.mesh.store import Store
from meshctl.core.pki.identity import SpiffeId
from meshctl.core.wire.hbone.headers import format_baggage
from meshctl.proxy import tls
from meshctl.proxy.pool import Pool
from meshctl.proxy.relay import Accepted, accept_loop, stop_accepting

from .inbound import Inbound
from .inbound_plaintext import InboundPlaintext
from .outbound import Outbound

if TYPE_CHECKING:
    from meshctl.core.wire import channel
    from meshctl.core.wire.hbone import TunnelSettings
    from meshctl.net.inpod import InPod
    from meshctl.proxy.telemetry import Telemetry

    from .served import Process

log = logging.getLogger(__name__)

PROXY_ROLES = ("outbound", "inbound", "inbound_plaintext")
INBOUND_PASSTHROUGH_V4 = "127.0.0.6"
INBOUND_PASSTHROUGH_V6 = "::6"
_IPV6_FREEBIND = 78  # linux/in6.h; ::6 is not an address of lo, so the bind needs freebind
_IP_TRANSPARENT = 19  # linux/in.h
_IPV6_TRANSPARENT = 75  # linux/in6.h


class Local:
    """A served workload: ``uid`` (pod UID in node mode, "" in sidecar mode) and ``ref``."""

    def __init__(
        self,
        rt: Process,
        *,
        uid: str,
        ref: tuple[str, str, str],
        netns_fd: int | None = None,
        netns: str = "",
        inpod: InPod | None = None,
    ) -> None:
        self.runtime = rt
        self.uid = uid
        self.ref = ref  # (namespace, name, service account)
        self.identity = SpiffeId(rt.config.trust_domain, ref[0], ref[2])
        self.netns_fd = netns_fd
        self.in_pod = netns_fd is not None  # node mode: every socket is made in the pod
        self.netns = netns
        self._inpod = inpod
        self.me: Workload | None = None
        self.contexts: tls.TlsContexts | None = None
        self.certs: channel.Certs | None = None
        self.baggage = ""
        self.stopped = False
        # Node mode and sidecar TPROXY mode: deliver from the client's address.
        self.transparent = self.in_pod or bool(rt.config.tproxy_mark)
        cfg = rt.config
        self.pool = Pool(
            contexts=self._current_contexts,
            settings=rt.tunnel_settings,
            max_streams=cfg.pool_max_streams,
            idle_timeout=cfg.pool_idle_timeout,
            connect_timeout=cfg.connect_timeout,
            handshake_timeout=cfg.handshake_timeout,
            new_socket=self.upstream_socket,
        )
        self.inbound = Inbound(self)
        self.listeners: dict[str, socket.socket] = {}
        self._paths: dict[str, Callable[[Accepted], None]] = {
            "outbound": Outbound(self).accepted,
            "inbound": self.inbound.accepted,
            "inbound_plaintext": InboundPlaintext(self).accepted,
        }
        self._accepting: list[asyncio.Task[None]] = []
        self.refresh(rt.store)

    # -- what the paths read from the runtime ------------------------------------------------

    @property
    def store(self) -> Store:
        return self.runtime.store

    @property
    def telemetry(self) -> Telemetry:
        return self.runtime.telemetry

    @property
    def config(self) -> channel.ProxyConfig:
        return self.runtime.config

    @property
    def own_ports(self) -> frozenset[int]:
        return self.runtime.own_ports

    @property
    def draining(self) -> bool:
        return self.runtime.draining or self.stopped

    @property
    def tunnel_settings(self) -> TunnelSettings:
        return self.runtime.tunnel_settings

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.runtime.spawn(coro)

    # -- sockets -----------------------------------------------------------------------------

    def upstream_socket(
        self, ip: str, *, inbound: bool = False, source: str | None = None
    ) -> socket.socket:
        """A non-blocking TCP socket for a connection we originate for this workload.

        Sidecar mode: in our own namespace, marked if configured; ``inbound`` deliveries leave
        from the inbound passthrough address (127.0.0.6 / ::6), which the sidecar capture rules
        RETURN first (otherwise a proxy exempt by uid reaching its pod IP over ``lo`` matches the
        hairpin rule and loops into :15006; istio-iptables does the same for Envoy's inbound).
        Node mode: in the pod's namespace with the in-pod mark; an ``inbound`` delivery binds the
        client's address ``source`` transparently (falling back to the pod's own address).
        """
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        sock = self._socket(family)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.config.mark:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.config.mark)
            if inbound and self.in_pod:
                if source and self.transparent:
                    self._bind_transparent(sock, family, source)
            elif inbound and self.config.tproxy_mark and not parse_ip(ip).is_loopback:
                # TPROXY: the app sees the client; the mark's connmark routes its replies to lo.
                if source and self.transparent and self._bind_transparent(sock, family, source):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.config.tproxy_mark)
                else:
                    _bind_passthrough(sock, family)
            elif inbound and not parse_ip(ip).is_loopback:
                _bind_passthrough(sock, family)
        except OSError:
            sock.close()
            raise
        return sock

    def _socket(self, family: int) -> socket.socket:
        """A TCP socket in this workload's namespace (the pod's, in node mode)."""
        if not self.in_pod:
            return socket.socket(family, socket.SOCK_STREAM)
        if self.netns_fd is None or self._inpod is None:
            # The pod left: whatever of it is still open makes no new connection (never one
            # from the node's own namespace in its name).
            raise ConnectionRefusedError(f"pod {self.ref[0]}/{self.ref[1]} is no longer served")
        return self._inpod.new_socket(self.netns_fd, family)

    def _bind_transparent(self, sock: socket.socket, family: int, source: str) -> bool:
        """Bind ``sock`` to the client's address ``source``; False when it cannot be."""
        if (":" in source) != (family == socket.AF_INET6) or parse_ip(source).is_loopback:
            return False
        try:
            if family == socket.AF_INET:
                sock.setsockopt(socket.SOL_IP, _IP_TRANSPARENT, 1)
            else:
                sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_TRANSPARENT, 1)
            sock.bind((source, 0))
        except OSError as exc:
            # Without CAP_NET_ADMIN the app sees the pod's own address as the client: it still
            # works, only the original source is lost. Said once per pod.
            self.transparent = False
            log.warning(
                "pod %s/%s: delivering without the client's address (%s)",
                self.ref[0],
                self.ref[1],
                exc.strerror or exc,
            )
            return False
        return True

    def is_local_ip(self, ip: str) -> bool:
        """Whether ``ip`` is an address of this workload's namespace (binding to it succeeds)."""
        family = socket.AF_INET6 if parse_ip(ip).version == 6 else socket.AF_INET
        with self._socket(family) as probe:
            try:
                probe.bind((ip, 0))
            except OSError:
                return False
        return True

    # -- life --------------------------------------------------------------------------------

    def attach(self, role: str, sock: socket.socket) -> bool:
        """Serve the listening ``sock`` on the path of ``role`` (``outbound6`` -> outbound)."""
        path = self._paths.get(role.removesuffix("6"))
        if path is None:
            return False
        sock.setblocking(False)
        self.listeners[role] = sock
        return True

    @property
    def accepting(self) -> bool:
        return bool(self._accepting)

    def maybe_accept(self) -> None:
        """Start accepting once everything a connection needs is here (idempotent)."""
        if self._accepting or self.stopped or not self.runtime.ready or self.contexts is None:
            return
        for role, sock in self.listeners.items():
            path = self._paths[role.removesuffix("6")]
            self._accepting.append(asyncio.ensure_future(accept_loop(sock, path)))

    def use_certs(self, certs: channel.Certs, contexts: tls.TlsContexts) -> None:
        self.certs, self.contexts = certs, contexts
        self.maybe_accept()

    def refresh(self, store: Store) -> None:
        """Our workload record and baggage from a new store snapshot."""
        ns, name, _ = self.ref
        me = self.me = store.find_workload(ns, name)
        self.baggage = format_baggage(
            cluster=me.cluster_id if me else self.config.cluster_id,
            namespace=ns,
            workload_type=me.workload_type if me else "deployment",
            workload_name=(me.workload_name or me.name) if me else name,
            service=(me.canonical_name or me.name) if me else name,
            revision=(me.canonical_revision or "latest") if me else "latest",
        )

    def stop_accepting(self) -> None:
        for task in self._accepting:
            task.cancel()
        self._accepting.clear()
        for sock in self.listeners.values():
            stop_accepting(sock)

    def stop(self) -> None:
        """The pod left: no new connections, tunnels told to go away, the netns let go."""
        self.stopped = True
        self.stop_accepting()
        for tunnel in list(self.inbound.tunnels):
            tunnel.goaway()
        self.pool.drain()
        if self.netns_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.netns_fd)
            self.netns_fd = None

    def state(self) -> str:
        """ztunnel's proxy state: ``Up`` while accepting, ``Pending`` while waiting."""
        return "Up" if self._accepting else "Pending"

    def _current_contexts(self) -> tls.TlsContexts:
        if self.contexts is None:
            raise ConnectionError(f"no certificate for {self.identity} yet")
        return self.contexts


def _bind_passthrough(sock: socket.socket, family: int) -> None:
    if family == socket.AF_INET:
        sock.bind((INBOUND_PASSTHROUGH_V4, 0))  # all of 127/8 is local: no setup needed
        return
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_FREEBIND, 1)
        sock.bind((INBOUND_PASSTHROUGH_V6, 0))
    except OSError as exc:
        # Not fatal: without ::6 the connection works wherever no hairpin rule applies (a gid
        # or mark exemption); only a uid-exempt proxy would loop, and the log says why.
        log.debug("cannot bind %s for inbound passthrough: %s", INBOUND_PASSTHROUGH_V6, exc)
