"""Rendering data as json, yaml and table."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from meshctl.output import OutputFormat, render

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
