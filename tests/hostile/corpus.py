"""The hostile corpus: generated input of every kind a user or a peer can send by mistake or on
purpose. Each item is bytes, made here (nothing is downloaded), the same on every run.

Kinds (issue 24's acceptance): binary, truncated, nested 10^5 deep, alias bombs, huge, wrong
types, wrong encodings, empty; plus the cases a50401d turned into internal errors (a
self-referencing alias, an integer beyond int's digit limit, a control character).
"""

from __future__ import annotations

from pathlib import Path

from meshctl.structured import DEFAULT_MAX_BYTES

DEEP = 100_000
# Over the default limit for input held at once, so every command refuses it without reading it
# all (a regular file is refused by its size; a stream when one document passes the limit).
HUGE_BYTES = DEFAULT_MAX_BYTES + (8 << 20)


def alias_bomb(levels: int = 6, fanout: int = 10) -> bytes:
    """Six levels of ten aliases: 437 bytes that expand to a million values."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * fanout) + "]"]
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * fanout) + "]")
    return ("\n".join(lines) + "\n").encode()


def flow_alias_bomb(levels: int = 7, fanout: int = 10) -> bytes:
    """The same in one flow mapping, as a JSON-minded writer would put it."""
    parts = ["a0: &a0 [" + ", ".join(["x"] * fanout) + "]"]
    for level in range(1, levels + 1):
        parts.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * fanout) + "]")
    return ("{" + ", ".join(parts) + "}").encode()


SMALL: dict[str, bytes] = {
    "empty": b"",
    "blank": b"  \n\n# only a comment\n",
    "binary": bytes(range(256)) * 64,
    "nul-bytes": b"a: b\x00c\n",
    "control-chars": b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: \x1b[31mred\x07\n",
    "truncated-yaml": b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: [x, y\n  labels: {a: ",
    "truncated-json": b'{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "lab',
    "nested-flow": b"[" * DEEP + b"]" * DEEP,
    "nested-json-object": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    "nested-block": b"- " * DEEP + b"x\n",
    "nested-unclosed": b"{" * DEEP,
    "alias-bomb": alias_bomb(),
    "alias-bomb-flow": flow_alias_bomb(),
    "self-alias": b"apiVersion: v1\nkind: ConfigMap\nmetadata: &m\n  name: x\n  self: *m\n",
    "wrong-types-list": b"- just\n- a\n- list\n",
    "wrong-types-scalars": b"apiVersion: 1\nkind: [Pod]\nmetadata: 3\nspec: yes\n",
    "wrong-types-json": b'{"cniVersion": 1, "kind": {}, "items": "none", "prevResult": [1]}',
    "utf16-no-bom": "apiVersion: v1\nkind: Pod\n".encode("utf-16-le"),
    "latin1": "metadata:\n  name: caf\xe9\n".encode("latin-1"),
    "bom-then-invalid": b"\xef\xbb\xbfa: \xc3\x28\n",
    "huge-int": b"a: " + b"9" * 10_000 + b"\n",
    "many-empty-documents": b"---\n" * 50_000,
    "long-line": b"a: " + b"y" * (4 << 20) + b"\n",
}


def write_corpus(folder: Path) -> dict[str, Path]:
    """Every item as a file in ``folder`` (the huge one written once, as a sparse-free file)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, data in SMALL.items():
        path = folder / f"{name}.yaml"
        path.write_bytes(data)
        paths[name] = path
    huge = folder / "huge.yaml"
    with huge.open("wb") as out:
        out.write(b"a: ")
        chunk = b"z" * (1 << 20)
        for _ in range(HUGE_BYTES >> 20):
            out.write(chunk)
        out.write(b"\n")
    paths["huge"] = huge
    return paths


NAMES = (*SMALL, "huge")
