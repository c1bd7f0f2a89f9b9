"""The component registry: what each plugin contributes to install and verify, as data.

A ``Component`` is a plugin's part of the mesh: its values (a schema under
``components.<name>``), the profiles that enable it, a pure function from the install's values
to its Kubernetes objects, and its verify checks. Plugins publish them in the
``meshctl.components`` entry-point group; install and verify work on a ``Registry`` and never name
a component themselves. Invariants: names are unique; a profile is known only when some
component names it; every component has ``enabled`` in its schema (set by profiles and users).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshctl.core.k8s.image import default_image
from meshctl.core.k8s.install import values as v
from meshctl.core.k8s.install.checks import Check
from meshctl.errors import ConfigError

Object = dict[str, Any]

# Istio's profiles, described for the confirmation prompt and --help.
PROFILE_HELP = {
    "default": "control plane, CNI node agent and sidecar injection",
    "ambient": "the default profile plus the node proxy (ambient enrollment)",
    "minimal": "the control plane only",
    "demo": "the default profile plus an ingress gateway",
}
DEFAULT_PROFILE = "default"
DEFAULT_REVISION = "default"


@dataclass(frozen=True, slots=True)
class Values:
    """Validated install values (every key present), read by components' render functions."""

    data: Mapping[str, Any]

    def get(self, path: str) -> Any:
        return v.lookup(self.data, path)

    @property
    def profile(self) -> str:
        return str(self.data["profile"])

    @property
    def revision(self) -> str:
        return str(self.data["revision"])

    @property
    def namespace(self) -> str:
        return str(self.data["namespace"])

    @property
    def image(self) -> str:
        return str(self.data["image"])

    @property
    def image_pull_policy(self) -> str:
        return str(self.data["imagePullPolicy"])

    @property
    def trust_domain(self) -> str:
        return str(self.data["trustDomain"])

    def component(self, name: str) -> Mapping[str, Any]:
        section: Mapping[str, Any] = self.data["components"][name]
        return section

    def enabled(self, name: str) -> bool:
        """Whether component ``name`` is part of this install (False when no such component)."""
        section = self.data["components"].get(name)
        return bool(section and section.get("enabled"))

    def revisioned(self, base: str) -> str:
        """``base`` for the default revision, ``base-<revision>`` otherwise (Istio's naming)."""
        return base if self.revision == DEFAULT_REVISION else f"{base}-{self.revision}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Component:
    """One plugin's contribution to install and verify."""

    name: str  # its key under components.<name> and its install.meshctl.io/component label
    title: str  # one line in install's progress display ("Control plane")
    # Apply order between components (lower first); objects within one go in kind order.
    phase: int
    # Revisioned components are installed once per revision (names carry the revision);
    # shared ones once per cluster and removed with the last revision.
    revisioned: bool
    schema: v.Schema  # its values, without ``enabled`` (added here)
    profiles: Mapping[str, Mapping[str, Any]]  # profile -> its values there (enabled: True...)
    render: Callable[[Values], list[Object]]
    checks: Sequence[Check] = field(default_factory=tuple)

    def full_schema(self) -> v.Schema:
        enabled = v.Field(kind="bool", default=False, help=f"install the {self.title.lower()}")
        return {"enabled": enabled, **self.schema}


def global_schema() -> v.Schema:
    """The install's own values (every component reads them)."""
    return {
        "profile": v.Field(
            kind="string", default=DEFAULT_PROFILE, help="the profile the values start from"
        ),
        "revision": v.Field(
            kind="string",
            default=DEFAULT_REVISION,
            help="names every revisioned object and the webhook's selectors (istio.io/rev)",
            check=v.dns_label,
        ),
        "namespace": v.Field(
            kind="string",
            default="meshctl-system",
            help="where the mesh's namespaced objects live",
            check=v.dns_label,
        ),
        "image": v.Field(
            kind="string",
            default=default_image(),
            help="the meshctl image every component runs (registry/name:tag)",
            check=_image_reference,
        ),
        "imagePullPolicy": v.Field(
            kind="string",
            default="IfNotPresent",
            help="Always, IfNotPresent or Never",
            choices=("Always", "IfNotPresent", "Never"),
        ),
        "trustDomain": v.Field(
            kind="string",
            default="cluster.local",
            help="the SPIFFE trust domain of workload identities",
            check=_trust_domain,
        ),
    }


def _image_reference(value: str) -> str | None:
    if not value or any(c.isspace() for c in value) or value != value.strip("/:@"):
        return "is not an image reference (e.g. registry.example/meshctl:1.0)"
    return None


def _trust_domain(value: str) -> str | None:
    if value and all(
        part and all(c.isalnum() or c in "-_" for c in part) for part in value.split(".")
    ):
        return None
    return "is not a trust domain (dot-separated names, e.g. cluster.local)"


class Registry:
    """The installed components, by name, in apply order."""

    def __init__(self, components: Iterable[Component]) -> None:
        ordered = sorted(components, key=lambda c: (c.phase, c.name))
        names = [c.name for c in ordered]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(
                f"two installed components are named {dupes[0]!r}",
                hint="uninstall one of the distributions that provide it",
            )
        self.components: tuple[Component, ...] = tuple(ordered)
        self.by_name = {c.name: c for c in ordered}

    def schema(self) -> v.Schema:
        return {
            **global_schema(),
            "components": {c.name: c.full_schema() for c in self.components},
        }

    def profiles(self) -> list[str]:
        """Every profile some component names, the default first."""
        named = {p for c in self.components for p in c.profiles}
        return sorted(named, key=lambda p: (p != DEFAULT_PROFILE, p))

    def profile_overlay(self, profile: str, source: str) -> dict[str, Any]:
        known = self.profiles()
        if profile not in known:
            raise ConfigError(
                f"{source}: unknown profile {profile!r}",
                hint=f"profiles of the installed components: {', '.join(known) or 'none'}",
            )
        return {
            "profile": profile,
            "components": {
                c.name: dict(c.profiles[profile]) for c in self.components if profile in c.profiles
            },
        }

    def resolve(
        self,
        *,
        profile: str | None,
        files: Sequence[tuple[str, Any]] = (),
        assignments: Sequence[str] = (),
        flags: Mapping[str, Any] | None = None,
    ) -> Values:
        """Values from defaults < profile < files (name, parsed YAML) < --set < flags."""
        schema = self.schema()
        # The profile comes from the flag, else the last file naming one, else the default.
        chosen, source = profile, "--profile"
        if chosen is None:
            for name, data in files:
                if isinstance(data, Mapping) and "profile" in data:
                    chosen, source = data["profile"], f"{name}: profile"
        if chosen is not None and not isinstance(chosen, str):
            raise ConfigError(f"{source}: expected a profile name, got {chosen!r}")
        data = v.merge(v.defaults(schema), self.profile_overlay(chosen or DEFAULT_PROFILE, source))
        for name, loaded in files:
            if loaded is None:
                continue
            if not isinstance(loaded, Mapping):
                raise ConfigError(
                    f"{name}: the values must be a mapping, not a {type(loaded).__name__}",
                    hint="write 'key: value' lines, e.g. 'revision: canary'",
                )
            data = v.merge(data, self._checked(schema, loaded, name))
        for text in assignments:
            overlay = v.parse_assignment(text, schema)
            data = v.merge(data, self._checked(schema, overlay, f"--set {text}"))
        for key, value in (flags or {}).items():
            if value is not None:
                flag = f"--{key} {value}"
                overlay = v.parse_assignment(f"{key}={value}", schema, flag)
                data = v.merge(data, self._checked(schema, overlay, flag))
        if chosen is not None:
            data["profile"] = chosen
        return Values(v.validate(schema, data, "install values"))

    @staticmethod
    def _checked(schema: v.Schema, overlay: Mapping[str, Any], source: str) -> Mapping[str, Any]:
        """``overlay`` validated on its own (over the defaults), so an error names its source."""
        v.validate(schema, v.merge(v.defaults(schema), overlay), source)
        return overlay

    def enabled(self, values: Values) -> list[Component]:
        return [c for c in self.components if values.enabled(c.name)]
