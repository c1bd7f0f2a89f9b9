"""The component registry: what each plugin contributes to install and verify, as data.

A ``Component`` is a plugin's part of the mesh: its values type (one frozen dataclass of
``values.value(...)`` fields, its schema under ``components.<name>``), the profiles that enable
it (with its values there), a pure function from the install's values and its own to its
Kubernetes objects, and its verify checks. Plugins publish them in the ``meshctl.components``
entry-point group; install and verify work on a ``Registry`` and never name a component
themselves. Invariants: names are unique; a profile is known only when some component names it;
every component has ``enabled`` in its schema (set by profiles and users); text (``--set``,
files) is parsed once at the edge, and everything past ``Registry.resolve`` is typed ``Values``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from meshctl.core.k8s import layout
from meshctl.core.k8s.image import DEFAULT_PULL_POLICY, PULL_POLICIES, default_image
from meshctl.core.k8s.install import values as v
from meshctl.core.k8s.install.checks import Check
from meshctl.core.mesh.records import DEFAULT_TRUST_DOMAIN
from meshctl.errors import ConfigError
from meshctl.structured import Json

# A Kubernetes object as a component renders it (read-only JSON; install stamps a copy).
Object = Mapping[str, object]
V = TypeVar("V")

# Istio's profiles, described for the confirmation prompt and --help.
PROFILE_HELP = {
    "default": "control plane, CNI node agent and sidecar injection",
    "ambient": "the default profile plus the node proxy (ambient enrollment)",
    "minimal": "the control plane only",
    "demo": "the default profile plus an ingress gateway",
    "ambient-istiod": "only the ambient data plane (CNI node agent, node proxy) for an istiod",
}
DEFAULT_PROFILE = "default"
DEFAULT_REVISION = layout.DEFAULT_REVISION


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


@dataclass(frozen=True, slots=True, kw_only=True)
class InstallValues:
    """The install's own values (top-level keys; every component reads them)."""

    profile: str = v.value(DEFAULT_PROFILE, help="the profile the values start from")
    revision: str = v.value(
        DEFAULT_REVISION,
        help="names every revisioned object and the webhook's selectors (istio.io/rev)",
        check=v.dns_label,
    )
    namespace: str = v.value(
        layout.MESH_NAMESPACE, help="where the mesh's namespaced objects live", check=v.dns_label
    )
    image: str = v.value(
        factory=default_image,
        help="the meshctl image every component runs (registry/name:tag)",
        check=_image_reference,
    )
    # "" (a stand-alone manifest only): the cluster's default for the image's tag.
    image_pull_policy: str = v.value(
        DEFAULT_PULL_POLICY, help="Always, IfNotPresent or Never", choices=PULL_POLICIES
    )
    trust_domain: str = v.value(
        DEFAULT_TRUST_DOMAIN,
        help="the SPIFFE trust domain of workload identities",
        check=_trust_domain,
    )


def standalone(namespace: str, image: str | None) -> InstallValues:
    """The install values a stand-alone manifest (``meshctl cni|controlplane|ztunnel manifest``)
    renders with: the defaults, ``namespace``, ``image`` (None: this version's), and no image pull
    policy (the cluster's default for the image's tag)."""
    chosen = InstallValues(namespace=namespace, image_pull_policy="")
    return dataclasses.replace(chosen, image=image) if image else chosen


@dataclass(frozen=True, slots=True)
class NoValues:
    """The values type of a component with no values of its own (only ``enabled``)."""


@dataclass(frozen=True, slots=True)
class Values:
    """Validated install values: the install's own, and every component's values type (enabled
    or not), read by components' render functions and checks."""

    install: InstallValues
    components: Mapping[str, object]  # component name -> its values type's instance
    enabled_components: frozenset[str]

    @property
    def profile(self) -> str:
        return self.install.profile

    @property
    def revision(self) -> str:
        return self.install.revision

    @property
    def namespace(self) -> str:
        return self.install.namespace

    @property
    def image(self) -> str:
        return self.install.image

    @property
    def image_pull_policy(self) -> str:
        return self.install.image_pull_policy

    @property
    def trust_domain(self) -> str:
        return self.install.trust_domain

    @property
    def control_plane_address(self) -> str:
        """Where this revision's proxies find their CA and discovery."""
        return layout.control_plane_address(self.namespace, self.revision)

    def own(self, name: str, kind: type[V]) -> V:
        """Component ``name``'s values, of its values type ``kind``."""
        found = self.components[name]
        if not isinstance(found, kind):
            raise TypeError(f"component {name}'s values are a {type(found).__name__}")
        return found

    def enabled(self, name: str) -> bool:
        """Whether component ``name`` is part of this install (False when no such component)."""
        return name in self.enabled_components

    def revisioned(self, base: str) -> str:
        """``base`` for the default revision, ``base-<revision>`` otherwise (Istio's naming)."""
        return layout.revisioned(base, self.revision)

    def with_enabled(self, names: Iterable[str]) -> Values:
        """The same values with exactly the components ``names`` enabled."""
        return dataclasses.replace(self, enabled_components=frozenset(names))

    def data(self) -> dict[str, Json]:
        """As values data (every key, as a values file writes them)."""
        return {
            **v.to_data(self.install),
            "components": {
                name: {"enabled": name in self.enabled_components, **v.to_data(own)}
                for name, own in self.components.items()
            },
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Made:
    """Objects a component's processes make at run time (not in its manifest, so without the
    install's labels) that uninstall removes with the component: those of ``kind`` matching
    both selectors, in every namespace."""

    api_version: str
    kind: str
    label_selector: str
    field_selector: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Component(Generic[V]):
    """One plugin's contribution to install and verify."""

    name: str  # its key under components.<name> and its install.meshctl.io/component label
    title: str  # one line in install's progress display ("Control plane")
    # Apply order between components (lower first); objects within one go in kind order.
    phase: int
    # Revisioned components are installed once per revision (names carry the revision);
    # shared ones once per cluster and removed with the last revision.
    revisioned: bool
    values_type: type[V]  # its values, without ``enabled`` (added here); NoValues for none
    profiles: Mapping[str, V]  # the profiles that enable it -> its values there
    render: Callable[[Values, V], Sequence[Object]]
    checks: Sequence[Check] = field(default_factory=tuple)
    made: Callable[[Values, V], Sequence[Made]] | None = None  # what uninstall also removes

    def full_schema(self) -> v.Schema:
        enabled = v.Field(kind="bool", default=False, help=f"install the {self.title.lower()}")
        return {"enabled": enabled, **v.schema_of(self.values_type)}

    def objects(self, values: Values) -> Sequence[Object]:
        """Its objects for ``values``, rendered from its own values."""
        return self.render(values, values.own(self.name, self.values_type))

    def made_objects(self, values: Values) -> Sequence[Made]:
        """What its processes make that uninstall removes with it (see ``Made``)."""
        if self.made is None:
            return ()
        return self.made(values, values.own(self.name, self.values_type))


def global_schema() -> v.Schema:
    """The install's own values (every component reads them)."""
    return v.schema_of(InstallValues)


class Registry:
    """The installed components, by name, in apply order."""

    def __init__(self, components: Iterable[Component[Any]]) -> None:
        ordered = sorted(components, key=lambda c: (c.phase, c.name))
        names = [c.name for c in ordered]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(
                f"two installed components are named {dupes[0]!r}",
                hint="uninstall one of the distributions that provide it",
            )
        self.components: tuple[Component[Any], ...] = tuple(ordered)
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

    def profile_overlay(self, profile: str, source: str) -> dict[str, Json]:
        known = self.profiles()
        if profile not in known:
            raise ConfigError(
                f"{source}: unknown profile {profile!r}",
                hint=f"profiles of the installed components: {', '.join(known) or 'none'}",
            )
        return {
            "profile": profile,
            "components": {
                c.name: {"enabled": True, **v.to_data(c.profiles[profile])}
                for c in self.components
                if profile in c.profiles
            },
        }

    def resolve(
        self,
        *,
        profile: str | None,
        files: Sequence[tuple[str, object]] = (),
        assignments: Sequence[str] = (),
        revision: str | None = None,
        namespace: str | None = None,
    ) -> Values:
        """Values from defaults < profile < files (name, parsed YAML) < --set < ``revision`` and
        ``namespace`` (the flags, None when not given)."""
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
        for key, given in (("revision", revision), ("namespace", namespace)):
            if given is not None:
                overlay = {key: given}
                data = v.merge(data, self._checked(schema, overlay, f"--{key} {given}"))
        if chosen is not None:
            data["profile"] = chosen
        return self._typed(v.validate(schema, data, "install values"))

    def _typed(self, data: Mapping[str, Json]) -> Values:
        """Validated ``data`` as ``Values``: each component's section as its values type."""
        sections = _mapping(data["components"])
        own: dict[str, object] = {}
        enabled = set()
        for c in self.components:
            section = _mapping(sections[c.name])
            own[c.name] = v.from_data(c.values_type, section)
            if section["enabled"]:
                enabled.add(c.name)
        return Values(v.from_data(InstallValues, data), own, frozenset(enabled))

    @staticmethod
    def _checked(schema: v.Schema, overlay: Mapping[str, Json], source: str) -> Mapping[str, Json]:
        """``overlay`` validated on its own (over the defaults), so an error names its source."""
        v.validate(schema, v.merge(v.defaults(schema), overlay), source)
        return overlay

    def enabled(self, values: Values) -> list[Component[Any]]:
        return [c for c in self.components if values.enabled(c.name)]


def _mapping(value: Json) -> Mapping[str, Json]:
    if not isinstance(value, Mapping):  # validated against the schema: a section is a mapping
        raise TypeError(f"expected a values section, got {type(value).__name__}")
    return value
