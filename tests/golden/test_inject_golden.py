"""Golden pairs ``tests/testdata/inject/<name>.yaml`` -> ``<name>.yaml.injected``, both paths.

Each pair runs through the CLI (``meshctl inject -f``, byte-for-byte against the golden) and
through the webhook handler (each workload's pod as its controller would create it, in an
AdmissionReview; the returned JSON patch applied with jsonpatch must give the golden's pod).
``MESHCTL_REFRESH_GOLDEN=1`` rewrites the goldens; a golden without its input, or an input
without its golden, fails.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from meshctl.cli import main
from meshctl.core.k8s.inject import admission, kinds
from meshctl.core.k8s.inject.annotations import UNDO
from meshctl.core.k8s.inject.documents import load
from meshctl.core.k8s.inject.settings import InjectSettings
from tests.harness.golden import assert_golden

DATA = Path(__file__).resolve().parents[1] / "testdata" / "inject"
IMAGE = "registry.example/meshctl:golden"

# Cases injected with more than the defaults: CLI flags, and the same as settings for the webhook.
FLAGS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "cni-mode": (["--cni"], {"cni": True}),
    "revision": (["--revision", "canary"], {"revision": "canary"}),
}
# Inputs injected before: uninjecting them gives the original they came from, not themselves.
PREVIOUSLY_INJECTED = {"already-injected", "istio-injected"}

CASES = sorted(p.name.removesuffix(".yaml") for p in DATA.glob("*.yaml"))


def run_inject(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(["inject", "--image", IMAGE, *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def golden_path(name: str) -> Path:
    return DATA / f"{name}.yaml.injected"


def test_there_are_at_least_fifteen_cases():
    assert len(CASES) >= 15, CASES


def test_every_golden_has_its_input():
    orphans = [
        p.name
        for p in DATA.glob("*.yaml.injected")
        if not (DATA / p.name[: -len(".injected")]).is_file()
    ]
    assert not orphans, f"goldens without an input (delete them): {orphans}"


@pytest.mark.parametrize("name", CASES)
def test_cli_output_matches_golden(name: str, capsys: pytest.CaptureFixture[str]):
    flags = FLAGS.get(name, ([], {}))[0]
    out = run_inject(capsys, "-f", str(DATA / f"{name}.yaml"), *flags)
    assert_golden(golden_path(name), out)


@pytest.mark.parametrize("name", CASES)
def test_injecting_the_golden_again_changes_nothing(name: str, capsys: pytest.CaptureFixture[str]):
    flags = FLAGS.get(name, ([], {}))[0]
    golden = golden_path(name)
    assert run_inject(capsys, "-f", str(golden), *flags) == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", CASES)
def test_uninject_restores_the_original(name: str, capsys: pytest.CaptureFixture[str]):
    source = DATA / f"{name}.yaml"
    restored = run_inject(capsys, "--uninject", "-f", str(golden_path(name)))
    # The original, normalised by the same YAML writer (comments and quoting are not kept).
    original = run_inject(capsys, "--uninject", "-f", str(source))
    assert restored == original
    if name not in PREVIOUSLY_INJECTED:
        parsed = [d.data for d in load(source.read_text(encoding="utf-8"), "x")]
        assert [d.data for d in load(restored, "x")] == parsed


# --- the webhook path -------------------------------------------------------------------------


def pods_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods controllers would create from ``obj`` (a workload, or a List of them)."""
    if kinds.is_list(obj):
        return [pod for item in obj.get("items") or [] for pod in pods_of(item)]
    path = kinds.template_path(obj)
    if path is None:
        return []
    template: Any = obj
    for part in path:
        template = template[part]
    return [pod_from_template(obj, template)]


def pod_from_template(owner: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """A Pod as the API server receives it from ``owner``'s controller (or ``owner`` itself)."""
    pod = copy.deepcopy(template)
    kind, name = owner["kind"], owner["metadata"]["name"]
    namespace = owner["metadata"].get("namespace", "default")
    metadata = pod.get("metadata") or {}
    pod["metadata"] = metadata
    if kind != "Pod":
        metadata.pop("name", None)  # controllers name pods with generateName
    metadata["namespace"] = namespace
    controller = {
        "Deployment": ("ReplicaSet", f"{name}-5d8f7c9b6"),
        "CronJob": ("Job", f"{name}-29410560"),
    }.get(kind, (kind, name))
    if kind == "Deployment":
        metadata.setdefault("labels", {})["pod-template-hash"] = "5d8f7c9b6"
    if kind != "Pod":
        metadata["generateName"] = f"{controller[1]}-"
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": controller[0],
                "name": controller[1],
                "uid": "00000000-0000-0000-0000-000000000001",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", **pod}


def review_of(pod: dict[str, Any], api_version: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": pod["metadata"]["namespace"],
            "operation": "CREATE",
            "object": pod,
        },
    }


def through_webhook(
    pod: dict[str, Any], settings: InjectSettings, api_version: str
) -> dict[str, Any]:
    """``pod`` after the webhook's answer is applied, checking the answer's envelope."""
    uid = f"uid-{api_version.rsplit('/', 1)[1]}-{pod['metadata'].get('generateName', 'pod')}"
    body = json.dumps(review_of(pod, api_version, uid)).encode()
    answer = admission.handle(
        admission.Request("POST", "/inject", "application/json", body), settings
    )
    assert answer.status == 200, answer.body
    document = json.loads(answer.body)
    assert document["apiVersion"] == api_version
    assert document["kind"] == "AdmissionReview"
    response = document["response"]
    assert response["uid"] == uid
    assert response["allowed"] is True
    if "patch" not in response:
        return pod
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(pod, patch)
    return result


def without_undo(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` less its undo annotation, replaced by whether it had one."""
    pod = copy.deepcopy(pod)
    annotations = pod["metadata"].get("annotations") or {}
    annotations["has-undo"] = str(annotations.pop(UNDO, None) is not None)
    return pod


@pytest.mark.parametrize("api_version", admission.API_VERSIONS)
@pytest.mark.parametrize("name", CASES)
def test_webhook_gives_the_golden_pod(name: str, api_version: str):
    settings = InjectSettings(image=IMAGE, **FLAGS.get(name, ([], {}))[1])
    inputs = [d.data for d in load((DATA / f"{name}.yaml").read_text(encoding="utf-8"), name)]
    goldens = [d.data for d in load(golden_path(name).read_text(encoding="utf-8"), name)]
    assert len(inputs) == len(goldens)
    checked = 0
    for source, golden in zip(inputs, goldens, strict=True):
        for pod, expected in zip(pods_of(source), pods_of(golden), strict=True):
            # The undo record describes the object injected (a template here, a pod there), so
            # it may differ in which fields were absent; it must be there exactly when expected.
            assert without_undo(through_webhook(pod, settings, api_version)) == without_undo(
                expected
            )
            checked += 1
    assert checked, f"{name} has no workload for the webhook to inject"


@pytest.mark.parametrize("name", CASES)
def test_init_container_arguments_are_accepted_by_meshctl_iptables(
    name: str, capsys: pytest.CaptureFixture[str]
):
    """What the init container will run parses in the capture engine (rendered, no kernel)."""
    goldens = [d.data for d in load(golden_path(name).read_text(encoding="utf-8"), name)]
    for pod in (p for golden in goldens for p in pods_of(golden)):
        for container in pod["spec"].get("initContainers") or []:
            if container["name"] != "istio-init":
                continue
            assert container["command"] + container["args"][:2] == ["meshctl", "iptables", "apply"]
            code = main(["iptables", "render", *container["args"][2:]])
            out, err = capsys.readouterr()
            assert code == 0, err
            assert "MESH_" in out
