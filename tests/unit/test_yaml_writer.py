"""The fast YAML writer behind every ``-o yaml``: byte for byte what libyaml writes, or no answer
(then PyYAML writes the document)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.output import YamlWriter, yaml_documents
from meshctl.yamlwriter import BlockWriter, reference

_TRICKY = [
    "yes", "No", "null", "~", "1e3", "0x1F", "1_000", "1:20", "2024-01-01", "-", ":", "- a",
    "a:", "a: b", "#x", "x #y", "---x", "...", "<<", "=", "", " ", "'", "a'b", "1.5", ".inf",
    "true", "x" * 130, "é", "\t", "a\nb", "\u2028", "\x85", "\ufeff", "\x00", "a  b", "?x", "%",
]  # fmt: skip
_chars = st.sampled_from(list("ab :#-?'\"{}[],&*!|>%@`.019eEx_+\t\n\r\\é\u2028\x85~"))
_text = st.one_of(st.text(_chars, max_size=12), st.text(max_size=8), st.sampled_from(_TRICKY))
_scalar = st.one_of(_text, st.integers(), st.booleans(), st.none(), st.floats(), st.just(-0.0))
_key = st.one_of(_text, st.integers(), st.booleans(), st.none())
_tree = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_key, inner, max_size=4)),
    max_leaves=25,
)
_WRITER = BlockWriter()  # shared: what one scalar left in the cache must not change the next


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(_tree)
def test_the_fast_writer_writes_what_libyaml_writes_or_declines(value):
    fast = _WRITER.block_yaml(value)
    assert fast is None or fast == reference(value)


@pytest.mark.parametrize(
    "value",
    [
        {"metadata": {"annotations": {"a": '{"k":"v"}', "b": "yes"}}, "spec": {"ports": [80]}},
        [[1, [2, {"a": []}]], {}, {"b": {}}],
        {"a": [{"b": [{"c": "d", "e": ["f"]}], "g": None}], "h": -0.0, "i": 1e20},
    ],
)
def test_nested_lists_and_mappings_lay_out_as_libyaml_does(value):
    assert BlockWriter().block_yaml(value) == reference(value)


@pytest.mark.parametrize("value", ["text", {}, [], {"a": "line\nbreak"}, {"a": b"bytes"}])
def test_what_it_is_not_sure_of_goes_to_pyyaml(value):
    assert BlockWriter().block_yaml(value) is None
    assert YamlWriter().document(value) == reference(value)


def test_documents_are_joined_by_separators_in_kubernetes_order():
    objects = [{"kind": "A", "apiVersion": "v1", "metadata": {"name": "a"}}, {"b": 1}]
    assert yaml_documents(objects) == "apiVersion: v1\nkind: A\nmetadata:\n  name: a\n---\nb: 1\n"
