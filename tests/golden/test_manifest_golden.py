"""Goldens of the manifests meshctl prints with default settings, and the one image they all run.

``MESHCTL_REFRESH_GOLDEN=1`` rewrites the goldens. The image every printed object names is
``meshctl.core.k8s.image.default_image()`` unless overridden (``--image``,
``MESHCTL_INJECT_IMAGE``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshctl import __version__
from meshctl.cli import main
from meshctl.core.k8s.image import default_image
from tests.harness.golden import assert_golden

DATA = Path(__file__).resolve().parent / "manifests"
POD = """apiVersion: v1
kind: Pod
metadata: {name: p, namespace: shop}
spec:
  containers: [{name: app, image: app:1}]
"""


def printed(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def images(documents: list[Any]) -> set[str]:
    found = set()
    for doc in documents:
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec", spec)
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            if container["name"] != "app":
                found.add(container["image"])
    return found


def test_the_cni_manifest_with_defaults(capsys):
    assert_golden(DATA / "cni-manifest.yaml.golden", printed(capsys, "cni", "manifest"))


def test_every_printed_manifest_runs_the_default_image_unless_told_otherwise(capsys, tmp_path):
    pod = tmp_path / "pod.yaml"
    pod.write_text(POD)
    outputs = [
        printed(capsys, "cni", "manifest"),
        printed(capsys, "cni", "manifest", "--ambient"),
        printed(capsys, "controlplane", "manifest"),
        printed(capsys, "ztunnel", "manifest"),
        printed(capsys, "inject", "-f", str(pod)),
        printed(capsys, "inject", "--cni", "-f", str(pod)),
    ]
    for text in outputs:
        assert images(list(yaml.safe_load_all(text))) == {default_image()}
    assert default_image() == f"localhost/meshctl:{__version__}"
    for command in ("cni", "controlplane", "ztunnel"):
        overridden = printed(capsys, command, "manifest", "--image", "registry.example/m:2")
        assert images(list(yaml.safe_load_all(overridden))) == {"registry.example/m:2"}
    injected = printed(capsys, "inject", "--image", "registry.example/m:2", "-f", str(pod))
    assert images(list(yaml.safe_load_all(injected))) == {"registry.example/m:2"}


@pytest.mark.parametrize("profile", ["default", "ambient", "minimal", "demo"])
def test_install_manifest_of_each_profile(capsys, profile):
    """``meshctl manifest generate`` is ``install --dry-run``: the same text, no anchors."""
    text = printed(capsys, "manifest", "generate", "--profile", profile)
    assert text == printed(capsys, "install", "--dry-run", "-o", "yaml", "--profile", profile)
    assert "&id" not in text
    assert "*id" not in text
    documents = list(yaml.safe_load_all(text))
    # CRDs and the namespace before everything that lives in it or uses them.
    kinds = [d["kind"] for d in documents]
    first = kinds.index("Namespace") + 1
    assert set(kinds[:first]) <= {"CustomResourceDefinition", "Namespace"}, kinds
    assert images(documents) == {default_image()}
    upstream = [d["metadata"]["name"] for d in documents if _upstream_crd(d)]
    assert len(upstream) == 10, upstream  # the Gateway API's standard channel, v1.6.3
    assert_golden(DATA / f"install-{profile}.yaml.golden", _without_upstream_crds(text))


def _upstream_crd(document: Any) -> bool:
    return document.get("kind") == "CustomResourceDefinition" and document["spec"][
        "group"
    ].startswith("gateway.networking.k8s.io")


def _without_upstream_crds(text: str) -> str:
    """The Gateway API's CRDs come from the build's data (upstream's YAML, never kept in the
    repository): in a golden, one line each names them."""
    out = []
    for document in re.split(r"(?m)^---\n", text):
        parsed = yaml.safe_load(document) if document.strip() else None
        if isinstance(parsed, dict) and _upstream_crd(parsed):
            meta = parsed["metadata"]
            version = meta["annotations"]["gateway.networking.k8s.io/bundle-version"]
            out.append(f"# CustomResourceDefinition {meta['name']}: Gateway API {version}\n")
        else:
            out.append(document)
    return "---\n".join(out)


def test_a_revision_names_every_revisioned_object_and_the_webhook_selectors(capsys):
    documents = list(
        yaml.safe_load_all(printed(capsys, "manifest", "generate", "--revision", "canary"))
    )
    webhook = next(d for d in documents if d["kind"] == "MutatingWebhookConfiguration")
    assert webhook["metadata"]["name"].endswith("-canary")
    selected = [
        e
        for hook in webhook["webhooks"]
        for s in (hook.get("namespaceSelector") or {}, hook.get("objectSelector") or {})
        for e in s.get("matchExpressions", [])
        if e["key"] == "istio.io/rev" and e["operator"] == "In"
    ]
    assert selected, webhook
    for hook in webhook["webhooks"]:
        selectors = [hook.get("namespaceSelector") or {}, hook.get("objectSelector") or {}]
        expressions = [e for s in selectors for e in s.get("matchExpressions", [])]
        revs = [e for e in expressions if e["key"] == "istio.io/rev" and e["operator"] == "In"]
        # Each rev webhook selects exactly this revision; the tag-less ones have no In.
        assert all(e["values"] == ["canary"] for e in revs), hook
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert deployment["metadata"]["name"] == "meshctl-controlplane-canary"
    assert deployment["metadata"]["labels"]["istio.io/rev"] == "canary"


def _as_installed(documents: list[Any]) -> list[Any]:
    """Objects with what only an install adds taken out: its labels, the image pull policy, the
    injector's settings (the control plane's MESHCTL_INJECT_* env) and the namespace."""
    out = []
    for doc in documents:
        if doc["kind"] in ("Namespace", "ConfigMap", "CustomResourceDefinition"):
            continue
        if doc["kind"] in ("GatewayClass", "IngressClass"):
            continue  # the shared crds component's, never a stand-alone manifest's
        labels = doc["metadata"].get("labels", {})
        stamped = ("managed-by", "part-of")  # install's own labels (part-of where none is)
        for key in (*(f"app.kubernetes.io/{k}" for k in stamped), "install.meshctl.io/component"):
            labels.pop(key, None)
        spec = doc.get("spec", {})
        for container in spec.get("template", {}).get("spec", {}).get("containers", []):
            container.pop("imagePullPolicy", None)
            container["env"] = [
                e for e in container.get("env", []) if not e["name"].startswith("MESHCTL_INJECT_")
            ]
        out.append(doc)
    return sorted(out, key=lambda d: (d["kind"], d["metadata"]["name"]))


@pytest.mark.parametrize(
    ("profile", "commands"),
    [
        ("minimal", [["controlplane", "manifest"]]),
        ("default", [["controlplane", "manifest"], ["cni", "manifest"]]),
        (
            "ambient",
            [
                ["controlplane", "manifest"],
                ["cni", "manifest", "--ambient"],
                ["ztunnel", "manifest"],
            ],
        ),
    ],
)
def test_the_stand_alone_manifests_are_what_install_renders_from_the_same_defaults(
    capsys, profile, commands
):
    """``cni|controlplane|ztunnel manifest`` and ``install`` start from the same values types:
    with defaults, each prints exactly its component's objects of the install."""
    installed = list(yaml.safe_load_all(printed(capsys, "manifest", "generate", "-p", profile)))
    alone = [d for c in commands for d in yaml.safe_load_all(printed(capsys, *c))]
    assert _as_installed(alone) == _as_installed(installed)
