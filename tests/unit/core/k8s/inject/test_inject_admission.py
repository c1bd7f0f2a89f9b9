"""The webhook handler's HTTP contract: status codes, the AdmissionReview envelope, denials."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest

from meshctl.core.k8s.inject import admission
from meshctl.core.k8s.inject.admission import Request, handle, path_env
from meshctl.core.k8s.inject.settings import InjectSettings

SETTINGS = InjectSettings(image="registry.example/meshctl:test")


def review(obj: Any = None, *, version: str = "admission.k8s.io/v1", **request: Any) -> bytes:
    pod = obj if obj is not None else {
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"containers": [{"name": "web", "image": "web:1"}]},
    }  # fmt: skip
    body = {"uid": "4b1c-uid", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": pod}
    body.update(request)
    return json.dumps({"apiVersion": version, "kind": "AdmissionReview", "request": body}).encode()


def post(body: bytes, *, path: str = "/inject", content_type: str | None = "application/json"):
    return handle(Request("POST", path, content_type, body), SETTINGS)


def response_of(answer: admission.Answer) -> dict[str, Any]:
    assert answer.status == 200, answer.body
    assert answer.content_type == "application/json"
    result: dict[str, Any] = json.loads(answer.body)["response"]
    return result


@pytest.mark.parametrize("version", admission.API_VERSIONS)
def test_same_version_out_uid_echoed_and_a_json_patch(version):
    answer = post(review(version=version))
    document = json.loads(answer.body)
    assert document["apiVersion"] == version
    assert document["kind"] == "AdmissionReview"
    response = document["response"]
    assert response["uid"] == "4b1c-uid"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert all(op["op"] in {"add", "remove", "replace", "move", "copy", "test"} for op in patch)
    pod = jsonpatch.apply_patch(json.loads(review())["request"]["object"], patch)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["istio-init", "istio-proxy"]


def test_a_charset_parameter_is_fine():
    assert post(review(), content_type="application/json; charset=utf-8").status == 200


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/yaml", "json"])
def test_non_json_content_type_is_415(content_type):
    assert post(review(), content_type=content_type).status == 415


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"\xff\xfe",
        b"[]",
        b"null",
        b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v2", "request": {}}',
        b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}',
        b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": 7}}',
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",'
            b' "request": {"uid": "u"}}'
        ),
        b"[" * 100_000,
    ],
)
def test_empty_or_malformed_bodies_are_400(body):
    answer = post(body)
    assert answer.status == 400
    assert answer.content_type.startswith("text/plain")


def test_other_paths_and_methods():
    assert post(review(), path="/mutate").status == 404
    assert post(review(), path="/injection").status == 404
    answer = handle(Request("GET", "/inject", None, b""), SETTINGS)
    assert answer.status == 405
    assert ("Allow", "POST") in answer.headers


def test_too_large_is_413():
    assert post(b" " * (admission.MAX_BODY_BYTES + 1)).status == 413


def test_a_bad_annotation_denies_the_pod_with_the_message():
    pod = {
        "metadata": {"annotations": {"traffic.sidecar.istio.io/excludeInboundPorts": "x"}},
        "spec": {"containers": [{"name": "a"}]},
    }
    response = response_of(post(review(pod)))
    assert response["allowed"] is False
    assert response["uid"] == "4b1c-uid"
    message = response["status"]["message"]
    assert "invalid value 'x' for annotation 'traffic.sidecar.istio.io/excludeInboundPorts'" in (
        message
    )


@pytest.mark.parametrize(
    "request_fields",
    [
        {"operation": "UPDATE"},
        {"kind": {"kind": "Service"}},
        {"subResource": "status"},
        {"namespace": "kube-system"},
    ],
)
def test_nothing_to_inject_is_allowed_without_a_patch(request_fields):
    response = response_of(post(review(**request_fields)))
    assert response == {"uid": "4b1c-uid", "allowed": True}


def test_an_opted_out_pod_is_allowed_without_a_patch():
    pod = {
        "metadata": {"labels": {"sidecar.istio.io/inject": "false"}},
        "spec": {"containers": [{"name": "a"}]},
    }
    assert "patch" not in response_of(post(review(pod)))


def test_an_already_injected_pod_gets_no_patch():
    first = response_of(post(review()))
    original = json.loads(review())["request"]["object"]
    injected = jsonpatch.apply_patch(original, json.loads(base64.b64decode(first["patch"])))
    assert response_of(post(review(injected))) == {"uid": "4b1c-uid", "allowed": True}


def test_path_encoded_env_reaches_the_proxy():
    response = response_of(post(review(), path="/inject/cluster/east/net/n1/ZONE/a--slash--b"))
    patch = json.loads(base64.b64decode(response["patch"]))
    pod = jsonpatch.apply_patch(json.loads(review())["request"]["object"], patch)
    env = {e["name"]: e.get("value") for e in pod["spec"]["initContainers"][1]["env"]}
    assert env["ISTIO_META_CLUSTER_ID"] == "east"
    assert env["ISTIO_META_NETWORK"] == "n1"
    assert env["ZONE"] == "a/b"


@pytest.mark.parametrize(
    ("path", "env"),
    [
        ("/inject", ()),
        ("/inject/", ()),
        ("/inject/k/v/dangling", (("k", "v"),)),
        ("/inject/bad-name/v", ()),
        ("/other", None),
    ],
)
def test_path_env_parsing(path, env):
    assert path_env(path) == env


def test_a_bug_is_a_500_not_a_crash(monkeypatch):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("boom")

    monkeypatch.setattr(admission, "inject_pod", broken)
    assert post(review()).status == 500


def test_an_annotation_without_effect_comes_back_as_an_admission_warning():
    pod = {
        "metadata": {"name": "web", "annotations": {"proxy.istio.io/overrides": "{}"}},
        "spec": {"containers": [{"name": "web", "image": "web:1"}]},
    }
    assert "warnings" not in response_of(post(review(pod)))
    pod["metadata"]["annotations"] = {"sidecar.istio.io/componentLogLevel": "misc:error"}
    response = response_of(post(review(pod)))
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    warning = "annotation 'sidecar.istio.io/componentLogLevel' is not supported by meshctl"
    assert response["warnings"] == [warning + " and has no effect"]
