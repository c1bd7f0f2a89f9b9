"""The CA alone, without Kubernetes: ``meshctl controlplane ca`` (a laptop, a VM, the demo).

Owns a CA process that needs no API server: the signing CA from a folder (Istio's plug-in file
names: ``ca-cert.pem`` + ``ca-key.pem``, with ``cert-chain.pem`` + ``root-cert.pem`` for an
intermediate; a self-signed root minted there on first start, create-only), callers
authenticated by a static token file in kube-apiserver's ``--token-auth-file`` CSV format
(``token,user,uid[,"groups"]``; the user ``system:serviceaccount:NS:SA``), and the same
``CertificateService`` the in-cluster control plane serves on 15012.
Invariants: a caller gets only its own identity, except the node-proxy accounts the user
listed in ``--trusted-node-accounts`` (istiod's ``CA_TRUSTED_NODE_ACCOUNTS``; none by default):
with no node inventory here they may impersonate any identity of the trust domain (one node: a
laptop, a VM, the demo), and only with Istio's ``ImpersonatedIdentity`` metadata; the token
file is re-read when it changes, and a bad file is refused at start (a one-line error naming
the line) and ignored with a log after start; tokens and keys are never logged; SIGTERM/SIGINT
stop within the drain deadline.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import hmac
import io
import ipaddress
import logging
import socket
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from meshctl import inputs, logs, rpc
from meshctl.core.pki import ca, callers
from meshctl.core.pki.callers import Caller, CallerError, TokenVerdict
from meshctl.core.pki.identity import SpiffeId
from meshctl.errors import UserError
from meshctl.proto import citadel_pb2_grpc
from meshctl.shutdown import StopSignals
from meshctl.structured import InputError

from .ca import CertificateService
from .metrics import Metrics
from .settings import ControlPlaneSettings, address, duration, is_dns_name

log = logging.getLogger(__name__)

TOKENS_HINT = (
    "--tokens FILE: lines token,system:serviceaccount:NS:SA,uid (the format of kube-apiserver's "
    "--token-auth-file)"
)
_FILES = ("ca-cert.pem", "ca-key.pem", "cert-chain.pem", "root-cert.pem")


def parse_token_file(text: str, source: str) -> dict[bytes, str]:
    """SHA-256 of each token -> its user; ``UserError`` naming the line of the first bad one."""
    users: dict[bytes, str] = {}
    reader = csv.reader(io.StringIO(text))
    try:
        for row in reader:
            number = reader.line_num
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            if len(row) < 3 or not row[0].strip() or not row[1].strip():
                raise UserError(
                    f'{source}:{number}: expected token,user,uid[,"groups"]', hint=TOKENS_HINT
                )
            users[hashlib.sha256(row[0].strip().encode()).digest()] = row[1].strip()
    except csv.Error as exc:  # a NUL byte, an endless quoted field: not a token file
        raise UserError(f"{source}:{reader.line_num}: {exc}", hint=TOKENS_HINT) from None
    return users


WHAT = "CA"  # how the listening and ready lines name this daemon
_EVERY_ADDRESS = ("0.0.0.0", "::")  # noqa: S104 -- what a listener on every address binds


def listen_names(host: str) -> tuple[list[str], list[str]]:
    """DNS names and IPs a client may dial to reach a listener on ``host``: that address (and
    localhost for a loopback one), or for every address (``0.0.0.0``, ``::``) localhost, this
    host's name and its addresses."""
    if host not in _EVERY_ADDRESS:
        return (["localhost"] if ipaddress.ip_address(host).is_loopback else []), [host]
    from meshctl.net.addresses import local_addresses

    names = ["localhost"]
    hostname = socket.gethostname().lower()
    if is_dns_name(hostname):
        names.append(hostname)
    return names, local_addresses(v6=host == "::")


def load_or_mint_authority(folder: Path, *, trust_domain: str, key_type: str) -> ca.Authority:
    """The CA in ``folder``; a self-signed root is minted there (create-only) when it holds
    none, so every later start signs with the same root."""
    now = datetime.now(UTC)
    cert_file, key_file = folder / _FILES[0], folder / _FILES[1]
    if not cert_file.exists() and not key_file.exists():
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        cert_pem, key_pem = ca.mint_root(trust_domain=trust_domain, now=now, key_type=key_type)
        for path, data, mode in ((key_file, key_pem, 0o600), (cert_file, cert_pem.encode(), 0o644)):
            try:
                with path.open("xb") as out:  # create-only: never replace someone's CA
                    out.write(data)
                path.chmod(mode)
            except FileExistsError:
                break  # another process minted at the same moment: load what it wrote
        log.info("minted a self-signed root in %s", folder)
    try:
        parts = [
            (folder / name).read_bytes() if (folder / name).exists() else b"" for name in _FILES
        ]
        return ca.load_authority(
            ca_cert_pem=parts[0],
            ca_key_pem=parts[1],
            cert_chain_pem=parts[2],
            root_cert_pem=parts[3],
            now=now,
        )
    except (ca.CaError, OSError) as exc:
        raise UserError(
            f"cannot use the CA in {folder}: {exc}",
            hint="ca-cert.pem + ca-key.pem (and cert-chain.pem + root-cert.pem for an "
            "intermediate), or an empty folder to mint a root",
        ) from exc


class StaticTokens:
    """Callers from a token file (the ``Authenticator`` interface the CA service uses)."""

    def __init__(
        self, path: Path, *, trust_domain: str, node_accounts: frozenset[str] = frozenset()
    ) -> None:
        self._path = path
        self._trust_domain = trust_domain
        self._node_accounts = node_accounts
        self._stamp: tuple[int, int] | None = None
        self._users: dict[bytes, str] = {}
        self._reload(strict=True)

    def _reload(self, *, strict: bool) -> None:
        try:
            st = self._path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            limits = inputs.limits()
            text = inputs.read_text(self._path, str(self._path), limits)
            users = parse_token_file(text, str(self._path))
        except InputError as exc:  # binary, or too large: refused like a malformed line
            if strict:
                raise UserError(exc.message, hint=TOKENS_HINT) from exc
            log.warning("token file refused, keeping the tokens read before: %s", exc.message)
            return
        except OSError as exc:
            if strict:
                raise UserError(
                    f"cannot read the token file {self._path}: {exc.strerror}",
                    hint=TOKENS_HINT,
                ) from exc
            log.warning(
                "token file %s unreadable (%s); keeping the tokens read before",
                self._path,
                exc.strerror,
            )
            return
        except UserError as exc:
            if strict:
                raise
            log.warning("token file refused, keeping the tokens read before: %s", exc.message)
            return
        self._users, self._stamp = users, stamp

    async def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Caller:
        token = callers.bearer_token(metadata)
        self._reload(strict=False)
        digest = hashlib.sha256(token.encode()).digest()
        user = next((u for k, u in self._users.items() if hmac.compare_digest(k, digest)), "")
        verdict = TokenVerdict(authenticated=bool(user), username=user, error="no such token")
        return callers.caller_from_verdict(
            verdict,
            trust_domain=self._trust_domain,
            checked_by="the CA's token file (--tokens)",
            expected="add a line token,system:serviceaccount:NS:SA,uid for it",
        )

    async def authorize(
        self, caller: Caller, requested: SpiffeId, *, impersonating: bool = False
    ) -> None:
        """Its own identity always; another one only for a trusted node account that sent
        ``ImpersonatedIdentity`` (any workload of the trust domain: nothing here knows nodes)."""
        verdict = callers.check_identity(caller, requested, node_accounts=self._node_accounts)
        if verdict == "self":
            if impersonating and not callers.is_node_proxy(caller, self._node_accounts):
                raise CallerError(
                    "PERMISSION_DENIED",
                    f"caller {caller.identity} sent ImpersonatedIdentity but is not listed in "
                    "--trusted-node-accounts; ask without it",
                )
            return
        callers.require_impersonation(caller, requested, impersonating=impersonating)


async def serve(settings: ControlPlaneSettings, ca_dir: Path, tokens: Path) -> int:
    """Serve ``CreateCertificate`` on ``settings.grpc_address`` until SIGTERM/SIGINT."""
    # The token file first: a bad one is refused before a root is minted into --ca-dir.
    authn = StaticTokens(
        tokens, trust_domain=settings.trust_domain, node_accounts=settings.node_accounts
    )
    authority = load_or_mint_authority(
        ca_dir, trust_domain=settings.trust_domain, key_type=settings.self_signed_ca_key
    )
    host, port = address(settings.grpc_address, "grpc-address")
    dns, ips = settings.serving_dns_and_ips()
    # The names a client on this machine (or one that reaches it by its addresses) dials, so
    # 'ztunnel run --ca-address 127.0.0.1:15012' verifies without --serving-names.
    # (In a thread: pyroute2's netlink socket runs an event loop of its own.)
    own_dns, own_ips = await asyncio.to_thread(listen_names, host)
    dns = list(dict.fromkeys([*dns, *own_dns]))
    ips = list(dict.fromkeys([*ips, *own_ips]))
    now = datetime.now(UTC)
    ttl = duration(settings.serving_cert_ttl, "serving cert TTL")
    leaf, key = ca.issue_serving(authority, dns_names=dns, ip_addresses=ips, ttl=ttl, now=now)
    server = rpc.Server(
        rpc.KeyPair(cert_chain_pem=(leaf + authority.serving_chain_pem()).encode(), key_pem=key),
        max_message_bytes=settings.max_message_bytes,
    )
    service = CertificateService(
        authenticator=authn,
        authority=lambda: authority,
        metrics=Metrics(),
        default_ttl=settings.default_ttl,
        max_ttl=settings.max_ttl,
    )
    server.add(citadel_pb2_grpc.add_IstioCertificateServiceServicer_to_server, service)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    server.listen(where)
    await server.start()
    logs.listening(log, WHAT, [f"gRPC (CA) {where}"])
    logs.ready(
        log,
        WHAT,
        f"callers from {tokens}; serving certificate for {', '.join([*dns, *ips])}",
    )
    if settings.node_accounts:
        log.info(
            "node proxies %s may impersonate any identity of %s (no node inventory)",
            ",".join(sorted(settings.node_accounts)),
            settings.trust_domain,
        )
    stop = asyncio.Event()
    signals = StopSignals(stop.set)
    signals.install()
    await stop.wait()
    await server.stop(duration(settings.drain_deadline, "drain deadline").total_seconds())
    signals.remove()
    return signals.exit_code()
