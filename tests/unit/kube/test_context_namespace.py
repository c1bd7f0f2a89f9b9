"""The namespace a command uses without ``-n``: kubectl's rule, the kubeconfig context's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from meshctl.kube.client import KubeSettings, connect, context_namespace


def _ns(namespace: str | None) -> dict[str, str]:
    return {"namespace": namespace} if namespace else {}


def _config(current: str | None, contexts: dict[str, str | None]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": n, "context": {"cluster": "c", "user": "u", **_ns(ns)}}
            for n, ns in contexts.items()
        ],
    }
    if current is not None:
        doc["current-context"] = current
    return doc


def test_the_current_context_names_the_namespace():
    assert context_namespace([_config("a", {"a": "team", "b": "ops"})], None) == "team"


def test_an_explicit_context_wins_over_the_current_one():
    assert context_namespace([_config("a", {"a": "team", "b": "ops"})], "b") == "ops"


@pytest.mark.parametrize(
    "documents",
    [
        [_config("a", {"a": None})],  # a context without a namespace
        [_config(None, {"a": "team"})],  # no current context
        [_config("gone", {"a": "team"})],  # a current context nowhere defined
        [None, "text", {"contexts": "not a list"}],  # shapes the loader would refuse
    ],
)
def test_default_when_the_context_names_no_namespace(documents):
    assert context_namespace(documents, None) == "default"


def test_merged_files_take_the_first_current_context_and_its_first_definition():
    first = _config(None, {"x": "one"})
    second = _config("x", {"x": "two"})
    assert context_namespace([first, second], None) == "one"


def test_a_connected_client_carries_its_context_namespace(tmp_path: Path):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(_config("a", {"a": "team", "b": "ops"})))
    assert connect(KubeSettings(kubeconfig=str(path))).namespace == "team"
    assert connect(KubeSettings(kubeconfig=str(path), context="b")).namespace == "ops"


def test_in_cluster_the_service_accounts_namespace(tmp_path: Path, monkeypatch):
    from meshctl.kube import client

    ns_file = tmp_path / "namespace"
    ns_file.write_text("mesh-apps\n")
    monkeypatch.setattr(client, "SERVICE_ACCOUNT_NAMESPACE", ns_file)
    monkeypatch.setattr(client, "_one_attempt", lambda configuration: None)
    monkeypatch.setattr(
        "kubernetes.config.load_incluster_config", lambda client_configuration: None
    )
    kube = connect(KubeSettings(), env={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert kube.namespace == "mesh-apps"
    ns_file.unlink()
    assert connect(KubeSettings(), env={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}).namespace == (
        "default"
    )
