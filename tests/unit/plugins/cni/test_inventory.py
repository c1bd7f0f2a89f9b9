"""``--local-inventory``: a v1 List of Namespaces and Pods parsed as the API would return them,
and the watch events the node agent gets when the file changes."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from meshctl_plugins.cni.podfile import InventoryFile

from meshctl.core.k8s import ambient, podlist
from meshctl.errors import UserError

LIST = """
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient}}
- apiVersion: v1
  kind: Namespace
  metadata: {name: legacy}
- apiVersion: v1
  kind: Pod
  metadata: {name: cart, namespace: shop, labels: {app: cart}}
  spec: {nodeName: laptop, serviceAccountName: cart}
- apiVersion: v1
  kind: Pod
  metadata: {name: old, namespace: legacy, uid: 1234}
  spec: {nodeName: laptop}
- apiVersion: v1
  kind: Pod
  metadata: {name: elsewhere, namespace: shop}
  spec: {nodeName: other}
"""


def test_a_list_gives_namespaces_and_pods_with_stable_uids():
    inv = podlist.parse(LIST, "inv.yaml")
    assert sorted(inv.namespaces) == ["legacy", "shop"]
    cart = inv.pod("shop", "cart")
    assert cart is not None
    assert cart["metadata"]["uid"] == podlist.derived_uid("shop", "cart")
    assert podlist.parse(LIST, "again").pod("shop", "cart") == cart  # every reader agrees
    assert inv.pod("legacy", "old")["metadata"]["uid"] == "1234"  # type: ignore[index]
    assert sorted(p["metadata"]["name"] for p in inv.pods_on("laptop").values()) == ["cart", "old"]
    # The same decision the watch's objects get.
    assert ambient.enrollment(cart, inv.namespace("shop")).enrolled
    old = inv.pod("legacy", "old")
    assert old is not None
    assert not ambient.enrollment(old, inv.namespace("legacy")).enrolled


def test_plain_documents_and_a_missing_namespace_default():
    text = "kind: Pod\napiVersion: v1\nmetadata: {name: a}\n---\n---\n"
    text += "kind: Namespace\nmetadata: {name: default}\n"
    inv = podlist.parse(text, "f")
    assert inv.pod("default", "a") is not None
    assert inv.namespace("default") is not None
    assert podlist.parse("", "f") == podlist.Inventory()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("items: [\n", "f: invalid YAML at line 2, column 1: "),
        ("kind: List\nitems: {a: 1}\n", "f: the List's items must be a list"),
        ("- 1\n", "f: item 1: expected a Namespace or Pod object, got list"),
        ("kind: Service\napiVersion: v1\nmetadata: {name: s}\n", "f: item 1: kind 'Service'"),
        ("kind: Pod\napiVersion: apps/v1\nmetadata: {name: s}\n", "is not a v1 Namespace or Pod"),
        ("kind: Pod\nmetadata: {}\n", "f: item 1 (Pod): metadata.name is missing"),
        ("kind: Pod\nmetadata: {name: Bad_Name}\n", "metadata.name 'Bad_Name' is not a valid name"),
        (
            "kind: Pod\nmetadata: {name: a, labels: {x: true}}\n",
            "metadata.labels must map strings to strings",
        ),
        (
            "kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\nmetadata: {name: a}\n",
            "f: item 2: Pod default/a is listed twice",
        ),
        (
            "kind: Namespace\nmetadata: {name: a}\n---\nkind: Namespace\nmetadata: {name: a}\n",
            "Namespace a is listed twice",
        ),
        (
            "kind: Pod\nmetadata: {name: a, uid: u}\n---\nkind: Pod\nmetadata: {name: b, uid: u}\n",
            "repeats uid u",
        ),
        ("kind: Pod\nmetadata: {name: a}\nspec: [1]\n", "spec must be a mapping"),
        (
            "kind: Pod\nmetadata: {name: a}\nspec: {serviceAccountName: 'x/y'}\n",
            "spec.serviceAccountName 'x/y' is not a service account name",
        ),
    ],
)
def test_a_bad_inventory_names_the_item_and_the_problem(text, message):
    with pytest.raises(podlist.InventoryError) as caught:
        podlist.parse(text, "f")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@given(st.text(max_size=200))
def test_any_text_parses_or_is_refused_with_an_inventory_error(text):
    with contextlib.suppress(podlist.InventoryError):
        podlist.parse(text, "f")


def test_an_unreadable_or_bad_file_at_start_is_a_one_line_user_error(tmp_path: Path):
    with pytest.raises(UserError) as missing:
        InventoryFile(tmp_path / "none.yaml", node_name="laptop")
    assert missing.value.message.startswith(f"cannot read the local inventory {tmp_path}/none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Service\nmetadata: {name: s}\n")
    with pytest.raises(UserError) as refused:
        InventoryFile(bad, node_name="laptop")
    assert refused.value.message.startswith(f"{bad}: item 1: kind 'Service'")


def test_changes_to_the_file_arrive_as_watch_events_and_a_bad_edit_is_ignored(tmp_path: Path):
    path = tmp_path / "inv.yaml"
    path.write_text(LIST)
    source = InventoryFile(path, node_name="laptop", interval=0.01)
    seen: list[tuple[str, str, str]] = []

    async def follow() -> None:
        async with source.subscribe() as events:
            async for event in events:
                name = (event.object.get("metadata") or {}).get("name", "")
                seen.append((event.resource.plural, event.type, name))

    async def scenario() -> None:
        task = asyncio.ensure_future(follow())
        await asyncio.sleep(0.05)
        first = list(seen)
        seen.clear()
        data = yaml.safe_load(LIST)
        data["items"][0]["metadata"]["labels"] = {}  # shop leaves the mesh
        del data["items"][3]  # the legacy pod goes
        data["items"].append(
            {
                "kind": "Pod",
                "metadata": {"name": "new", "namespace": "shop"},
                "spec": {"nodeName": "laptop"},
            }
        )
        _write(path, yaml.safe_dump(data))
        await asyncio.sleep(0.1)
        second = list(seen)
        seen.clear()
        _write(path, "kind: Nonsense\n")
        await asyncio.sleep(0.1)
        task.cancel()
        assert first == [
            ("namespaces", "ADDED", "shop"),
            ("namespaces", "ADDED", "legacy"),
            ("pods", "ADDED", "cart"),
            ("pods", "ADDED", "old"),
            ("namespaces", "SYNCED", ""),
            ("pods", "SYNCED", ""),
        ]
        assert second == [
            ("namespaces", "MODIFIED", "shop"),
            ("pods", "ADDED", "new"),
            ("pods", "DELETED", "old"),
        ]
        assert seen == []  # the bad edit changed nothing
        assert source.current.pod("shop", "new") is not None

    asyncio.run(scenario())


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # an editor's save: a new inode
