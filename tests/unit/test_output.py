"""Rendering data as json, yaml and table."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from meshctl.output import FORMATS, OutputFormat, render, render_objects

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=12,
)


@given(json_values)
def test_json_and_yaml_round_trip(value):
    assert json.loads(render(value, "json")) == value
    assert yaml.safe_load(render(value, OutputFormat.YAML)) == value


def test_yaml_keeps_key_order():
    assert render({"b": 1, "a": 2}, "yaml") == "b: 1\na: 2\n"


def test_mapping_renders_as_aligned_key_value_rows():
    text = render({"meshctl": "0.1.0", "frozen": False, "deps": {"h2": "4"}}, "table")
    assert text == "MESHCTL   0.1.0\nFROZEN    false\nDEPS      h2=4\n"


def test_list_of_mappings_renders_one_column_per_key():
    text = render([{"name": "a", "port": 1}, {"name": "bb", "extra": None}], "table")
    assert text.splitlines() == ["NAME   PORT   EXTRA", "a      1", "bb            -"]


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="xml"):
        render({}, "xml")


def test_shared_objects_are_written_out_in_full_without_anchors():
    labels = {"app": "x"}
    meta = {"name": "x", "labels": labels}
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"l": labels}},
    ]
    text = render_objects(objects, "yaml")
    assert "&" not in text
    assert "*" not in text
    assert list(yaml.safe_load_all(text)) == objects


def test_objects_come_out_in_kubernetes_key_order_with_separators():
    obj = {
        "status": {"phase": "Running"},
        "spec": {"z": 1, "a": 2},
        "metadata": {
            "annotations": {"a": "1"},
            "labels": {"l": "1"},
            "name": "p",
            "namespace": "n",
        },
        "kind": "Pod",
        "apiVersion": "v1",
    }
    text = render_objects([obj, {"kind": "List", "apiVersion": "v1", "items": [obj]}], "yaml")
    first, second = text.split("---\n")
    assert [line for line in first.splitlines() if not line.startswith(" ")] == [
        "apiVersion: v1", "kind: Pod", "metadata:", "spec:", "status:",
    ]  # fmt: skip
    assert first.splitlines()[3:7] == [
        "  name: p", "  namespace: n", "  labels:", "    l: '1'",
    ]  # fmt: skip
    assert "spec:\n  z: 1\n  a: 2\n" in first  # other keys stay where they were
    assert second.startswith("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n")
    assert yaml.safe_load(first) == obj


def test_several_objects_in_json_are_one_list_and_names_are_kubectls():
    objects = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}},
        {"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "s"}}
        ]},
    ]  # fmt: skip
    assert json.loads(render_objects(objects[:1], "json"))["kind"] == "Deployment"
    assert json.loads(render_objects(objects, "json"))["kind"] == "List"
    assert render_objects(objects, "name") == "deployment.apps/web\nservice/web\n"
    assert render_objects(objects, "table").splitlines() == [
        "KIND              NAME   NAMESPACE",
        "deployment.apps   web    -",
        "service           web    s",
    ]


def test_table_text_and_names_can_be_given():
    assert render({"a": 1}, "table", table="laid out\n") == "laid out\n"
    assert render({"a": 1}, "name", names=["x/1", "y/2"]) == "x/1\ny/2\n"


def test_the_formats_are_the_four_of_the_conventions():
    assert FORMATS == ("json", "yaml", "table", "name")
