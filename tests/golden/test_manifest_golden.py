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


@pytest.mark.parametrize("profile", ["default", "ambient", "minimal", "demo", "ambient-istiod"])
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
    # The Gateway API's standard channel, v1.6.3 (none beside an istiod: Istio's base chart).
    assert len(upstream) == (0 if profile == "ambient-istiod" else 10), upstream
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


def _not_crds(text: str) -> str:
    """The manifest without CRDs (the profile goldens hold them)."""
    kept = [
        document
        for document in re.split(r"(?m)^---\n", text)
        if document.strip() and yaml.safe_load(document).get("kind") != "CustomResourceDefinition"
    ]
    return "---\n".join(kept)


def test_istio_names_render_the_trusted_ztunnel_the_root_alias_and_an_istiod_service(capsys):
    """For Istio's ztunnel chart with its defaults: the control plane trusts istio-system/ztunnel
    beside our node proxy, publishes the root also as istio-ca-root-cert, answers to
    istiod.istio-system.svc in its certificate, and that name reaches it (an ExternalName: a
    Service selects only pods of its own namespace)."""
    switch = "components.controlplane.istioNames=true"
    text = printed(capsys, "manifest", "generate", "-p", "ambient", "--set", switch)
    assert_golden(DATA / "install-ambient-istio-names.yaml.golden", _not_crds(text))
    documents = list(yaml.safe_load_all(text))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["CA_TRUSTED_NODE_ACCOUNTS"] == "meshctl-system/meshctl-ztunnel,istio-system/ztunnel"
    assert env["MESHCTL_ROOT_CONFIGMAP_ALIASES"] == "istio-ca-root-cert"
    assert env["MESHCTL_SERVING_NAMES"].split(",")[0] == "istiod.istio-system.svc"
    alias = next(
        d for d in documents if d["kind"] == "Service" and d["metadata"]["name"] == "istiod"
    )
    assert alias["metadata"]["namespace"] == "istio-system"
    assert alias["spec"]["type"] == "ExternalName"
    assert alias["spec"]["externalName"] == "meshctl-controlplane.meshctl-system.svc.cluster.local"
    assert {p["port"] for p in alias["spec"]["ports"]} >= {15012, 443}
    # Without the switch: none of it.
    plain = printed(capsys, "manifest", "generate", "-p", "ambient")
    assert "istiod" not in plain.replace("istiod-ca-cert", "")
    assert "istio-ca-root-cert" not in plain


def test_each_istio_name_alone_and_a_service_that_selects_when_in_the_same_namespace(capsys):
    """The values one by one (istiod's chart names for the trusted ztunnel), a revision's
    istiod-<rev> name, and the alias as a plain Service when the control plane runs in its
    namespace."""

    def generate(*sets: str, namespace: str = "meshctl-system") -> list[Any]:
        args = [a for s in sets for a in ("--set", f"components.controlplane.{s}")]
        text = printed(capsys, "manifest", "generate", "-p", "minimal", "-n", namespace, *args)
        return list(yaml.safe_load_all(text))

    def env_of(documents: list[Any]) -> dict[str, str]:
        deployment = next(d for d in documents if d["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    env = env_of(generate("trustedZtunnelNamespace=kube-system"))
    assert env["CA_TRUSTED_NODE_ACCOUNTS"] == "meshctl-system/meshctl-ztunnel,kube-system/ztunnel"
    assert "MESHCTL_ROOT_CONFIGMAP_ALIASES" not in env
    assert "MESHCTL_SERVING_NAMES" not in env
    env = env_of(generate("trustedZtunnelName=zt"))
    assert env["CA_TRUSTED_NODE_ACCOUNTS"] == "meshctl-system/meshctl-ztunnel,meshctl-system/zt"
    env = env_of(generate("rootConfigMapAliases=istio-ca-root-cert"))
    assert env["MESHCTL_ROOT_CONFIGMAP_ALIASES"] == "istio-ca-root-cert"
    assert env["CA_TRUSTED_NODE_ACCOUNTS"] == "meshctl-system/meshctl-ztunnel"
    # Our node proxy's account follows the install's namespace (was meshctl-system always).
    env = env_of(generate(namespace="mesh"))
    assert env["CA_TRUSTED_NODE_ACCOUNTS"] == "mesh/meshctl-ztunnel"

    documents = generate("istiodServiceNamespace=istio-system", namespace="istio-system")
    alias = next(d for d in documents if d["metadata"]["name"] == "istiod")
    assert alias["spec"]["selector"] == {
        "app.kubernetes.io/name": "meshctl-controlplane",
        "istio.io/rev": "default",
    }
    assert "type" not in alias["spec"]
    assert env_of(documents)["MESHCTL_SERVING_NAMES"] == (
        "istiod.istio-system.svc,istiod.istio-system.svc.cluster.local"
    )
    switch = "components.controlplane.istioNames=true"
    text = printed(capsys, "manifest", "generate", "-p", "minimal", "-r", "canary", "--set", switch)
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(text) if d["kind"] == "Service"]
    assert "istiod-canary" in names


def test_the_ambient_istiod_profile_runs_only_the_node_components_pointed_at_istiod(capsys):
    """Beside an istiod: no control plane, no CRDs (Istio's base chart has them), and the node
    proxy with the defaults of Istio's ztunnel chart: istiod's address (checked by that name),
    its root ConfigMap and token audience."""
    documents = list(
        yaml.safe_load_all(printed(capsys, "manifest", "generate", "-p", "ambient-istiod"))
    )
    kinds = {(d["kind"], d["metadata"]["name"]) for d in documents}
    assert ("DaemonSet", "meshctl-ztunnel") in kinds
    assert ("DaemonSet", "meshctl-cni-node") in kinds
    assert not any(k in ("Deployment", "CustomResourceDefinition") for k, _ in kinds)
    proxy = next(
        d
        for d in documents
        if d["metadata"]["name"] == "meshctl-ztunnel" and d["kind"] == "DaemonSet"
    )
    pod = proxy["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["CA_ADDRESS"] == env["XDS_ADDRESS"] == "istiod.istio-system.svc:15012"
    assert "ALT_CA_HOSTNAME" not in env
    assert "ALT_XDS_HOSTNAME" not in env
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["istiod-ca-cert"]["configMap"]["name"] == "istio-ca-root-cert"
    token = volumes["istio-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "istio-ca"
    # The account istiod's default CA_TRUSTED_NODE_ACCOUNTS trusts, by value.
    args = ["-p", "ambient-istiod", "-n", "istio-system"]
    args += ["--set", "components.ztunnel.serviceAccountName=ztunnel"]
    renamed = list(yaml.safe_load_all(printed(capsys, "manifest", "generate", *args)))
    proxy = next(
        d
        for d in renamed
        if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "meshctl-ztunnel"
    )
    assert proxy["spec"]["template"]["spec"]["serviceAccountName"] == "ztunnel"
    accounts = [
        (d["metadata"]["namespace"], d["metadata"]["name"])
        for d in renamed
        if d["kind"] == "ServiceAccount"
    ]
    assert ("istio-system", "ztunnel") in accounts


@pytest.mark.parametrize(
    ("assignment", "problem"),
    [
        ("components.ztunnel.caAddress=istiod.istio-system.svc", "is not HOST:PORT"),
        ("components.ztunnel.xdsAddress=:99999", "is not HOST:PORT"),
        ("components.ztunnel.serviceAccountName=Zt", "must be a DNS-1123 label"),
        ("components.controlplane.trustedZtunnelNamespace=Istio_System", "DNS-1123 label"),
        ("components.controlplane.rootConfigMapAliases=istio_ca", "DNS-1123 label"),
    ],
)
def test_istio_name_values_are_checked_before_anything_renders(capsys, assignment, problem):
    assert main(["manifest", "generate", "--set", assignment]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"Error: --set {assignment}: ")
    assert problem in err
