"""The OCI distribution API's pure parts: references, auth challenges, token requests,
credentials from a docker config, and registry error bodies as one line.

References follow the distribution project's grammar (reference/reference.go): the first path
component names the registry when it has a ``.`` or ``:`` or is ``localhost``, else the registry
is Docker Hub and a one-component name gets ``library/``. Challenges are RFC 7235 section 4.1
``WWW-Authenticate`` values (auth-params with quoted strings, several challenges per header);
the token flow is the distribution spec's token authentication (``realm``, ``service``,
``scope=repository:<name>:pull,push``). Error bodies are the spec's
``{"errors": [{"code", "message", "detail"}]}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"  # where docker.io's distribution API is served
DOCKER_HUB_AUTH_KEY = "https://index.docker.io/v1/"  # its key in a docker config's auths
DEFAULT_TAG = "latest"
MAX_ECHO = 200  # characters of a response body echoed into a message

_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DOMAIN = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.?)+(?::[0-9]+)?$|^\[[0-9a-fA-F:.]+\](?::[0-9]+)?$"
)


class BadReferenceError(ValueError):
    """Not an image reference this code can push to."""


@dataclass(frozen=True, slots=True)
class Reference:
    registry: str  # host[:port] as written (docker.io for Docker Hub)
    repository: str  # path on the registry, e.g. team/meshctl
    tag: str

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}:{self.tag}"


def parse_reference(text: str) -> Reference:
    """``[REGISTRY/]REPO[:TAG]`` as a Reference; ``BadReferenceError`` saying what is wrong."""
    if not text or text != text.strip() or "@" in text:
        raise BadReferenceError(
            f"{text!r} is not an image reference REGISTRY/REPOSITORY:TAG (not a digest)"
        )
    name, tag = text, DEFAULT_TAG
    slash = text.rfind("/")
    colon = text.rfind(":")
    if colon > slash:
        name, tag = text[:colon], text[colon + 1 :]
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
        if not _DOMAIN.match(registry):
            raise BadReferenceError(f"{registry!r} in {text!r} is not a registry host[:port]")
    else:
        registry, path = DOCKER_HUB, name
        if "/" not in path:
            path = f"library/{path}"
    if not path or not all(_COMPONENT.match(c) for c in path.split("/")):
        raise BadReferenceError(
            f"{path!r} in {text!r} is not a repository name "
            "(lowercase letters, digits and . _ - between them, / between components)"
        )
    if not _TAG.match(tag):
        raise BadReferenceError(f"{tag!r} in {text!r} is not a tag (up to 128 of A-Za-z0-9_.-)")
    return Reference(registry, path, tag)


@dataclass(frozen=True, slots=True)
class Challenge:
    scheme: str  # lowercased: "basic" or "bearer" (others are reported, not answered)
    params: Mapping[str, str]  # names lowercased


_TCHARS = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_PARAM = re.compile(rf"\s*({_TCHARS})\s*=\s*(?:\"((?:[^\"\\]|\\.)*)\"|({_TCHARS}))\s*")


def parse_challenges(header: str) -> list[Challenge]:
    """Every challenge in a ``WWW-Authenticate`` value, in order; a malformed tail is ignored
    (what was parsed before it still counts)."""
    found: list[Challenge] = []
    rest = header.strip()
    while rest:
        scheme_match = re.match(rf"\s*({_TCHARS})(?:\s+|$)", rest)
        if not scheme_match:
            break
        scheme = scheme_match.group(1).lower()
        rest = rest[scheme_match.end() :]
        params: dict[str, str] = {}
        while True:
            param = _PARAM.match(rest)
            # A token followed by whitespace and not "=" starts the next challenge.
            if not param:
                break
            quoted, plain = param.group(2), param.group(3)
            value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else plain
            params[param.group(1).lower()] = value or ""
            rest = rest[param.end() :]
            if rest.startswith(","):
                rest = rest[1:]
                continue
            break
        found.append(Challenge(scheme, params))
        rest = rest.lstrip(" ,")
    return found


def token_url(challenge: Challenge, repository: str) -> str:
    """The token endpoint's URL for push and pull access to ``repository``."""
    realm = challenge.params.get("realm", "")
    if not realm.startswith(("https://", "http://")):
        raise ValueError(f"the registry's token realm {realm!r} is not an http(s) URL")
    query: list[tuple[str, str]] = []
    if challenge.params.get("service"):
        query.append(("service", challenge.params["service"]))
    ours = f"repository:{repository}:pull,push"
    given = challenge.params.get("scope", "")
    for scope in dict.fromkeys([*(s for s in given.split(" ") if s), ours]):
        query.append(("scope", scope))
    return realm + ("&" if "?" in realm else "?") + urlencode(query)


def token_from(body: bytes) -> str:
    """The bearer token in a token endpoint's answer (``token``, or OAuth2's ``access_token``)."""
    try:
        answer = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"the token endpoint answered no JSON: {_echo(body)}") from exc
    token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) else None
    if not isinstance(token, str) or not token:
        raise ValueError("the token endpoint's answer holds no token")
    return token


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str = ""

    def basic(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()

    def __repr__(self) -> str:  # never print a password
        return f"Credentials(username={self.username!r}, password=<hidden>)"


def _auth_keys(registry: str) -> list[str]:
    if registry == DOCKER_HUB:
        return [DOCKER_HUB_AUTH_KEY, "index.docker.io", "docker.io", "registry-1.docker.io"]
    return [registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v1/"]


def config_credentials(config: Mapping[str, object], registry: str) -> Credentials | None:
    """The credentials a docker ``config.json`` stores for ``registry`` in ``auths`` (the base64
    ``auth`` field, or ``username``/``password``); None when it has none for it."""
    auths = config.get("auths")
    if not isinstance(auths, Mapping):
        return None
    for key in _auth_keys(registry):
        entry = auths.get(key)
        if not isinstance(entry, Mapping):
            continue
        encoded = entry.get("auth")
        if isinstance(encoded, str) and encoded:
            try:
                user, sep, password = (
                    base64.b64decode(encoded, validate=True).decode().partition(":")
                )
            except (binascii.Error, UnicodeDecodeError) as exc:
                raise ValueError(
                    f"the auth entry for {key} is not base64 of user:password"
                ) from exc
            if sep:
                return Credentials(user, password)
        name, secret = entry.get("username"), entry.get("password")
        if isinstance(name, str) and isinstance(secret, str) and name:
            return Credentials(name, secret)
    return None


def helper_for(config: Mapping[str, object], registry: str) -> str | None:
    """The credential helper a docker config names for ``registry`` (credHelpers, credsStore):
    meshctl does not run helpers, but says so when one holds the credentials."""
    helpers = config.get("credHelpers")
    if isinstance(helpers, Mapping):
        for key in _auth_keys(registry):
            if isinstance(helpers.get(key), str):
                return str(helpers[key])
    store = config.get("credsStore")
    return store if isinstance(store, str) and store else None


@dataclass(frozen=True, slots=True)
class RegistryError:
    """A registry's refusal, as its error body names it."""

    status: int
    code: str  # the spec's error code (UNAUTHORIZED, DENIED, NAME_UNKNOWN...) or HTTP_<status>
    message: str

    def line(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code


def parse_error(status: int, body: bytes, reason: str = "") -> RegistryError:
    """The first error of a distribution error body; an HTTP_<status> error for anything else."""
    try:
        answer = json.loads(body) if body else None
    except ValueError:
        answer = None
    errors = answer.get("errors") if isinstance(answer, dict) else None
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        first = errors[0]
        code = str(first.get("code") or f"HTTP_{status}")
        message = str(first.get("message") or "")
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return RegistryError(status, code, _one_line(message) + more)
    text = _echo(body) if body else ""
    return RegistryError(status, f"HTTP_{status}", " ".join(filter(None, [reason, text])))


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MAX_ECHO]


def _echo(body: bytes) -> str:
    text = _one_line(body.decode("utf-8", "replace"))
    return text + ("…" if len(body) > MAX_ECHO else "")


def hint_for(error: RegistryError, reference: Reference) -> str:
    """What to do about a registry's refusal, by its error code."""
    login = (
        "log in: --username USER --password-stdin, or an auths entry for "
        f"{reference.registry} in ~/.docker/config.json"
    )
    hints = {
        "UNAUTHORIZED": login,
        "DENIED": f"these credentials may not push to {reference.repository}: "
        "ask the registry's admin for push access, or push to a repository you own",
        "NAME_INVALID": "the registry refuses this repository name: choose another",
        "NAME_UNKNOWN": f"create the repository {reference.repository} on the registry first "
        "(some registries do not create repositories on push)",
        "TOOMANYREQUESTS": "the registry rate-limits you: wait and retry, or log in",
        "UNSUPPORTED": "the registry does not support this operation (an OCI image manifest)",
        "MANIFEST_INVALID": "the registry refuses the image's manifest: check the archive "
        "(meshctl image build writes a valid one)",
        "MANIFEST_BLOB_UNKNOWN": "a layer did not reach the registry: push again",
    }
    if error.code in hints:
        return hints[error.code]
    if error.status == 401:
        return login
    return f"see the registry's logs for {reference.registry}"
