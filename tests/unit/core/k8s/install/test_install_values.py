"""Install values: profiles, --set typing, files, and refusals that name the key's path."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from meshctl.core.k8s.install import values as v
from meshctl.core.k8s.install.components import Component, NoValues, Registry
from meshctl.errors import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaneValues:
    replicas: int = v.value(2, minimum=1, help="replicas")
    dirs: tuple[str, ...] = v.value(("a",), check=v.dns_label)
    debug: bool = v.value(False)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeValues:
    bin_dir: str = v.value("/opt/cni/bin")


def component(name: str, values_type: type, profiles: dict) -> Component:
    return Component(
        name=name,
        title=name.title(),
        phase=10,
        revisioned=True,
        values_type=values_type,
        profiles=profiles,
        render=lambda values, own: [],
    )


@pytest.fixture
def registry() -> Registry:
    return Registry(
        [
            component(
                "plane",
                PlaneValues,
                {"default": PlaneValues(), "minimal": PlaneValues(replicas=1)},
            ),
            component("node", NodeValues, {"default": NodeValues()}),
        ]
    )


def test_profiles_come_from_the_components_default_first(registry):
    assert registry.profiles() == ["default", "minimal"]
    assert registry.resolve(profile=None).enabled("node")
    minimal = registry.resolve(profile="minimal")
    assert not minimal.enabled("node")
    assert minimal.own("plane", PlaneValues).replicas == 1


def test_a_values_type_is_its_schema_with_camel_case_keys_and_its_defaults():
    schema = v.schema_of(PlaneValues)
    assert list(schema) == ["replicas", "dirs", "debug"]
    assert (schema["replicas"].kind, schema["replicas"].default) == ("int", 2)
    assert (schema["dirs"].kind, schema["dirs"].default) == ("strings", ["a"])
    assert v.schema_of(NodeValues)["binDir"].default == "/opt/cni/bin"
    assert v.from_data(NodeValues, {"binDir": "/x"}) == NodeValues(bin_dir="/x")
    assert v.to_data(PlaneValues(dirs=("b", "c"))) == {
        "replicas": 2,
        "dirs": ["b", "c"],
        "debug": False,
    }


def test_a_values_field_of_another_type_is_refused():
    @dataclass(frozen=True)
    class Odd:
        ratio: float = v.value(0.5)

    with pytest.raises(TypeError, match=r"Odd\.ratio"):
        v.schema_of(Odd)


def test_values_are_typed_objects_past_resolve(registry):
    values = registry.resolve(profile=None, assignments=["components.plane.dirs=x,y"])
    plane = values.own("plane", PlaneValues)
    assert plane == PlaneValues(dirs=("x", "y"))
    with pytest.raises(TypeError, match="component node's values are a NodeValues"):
        values.own("node", PlaneValues)
    everything = values.with_enabled(["plane"])
    assert (everything.enabled("plane"), everything.enabled("node")) == (True, False)
    assert everything.data()["components"] == {
        "plane": {"enabled": True, "replicas": 2, "dirs": ["x", "y"], "debug": False},
        "node": {"enabled": False, "binDir": "/opt/cni/bin"},
    }


def test_the_namespace_flag_is_checked_as_a_value_naming_the_flag(registry):
    assert registry.resolve(profile=None, namespace="mesh").namespace == "mesh"
    with pytest.raises(ConfigError, match=re.escape("--namespace Mesh: namespace: 'Mesh' must")):
        registry.resolve(profile=None, namespace="Mesh")


def test_a_component_without_values_has_only_enabled():
    crds = component("crds", NoValues, {"default": NoValues()})
    assert list(crds.full_schema()) == ["enabled"]


def test_set_types_values_by_the_schema_and_later_sources_win(registry, tmp_path):
    values = registry.resolve(
        profile=None,
        files=[("a.yaml", {"components": {"plane": {"replicas": 5}}, "image": "r/m:1.0"})],
        assignments=[
            "components.plane.replicas=3",
            "components.plane.debug=true",
            "components.plane.dirs=x,y",
            "components.node.binDir=1.0",
        ],
        revision="canary",
        namespace=None,
    )
    plane = values.own("plane", PlaneValues)
    assert (plane.replicas, plane.debug, plane.dirs) == (3, True, ("x", "y"))
    assert values.own("node", NodeValues).bin_dir == "1.0"  # a string field keeps the text
    assert values.image == "r/m:1.0"
    assert values.revision == "canary"
    assert values.revisioned("meshctl-x") == "meshctl-x-canary"


def test_a_file_names_the_profile_unless_the_flag_does(registry):
    files = [("v.yaml", {"profile": "minimal"})]
    assert registry.resolve(profile=None, files=files).profile == "minimal"
    assert registry.resolve(profile="default", files=files).profile == "default"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"assignments": ["components.plane.replicsa=2"]},
            "unknown key 'components.plane.replicsa'",
        ),
        (
            {"assignments": ["components.plane.replicas=two"]},
            "components.plane.replicas: expected an integer",
        ),
        (
            {"assignments": ["components.plane.replicas=0"]},
            "components.plane.replicas: 0 is out of range (at least 1)",
        ),
        ({"assignments": ["components.plane.debug=yes"]}, "expected true or false, got 'yes'"),
        ({"assignments": ["components.plane=1"]}, "components.plane is a section"),
        (
            {"assignments": ["components.plane.replicas.x=1"]},
            "components.plane.replicas is a value",
        ),
        ({"assignments": ["noequals"]}, "expected KEY=VALUE"),
        ({"assignments": ["a..b=1"]}, "is not a key path"),
        ({"assignments": ["components.plane.dirs=ok,Not_Ok"]}, "'Not_Ok' must be a DNS-1123 label"),
        (
            {"files": [("v.yaml", {"components": {"plane": {"replicas": "3"}}})]},
            "v.yaml: components.plane.replicas: expected an integer, got string '3'",
        ),
        (
            {"files": [("v.yaml", {"components": {"nope": {}}})]},
            "v.yaml: unknown key 'components.nope'",
        ),
        ({"files": [("v.yaml", ["a"])]}, "v.yaml: the values must be a mapping"),
        (
            {"files": [("v.yaml", {"components": None})]},
            "v.yaml: components must be a mapping, not null",
        ),
        ({"profile": "ambient"}, "--profile: unknown profile 'ambient'"),
        (
            {"revision": "Canary"},
            "--revision Canary: revision: 'Canary' must be a DNS-1123",
        ),
    ],
)
def test_refusals_name_the_source_and_the_path(registry, kwargs, expected):
    kwargs.setdefault("profile", None)
    with pytest.raises(ConfigError) as caught:
        registry.resolve(**kwargs)
    assert expected in caught.value.message
    assert caught.value.hint


def test_an_unknown_key_lists_the_keys_of_its_section(registry):
    with pytest.raises(ConfigError) as caught:
        registry.resolve(profile=None, assignments=["components.node.bindir=/x"])
    assert "enabled, binDir" in (caught.value.hint or "")


def test_non_defaults_keep_only_what_changed():
    base = {"a": 1, "b": {"c": 2, "d": 3}}
    assert v.non_defaults({"a": 1, "b": {"c": 2, "d": 4}}, base) == {"b": {"d": 4}}
    assert v.non_defaults(base, base) == {}


def test_duplicate_component_names_are_refused():
    with pytest.raises(ConfigError, match="two installed components"):
        Registry([component("x", NoValues, {}), component("x", NoValues, {})])


def test_every_number_an_installed_component_takes_has_both_bounds():
    from meshctl import components

    def ints(schema, at=()):
        for key, node in schema.items():
            if isinstance(node, v.Field):
                if node.kind == "int":
                    yield ".".join((*at, key)), node
            else:
                yield from ints(node, (*at, key))

    registry = components.load()
    found = [
        (f"components.{c.name}.{path}", field)
        for c in registry.components
        for path, field in ints(c.full_schema())
    ]
    assert found
    for path, field in found:
        assert field.minimum is not None, path
        assert field.maximum is not None, path


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("components.controlplane.replicas=100000", "100000 is out of range (1-100)"),
        ("components.gateway.replicas=101", "101 is out of range (1-100)"),
        ("components.ztunnel.workers=65", "65 is out of range (1-64)"),
    ],
)
def test_an_install_number_beyond_its_bound_is_refused_with_the_range(assignment, message):
    from meshctl import components

    with pytest.raises(ConfigError, match=re.escape(message)):
        components.load().resolve(profile=None, assignments=[assignment])
