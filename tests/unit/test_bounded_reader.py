"""The one bounded reader (``meshctl.structured``, ``meshctl.yamlread``): what it refuses, how
fast, in which words; and that whatever it accepts it reads as PyYAML's safe loader does."""

from __future__ import annotations

import io
import json
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl import yamlread
from meshctl.errors import EXIT_USAGE, UserError
from meshctl.structured import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DEPTH,
    InputError,
    Limits,
    limits_from_env,
    load_json,
)
from meshctl.yamlread import load_yaml, yaml_documents


def alias_bomb(levels: int = 6, fanout: int = 10) -> str:
    """Each level an anchored list of ``fanout`` aliases to the level below (437 bytes: 6x10)."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * fanout) + "]"]
    for level in range(1, levels + 1):
        aliases = ", ".join([f"*a{level - 1}"] * fanout)
        lines.append(f"a{level}: &a{level} [{aliases}]")
    return "\n".join(lines) + "\n"


def refusal(data: object, limits: Limits = Limits()) -> InputError:  # noqa: B008
    with pytest.raises(InputError) as caught:
        list(yaml_documents(data, "in.yaml", limits))  # type: ignore[arg-type]
    return caught.value


def test_an_alias_bomb_is_refused_in_milliseconds_naming_the_line():
    bomb = alias_bomb()
    assert len(bomb) < 500
    start = time.perf_counter()
    error = refusal(bomb)
    assert time.perf_counter() - start < 0.1
    assert error.message.startswith("in.yaml:")
    assert "more than 1000000 values (alias *a" in error.message
    assert "MESHCTL_MAX_INPUT_NODES" in (error.hint or "")
    assert error.exit_code == EXIT_USAGE


def test_a_self_referencing_alias_is_refused_not_built():
    error = refusal("metadata: &m\n  name: x\n  self: *m\n")
    assert error.message == (
        "in.yaml:3: alias *m refers to a node that contains it "
        "(a self-referencing structure has no end)"
    )


def test_aliases_count_every_time_they_are_used():
    text = "a: &a [1, 2, 3, 4]\nb: [*a, *a, *a]\n"
    assert load_yaml(text, "t") == {"a": [1, 2, 3, 4], "b": [[1, 2, 3, 4]] * 3}
    with pytest.raises(InputError, match=r"t:2: the document holds more than 12 values"):
        load_yaml(text, "t", Limits(max_nodes=12))


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,  # libyaml's own limit (1000) is met first
        "- " * 150 + "x\n",
        "a: &a " + "[" * 60 + "]" * 60 + "\nb: " + "[" * 60 + "*a" + "]" * 60 + "\n",
    ],
    ids=["flow-100000", "block-150", "through-an-alias"],
)
def test_nesting_beyond_the_limit_is_refused(text: str):
    error = refusal(text)
    assert f"nested deeper than {DEFAULT_MAX_DEPTH} levels" in error.message
    assert error.line is not None


def test_nesting_at_the_limit_is_read():
    text = "[" * DEFAULT_MAX_DEPTH + "]" * DEFAULT_MAX_DEPTH
    value = load_yaml(text, "t")
    for _ in range(DEFAULT_MAX_DEPTH - 1):
        (value,) = value
    assert value == []


def test_a_text_larger_than_the_limit_is_refused_before_parsing():
    error = refusal("a: b\n" * 10, Limits(max_bytes=20))
    assert error.message == "in.yaml: larger than 20 bytes (the limit for input held at once)"


def test_one_document_of_a_stream_larger_than_the_limit_is_refused_while_reading():
    small = b"a: 1\n---\n" * 1000
    assert len(list(yaml_documents(io.BytesIO(small), "s", Limits(max_bytes=100_000)))) == 1000
    huge = b"a: " + b"x" * 1_000_000 + b"\n"
    error = refusal(io.BytesIO(huge), Limits(max_bytes=100_000))
    assert "larger than" in error.message


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"a: 1\nb: \xff\xfe\x00\x01", "in.yaml:2: not UTF-8 text (byte"),
        (io.BytesIO(b"a: 1\n\nb: \x80\n"), "in.yaml:3: not UTF-8 text (byte 9"),
        ("a: b\x01", "in.yaml:1: character #x0001 is not allowed in YAML"),
        ("a: [unclosed\n", "in.yaml: invalid YAML at line 2, column 1: did not find expected"),
        ("a: *nowhere\n", "in.yaml:1: alias *nowhere names no anchor before it"),
        ("a: &x 1\nb: &x 2\n", "in.yaml:2: anchor &x is defined twice"),
        ("a: !!binary aGk=\n", "in.yaml:1: YAML tag !!binary is not supported"),
        ("a: !custom x\n", "in.yaml:1: YAML tag !custom is not supported"),
        ("a: " + "9" * 5000 + "\n", "in.yaml:1: '9999"),
        ("? [a]\n: b\n", "in.yaml:1: a mapping key is itself a mapping or a list"),
        ("a: {<<: 3}\n", "in.yaml:1: a merge key '<<' needs a mapping"),
    ],
    ids=[
        "binary",
        "binary-stream",
        "control",
        "syntax",
        "alias",
        "anchor",
        "binary-tag",
        "custom-tag",
        "huge-int",
        "list-key",
        "merge-scalar",
    ],
)
def test_bad_yaml_is_one_line_naming_the_line(data: object, needle: str):
    error = refusal(data)
    assert needle in error.message
    assert "\n" not in error.message


def test_syntax_errors_read_as_one_line_not_pyyamls_four():
    error = refusal("a: 1\nb: c: d\n")
    assert error.message == (
        "in.yaml: invalid YAML at line 2, column 5: mapping values are not allowed in this context"
    )


def test_more_than_one_document_where_one_is_expected_names_the_second():
    with pytest.raises(InputError, match=r"^v\.yaml:3: holds 2 YAML documents"):
        load_yaml("a: 1\n---\nb: 2\n", "v.yaml")


def test_list_items_report_where_each_starts():
    text = "apiVersion: v1\nkind: List\nitems:\n- kind: Pod\n  a: 1\n- kind: Service\n"
    (document,) = yaml_documents(text, "l")
    assert (document.line, document.item_lines) == (1, (4, 6))


def test_limits_come_from_env_with_sizes_and_ceilings():
    limits = limits_from_env({"MESHCTL_MAX_INPUT_BYTES": "64Mi", "MESHCTL_MAX_INPUT_DEPTH": "200"})
    assert (limits.max_bytes, limits.max_depth) == (64 << 20, 200)
    assert limits_from_env({}).max_bytes == DEFAULT_MAX_BYTES
    for env in (
        {"MESHCTL_MAX_INPUT_DEPTH": "100000"},
        {"MESHCTL_MAX_INPUT_BYTES": "lots"},
        {"MESHCTL_MAX_INPUT_BYTES": "2Ti"},
        {"MESHCTL_MAX_INPUT_NODES": "9" * 5000},
    ):
        with pytest.raises(UserError, match="invalid value"):
            limits_from_env(env)


def test_json_refuses_depth_and_bad_bytes_in_one_line():
    with pytest.raises(InputError, match=r"^body: nested deeper than 3 levels$"):
        load_json(b"[[[[1]]]]", "body", Limits(max_depth=3))
    with pytest.raises(InputError, match=r"^body: nested deeper than 100 levels$"):
        load_json("[" * 100_000, "body")
    with pytest.raises(InputError, match=r"^body:1: not UTF-8 text"):
        load_json(b'{"a": "\xff"}', "body")
    with pytest.raises(InputError, match=r"^body: invalid JSON at line 2, column 1: Expecting"):
        load_json('{"a":\n', "body")
    assert load_json(b'{"a": [1, {"b": null}]}', "body") == {"a": [1, {"b": None}]}


# --- the same values as PyYAML's safe loader --------------------------------------------------


class _NoTimestamps(yaml.SafeLoader):
    yaml_implicit_resolvers = {  # noqa: RUF012
        k: [(tag, rx) for tag, rx in v if not tag.endswith(":timestamp")]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


_WORDS = [
    "yes", "No", "on", "null", "~", "1e3", "0x1F", "0o17", "017", "1_000", "1:20", ".inf", "-.NaN",
    "2024-01-01", "true", "<<", "", " ", "a b", "x: y", "- z", "#c", "'q'", '"d"', "1.5", "+12",
]  # fmt: skip
_text = st.one_of(st.sampled_from(_WORDS), st.text(max_size=8))
_scalar = st.one_of(_text, st.integers(), st.floats(allow_nan=False), st.booleans(), st.none())
_tree = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(_text, st.integers()), inner)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_tree, st.sampled_from([None, False, True]), st.sampled_from([None, "'", '"']))
def test_values_read_as_pyyaml_reads_them(value, flow, style):
    text = yaml.safe_dump(value, default_flow_style=flow, default_style=style, allow_unicode=True)
    assert load_yaml(text, "t") == yaml.load(text, Loader=_NoTimestamps)  # noqa: S506


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  y: 3\n  z: 4\n",
        "a: &a {x: 1}\nb: &b {y: 2, x: 5}\nc:\n  w: 0\n  <<: [*a, *b]\n",
        "a: &a {x: 1, <<: {q: 9}}\nc: {<<: *a, x: 2}\n",
        "s: &s str\nt: *s\nu: &u [1, *s]\nv: [*u, *u]\n",
        "x: !!str 123\ny: !!int '7'\nz: !!float '1'\nw: !!null ''\n",
        "---\n---\nnull\n---\n- a\n- b\n",
        "k: |\n  multi\n  line\n",
    ],
)
def test_anchors_merges_tags_and_documents_read_as_pyyaml_reads_them(text: str):
    ours = [d.data for d in yaml_documents(text, "t")]
    theirs = [d for d in yaml.load_all(text, Loader=_NoTimestamps) if d is not None]
    assert json.dumps(ours) == json.dumps(theirs)  # key order too


def test_the_module_is_where_the_docs_say():
    assert yamlread.yaml_documents is yaml_documents
