"""Pushing an image tarball to a registry over the OCI distribution API (distribution-spec v1.1).

One ``Client`` per repository: ``GET /v2/`` first, answering its challenge (``Basic``: the given
credentials; ``Bearer``: a token from the challenge's realm, fetched with those credentials when
there are any); then per blob ``HEAD`` (the registry has it: skipped) or ``POST`` an upload and
``PUT`` it whole with its digest; then ``PUT`` the manifest under the tag and read back the
digest the registry serves it under. Every refusal is one ``MeshctlError`` naming the registry's
own error code (UNAUTHORIZED, DENIED, ...); transport failures name TLS vs. unreachable.
Credentials and tokens never appear in a message or a log.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import quote, urljoin

import urllib3

from meshctl.core.image.distribution import (
    Challenge,
    Credentials,
    Reference,
    RegistryError,
    config_credentials,
    helper_for,
    hint_for,
    parse_challenges,
    parse_error,
    token_from,
    token_url,
)
from meshctl.core.image.layout import Blob
from meshctl.errors import MeshctlError, UserError
from meshctl.image.oci import Layout

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 300.0  # a registry may take a while to verify a large layer's digest
MANIFEST_ACCEPT = (
    "application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    insecure: bool = False  # plain HTTP (a local registry); TLS otherwise
    ca_file: Path | None = None  # trust this CA bundle instead of the system's
    credentials: Credentials | None = None


@dataclass(frozen=True, slots=True)
class Pushed:
    reference: str
    digest: str  # the manifest's, as the registry serves it
    uploaded: tuple[str, ...]  # blob digests sent
    skipped: tuple[str, ...]  # blob digests the registry had already
    size: int  # bytes sent


class RegistryRefusedError(MeshctlError):
    """The registry answered with an error (its code is in the message)."""

    def __init__(self, error: RegistryError, reference: Reference, what: str) -> None:
        super().__init__(
            f"{reference.registry} refused {what}: {error.line()}",
            hint=hint_for(error, reference),
        )
        self.error = error


def docker_config(path: Path | None = None) -> Mapping[str, object]:
    """The docker client's config.json ($DOCKER_CONFIG, else ~/.docker); {} if there is none."""
    if path is None:
        base = os.environ.get("DOCKER_CONFIG")
        path = (Path(base) if base else Path.home() / ".docker") / "config.json"
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UserError(
            f"cannot read the docker config {path}: {exc}",
            hint="fix or move the file, or pass --username and --password-stdin",
        ) from exc
    return body if isinstance(body, dict) else {}


def stored_credentials(
    reference: Reference, config: Mapping[str, object]
) -> tuple[Credentials | None, str | None]:
    """Credentials for the reference's registry from a docker config, and the credential helper
    that holds them instead when the config names one (meshctl runs no helpers)."""
    try:
        found = config_credentials(config, reference.registry)
    except ValueError as exc:
        raise UserError(f"docker config: {exc}", hint="log in again with docker login") from exc
    return found, None if found else helper_for(config, reference.registry)


class Client:
    """The distribution API of one repository on one registry."""

    def __init__(self, reference: Reference, settings: Settings) -> None:
        self.reference = reference
        self.settings = settings
        scheme = "http" if settings.insecure else "https"
        self.base = f"{scheme}://{reference.api_host}"
        if settings.insecure:
            self.pool = urllib3.PoolManager(retries=False)
        else:
            try:
                context = ssl.create_default_context(
                    cafile=str(settings.ca_file) if settings.ca_file else None
                )
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise UserError(
                    f"--ca-file {settings.ca_file}: not a readable PEM CA bundle ({_reason(exc)})",
                    hint="give the PEM file of the CA that signed the registry's certificate",
                ) from exc
            self.pool = urllib3.PoolManager(retries=False, ssl_context=context)
        self.authorization: str | None = None
        self.timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT, read=READ_TIMEOUT)

    # --- transport ---------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        url: str,
        *,
        body: bytes | IO[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        authorized: bool = True,
    ) -> urllib3.BaseHTTPResponse:
        sent = dict(headers or {})
        if authorized and self.authorization:
            sent["Authorization"] = self.authorization
        try:
            return self.pool.request(
                method,
                url,
                body=body,
                headers=sent,
                timeout=self.timeout,
                redirect=False,
                preload_content=True,
            )
        except urllib3.exceptions.SSLError as exc:
            raise MeshctlError(
                f"TLS with {self.reference.registry} failed: {_reason(exc)}",
                hint="pass --ca-file FILE with the CA that signed the registry's certificate, "
                "or --insecure if it serves plain HTTP (a local registry)",
            ) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise MeshctlError(
                f"cannot reach the registry {self.reference.registry} ({url}): {_reason(exc)}",
                hint="check the registry's address and that it is running"
                + ("" if self.settings.insecure else " (plain HTTP? pass --insecure)"),
            ) from exc

    def _url(self, path: str) -> str:
        return f"{self.base}/v2/{self.reference.repository}/{path}"

    def _refused(self, answer: urllib3.BaseHTTPResponse, what: str) -> RegistryRefusedError:
        return RegistryRefusedError(
            parse_error(answer.status, answer.data, answer.reason or ""), self.reference, what
        )

    # --- auth --------------------------------------------------------------------------------

    def login(self) -> None:
        """``GET /v2/``, answering the registry's challenge once (the spec's version check)."""
        answer = self._send("GET", f"{self.base}/v2/")
        if answer.status == 401:
            self._answer(answer)
            answer = self._send("GET", f"{self.base}/v2/")
        if answer.status != 200:
            raise self._refused(answer, "access to its API")

    def _answer(self, answer: urllib3.BaseHTTPResponse) -> None:
        challenges = parse_challenges(answer.headers.get("WWW-Authenticate", ""))
        by_scheme = {c.scheme: c for c in challenges}
        credentials = self.settings.credentials
        if "bearer" in by_scheme:
            self.authorization = f"Bearer {self._token(by_scheme['bearer'])}"
        elif "basic" in by_scheme:
            if credentials is None:
                raise self._refused(answer, "access without credentials")
            self.authorization = credentials.basic()
        else:
            schemes = ", ".join(c.scheme for c in challenges) or "none"
            raise MeshctlError(
                f"{self.reference.registry} asks for authentication meshctl cannot give "
                f"(challenge schemes: {schemes})",
                hint="use a registry with basic or token authentication",
            )

    def _token(self, challenge: Challenge) -> str:
        try:
            url = token_url(challenge, self.reference.repository)
        except ValueError as exc:
            raise MeshctlError(
                f"{self.reference.registry}: {exc}", hint="check the registry's auth config"
            ) from exc
        credentials = self.settings.credentials
        headers = {"Authorization": credentials.basic()} if credentials else {}
        answer = self._send("GET", url, headers=headers, authorized=False)
        if answer.status != 200:
            raise RegistryRefusedError(
                parse_error(answer.status, answer.data, answer.reason or ""),
                self.reference,
                "a token (its token endpoint)",
            )
        try:
            return token_from(answer.data)
        except ValueError as exc:
            raise MeshctlError(
                f"{self.reference.registry}'s token endpoint: {exc}",
                hint="check the registry's token service",
            ) from exc

    # --- blobs and manifests -----------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        answer = self._send("HEAD", self._url(f"blobs/{digest}"))
        if answer.status == 200:
            return True
        if answer.status == 404:
            return False
        raise self._refused(answer, f"a look at blob {digest[:19]}")

    def upload(self, blob: Blob, stream: IO[bytes]) -> None:
        """A monolithic upload: POST opens the session, PUT sends the bytes with the digest."""
        answer = self._send("POST", self._url("blobs/uploads/"), body=b"")
        if answer.status != 202 or not answer.headers.get("Location"):
            raise self._refused(answer, f"an upload of blob {blob.digest[:19]}")
        location = urljoin(self.base + "/", answer.headers["Location"])
        location += ("&" if "?" in location else "?") + f"digest={quote(blob.digest)}"
        answer = self._send(
            "PUT",
            location,
            body=stream,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(blob.size)},
        )
        if answer.status != 201:
            raise self._refused(answer, f"blob {blob.digest[:19]}")

    def put_manifest(self, tag: str, media_type: str, data: bytes) -> str:
        answer = self._send(
            "PUT", self._url(f"manifests/{tag}"), body=data, headers={"Content-Type": media_type}
        )
        if answer.status != 201:
            raise self._refused(answer, f"the manifest for tag {tag}")
        return answer.headers.get("Docker-Content-Digest", "")

    def manifest_digest(self, tag: str) -> str:
        """The digest the registry serves ``tag`` under (its HEAD's header; "" without one)."""
        answer = self._send(
            "HEAD", self._url(f"manifests/{tag}"), headers={"Accept": MANIFEST_ACCEPT}
        )
        if answer.status != 200:
            raise self._refused(answer, f"a look at the manifest {tag}")
        return answer.headers.get("Docker-Content-Digest", "")

    def manifest(self, tag_or_digest: str) -> tuple[bytes, str, str]:
        """The manifest the registry serves: bytes, digest (its header) and media type."""
        answer = self._send(
            "GET", self._url(f"manifests/{tag_or_digest}"), headers={"Accept": MANIFEST_ACCEPT}
        )
        if answer.status != 200:
            raise self._refused(answer, f"the manifest {tag_or_digest}")
        return (
            answer.data,
            answer.headers.get("Docker-Content-Digest", ""),
            answer.headers.get("Content-Type", ""),
        )


def push(
    layout: Layout,
    reference: Reference,
    settings: Settings,
    say: Callable[[str], None] = lambda _text: None,
) -> Pushed:
    """Every blob the registry lacks, then the manifest under ``reference.tag``; the digest the
    registry then serves the tag under is checked against the archive's."""
    from meshctl.core.image.layout import MEDIA_MANIFEST, sha256

    client = Client(reference, settings)
    client.login()
    parsed = layout.parsed
    uploaded, skipped, size = [], [], 0
    for blob in (*parsed.layers, parsed.config):
        if client.has_blob(blob.digest):
            skipped.append(blob.digest)
            say(f"{blob.digest[:19]}: already there")
            continue
        say(f"{blob.digest[:19]}: pushing {blob.size / 2**20:.1f} MiB")
        client.upload(blob, layout.blob(blob.digest))
        uploaded.append(blob.digest)
        size += blob.size
    expected = sha256(layout.manifest_bytes)
    client.put_manifest(reference.tag, MEDIA_MANIFEST, layout.manifest_bytes)
    size += len(layout.manifest_bytes)
    # HEAD first: Docker Hub does not count it against the pull rate limit; a registry that
    # sends no digest header is asked for the bytes.
    digest = client.manifest_digest(reference.tag)
    if not digest:
        served, header, _ = client.manifest(reference.tag)
        digest = header or sha256(served)
    if digest != expected:
        raise MeshctlError(
            f"{reference.registry} serves {reference.repository}:{reference.tag} as {digest}, "
            f"not the pushed {expected}",
            hint="another push to the same tag raced this one: push again",
        )
    return Pushed(str(reference), digest, tuple(uploaded), tuple(skipped), size)


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    text = str(reason or exc)
    return " ".join(text.split())[:200]
