"""What the supervisor feeds the data plane: certificates from ``--cert-dir`` and the local config.

Owns reading and validating both sources, and noticing when they change (by content, polled), so
a rotation or an edited local config reaches the data plane without a restart (the local config
goes into the proxy's one store, beside discovery: ``workload_feed.WorkloadFeed``). Invariants: a
source that fails validation at start is a ``UserError`` with a hint; one that fails on reload
is logged and the previous good state stays in force; PEM bytes are never logged; the X.509
library is imported only to read certificates (the lean supervisor starts from certificates
checked before it, and loads it only when they change).
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

from meshctl import inputs, yamlread
from meshctl.core.mesh.localconfig import (
    LocalConfig,
    local_config_warnings,
    parse_local_config,
)
from meshctl.core.mesh.records import LocalConfigError
from meshctl.core.pki.identity import (
    CERT_CHAIN_FILE,
    KEY_FILE,
    ROOT_CERT_FILE,
    IdentityError,
    SpiffeId,
    check_validity,
    peer_identity,
)
from meshctl.core.wire import channel
from meshctl.errors import UserError
from meshctl.process import Feed
from meshctl.structured import InputError

if TYPE_CHECKING:
    from meshctl.core.wire.dump import CertificateFacts

log = logging.getLogger(__name__)


def read_certs(cert_dir: Path, identity: SpiffeId, generation: int) -> channel.Certs:
    """Load and check ``cert-chain.pem``, ``key.pem`` and ``root-cert.pem`` from ``cert_dir``."""
    names = (CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE)
    limits = inputs.limits()
    try:
        chain, key, roots = (
            inputs.read_text(cert_dir / n, str(cert_dir / n), limits) for n in names
        )
    except OSError as exc:
        raise UserError(
            f"cannot read workload certificates in {cert_dir}: {exc.strerror or exc}",
            hint=f"create them with 'meshctl ztunnel certs --out {cert_dir} --workload ...'",
        ) from exc
    except InputError as exc:  # not text (binary, not UTF-8), or over the size limit
        raise UserError(
            f"workload certificate in {cert_dir} is unusable: a file there is not PEM text "
            f"({exc.message})",
            hint=f"mint one for {identity} with 'meshctl ztunnel certs'",
        ) from exc
    try:
        return certs_message(chain, key, roots, identity, generation)
    except (IdentityError, ValueError) as exc:
        raise UserError(
            f"workload certificate in {cert_dir} is unusable: {exc}",
            hint=f"mint one for {identity} with 'meshctl ztunnel certs'",
        ) from exc


def certs_message(
    chain: str, key: str, roots: str, identity: SpiffeId, generation: int, *, named: bool = False
) -> channel.Certs:
    """The checked ``Certs`` for ``identity`` (``named``: node mode's, which says whose); raises
    ``IdentityError``/``ValueError`` when the PEMs do not make a usable certificate for it."""
    _check_certs(chain, key, roots, identity)
    return channel.Certs(
        identity=str(identity) if named else "",
        cert_chain=chain,
        key=key,
        roots=roots,
        generation=generation,
        chain_facts=cert_facts(chain),
        root_facts=cert_facts(roots),
    )


def cert_facts(pem: str) -> tuple[CertificateFacts, ...]:
    from meshctl.core.pki import certs as certs_mod

    return tuple(
        channel.certificate_facts(
            f.serial, f.not_before.isoformat(), f.not_after.isoformat(), list(f.uri_sans)
        )
        for f in certs_mod.describe(pem.encode())
    )


def _check_certs(chain: str, key: str, roots: str, identity: SpiffeId) -> None:
    from meshctl.core.pki import certs as certs_mod

    problem = certs_mod.pair_problem(chain.encode(), key.encode())
    if problem is not None:
        where, reason = problem
        if where == "pair":
            raise IdentityError(f"{KEY_FILE} is not the key of the leaf certificate")
        raise IdentityError(f"{CERT_CHAIN_FILE if where == 'cert' else KEY_FILE} {reason}")
    facts = certs_mod.describe(chain.encode())
    try:
        has_roots = bool(certs_mod.describe(roots.encode()))
    except ValueError:
        has_roots = False
    if not has_roots:
        raise IdentityError(f"{ROOT_CERT_FILE} holds no PEM certificate")
    check_validity(facts[0].not_before, facts[0].not_after, datetime.now(UTC))
    peer_identity(facts[0].uri_sans, trust_domain=identity.trust_domain, expected=[identity])


def read_local_config(path: Path | None, *, warn: bool = True) -> LocalConfig:
    """The local-config document (validated), or an empty one without ``--local-config``.

    ``warn``: log what ztunnel would read differently (once per reading that is used).
    """
    if path is None:
        return {}
    try:
        limits = inputs.limits()
        doc = yamlread.load_yaml(inputs.read_bytes(path, str(path), limits), str(path), limits)
    except OSError as exc:
        raise UserError(
            f"cannot read local config {path}: {exc.strerror or exc}", hint="fix --local-config"
        ) from exc
    except InputError as exc:
        raise UserError(exc.message, hint=exc.hint) from exc
    doc = doc or {}
    try:
        parse_local_config(doc)
    except LocalConfigError as exc:
        raise UserError(
            f"local config {path}: {exc}",
            hint="the fields are ztunnel's local config (camelCase); see docs/ztunnel.md",
        ) from exc
    if not isinstance(doc, dict):
        raise UserError(f"local config {path} must be a mapping", hint="see docs/ztunnel.md")
    for warning in local_config_warnings(doc) if warn else ():  # accepted, read otherwise
        log.warning("local config %s: %s", path, warning)
    return cast(LocalConfig, doc)  # parse_local_config accepted it just above


def certificate_digest(cert_dir: Path) -> str:
    """What ``FileFeed`` compares to notice a change of the certificate files in ``cert_dir``."""
    return _digest(*(cert_dir / n for n in (CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE)))


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        try:
            h.update(p.read_bytes())
        except OSError:
            h.update(b"\0missing")
    return h.hexdigest()


class LocalConfigSource:
    """The workloads of ``--local-config`` (or none), re-read when the file's content changes.

    ``warn``: log what ztunnel reads differently in the first reading (off for a check whose
    source is built again, so each warning is logged once).
    """

    def __init__(self, path: Path | None, *, warn: bool = True) -> None:
        self.path = path
        doc = read_local_config(path, warn=warn)
        self.workloads = channel.Workloads(document=doc, generation=0)
        self._digest = _digest(path) if path else ""

    def changes(self) -> list[channel.Message]:
        if self.path is None:
            return []
        digest = _digest(self.path)
        if digest == self._digest:
            return []
        self._digest = digest
        try:
            doc = read_local_config(self.path)
        except UserError as exc:
            log.error("local config reload skipped: %s", exc.message)  # noqa: TRY400
            return []
        self.workloads = channel.Workloads(document=doc, generation=self.workloads.generation + 1)
        log.info("local config changed; generation %d", self.workloads.generation)
        return [self.workloads]


class FileFeed(Feed):
    """Certificates and workloads from files, re-sent when their content changes."""

    def __init__(
        self,
        *,
        cert_dir: Path,
        local_config: Path | None,
        identity: SpiffeId,
        certs: tuple[channel.Certs, str] | None = None,
        warn: bool = True,
    ) -> None:
        """Read and check both sources; ``certs``: the certificates as already read and checked
        from ``cert_dir`` with the files' digest then (by the process this one was exec'd from:
        a change in between is then still noticed); ``warn`` as ``LocalConfigSource``'s."""
        self.cert_dir = cert_dir
        self.identity = identity
        self._cert_files = [cert_dir / n for n in (CERT_CHAIN_FILE, KEY_FILE, ROOT_CERT_FILE)]
        if certs is None:
            self._cert_digest = _digest(*self._cert_files)  # before reading: a change is seen
            self.certs = read_certs(cert_dir, identity, 0)
        else:
            self.certs, self._cert_digest = certs
        self.config = LocalConfigSource(local_config, warn=warn)

    @property
    def workloads(self) -> channel.Workloads:
        return self.config.workloads

    def current(self) -> list[channel.Message]:
        return [self.certs, channel.CertSource(source="files"), self.workloads]

    def changes(self) -> list[channel.Message]:
        out: list[channel.Message] = []
        digest = _digest(*self._cert_files)
        if digest != self._cert_digest:
            self._cert_digest = digest
            try:
                self.certs = read_certs(self.cert_dir, self.identity, self.certs.generation + 1)
            except UserError as exc:
                log.error("certificate reload skipped: %s", exc.message)  # noqa: TRY400
            else:
                log.info("certificates changed; generation %d", self.certs.generation)
                out.append(self.certs)
        return out + self.config.changes()


def has_cert_files(cert_dir: Path) -> bool:
    """Whether ``cert_dir`` holds mounted certificates (which win over a CA, as in Istio)."""
    return (cert_dir / CERT_CHAIN_FILE).is_file()
