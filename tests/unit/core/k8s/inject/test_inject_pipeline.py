"""The pod pipeline's decisions and refusals: what is injected where, skipped, or rejected."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject import kinds
from meshctl.core.k8s.inject.documents import dump, inject_text, load
from meshctl.core.k8s.inject.errors import InjectError, InvalidAnnotationError, ManifestError
from meshctl.core.k8s.inject.pipeline import inject_pod, is_injected, uninject_pod
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.errors import ConfigError

SETTINGS = InjectSettings(image="registry.example/meshctl:test")


def pod(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "labels": {"app": "web"}, "annotations": dict(annotations)},
        "spec": {"containers": [{"name": "web", "image": "web:1"}]},
    }


def inject(p: dict[str, Any], settings: InjectSettings = SETTINGS, **kw: Any) -> dict[str, Any]:
    return inject_pod(p, settings, workload_name="web", **kw).pod


def names(items: list[dict[str, Any]] | None) -> list[str]:
    return [i["name"] for i in items or []]


def test_native_sidecar_is_an_init_container_that_restarts():
    spec = inject(pod())["spec"]
    assert names(spec["initContainers"]) == ["istio-init", "istio-proxy"]
    assert names(spec["containers"]) == ["web"]
    proxy = spec["initContainers"][1]
    assert proxy["restartPolicy"] == "Always"
    assert proxy["command"] + proxy["args"] == ["meshctl", "ztunnel", "run", "--mode", "sidecar"]
    assert proxy["securityContext"]["runAsUser"] == 1337
    assert proxy["securityContext"]["runAsGroup"] == 1337
    assert [p["containerPort"] for p in proxy["ports"]] == [15001, 15006, 15008, 15020, 15021]
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/healthz/ready", "port": 15021}


def test_classic_sidecar_is_the_last_container():
    settings = InjectSettings(image="x", native_sidecar=False)
    p = pod()
    p["spec"]["initContainers"] = [{"name": "migrate", "image": "m"}]
    spec = inject(p, settings)["spec"]
    assert names(spec["initContainers"]) == ["migrate", "istio-init"]
    assert names(spec["containers"]) == ["web", "istio-proxy"]
    assert "restartPolicy" not in spec["containers"][1]


def test_the_annotation_overrides_the_native_sidecar_setting():
    spec = inject(pod(**{ann.NATIVE_SIDECAR: "false"}))["spec"]
    assert names(spec["containers"]) == ["web", "istio-proxy"]


def test_init_container_runs_the_capture_command_as_root_with_net_admin():
    init = inject(pod(**{ann.EXCLUDE_OUTBOUND_PORTS: "25"}))["spec"]["initContainers"][0]
    assert init["command"] + init["args"][:2] == ["meshctl", "iptables", "apply"]
    assert init["args"][init["args"].index("-o") + 1] == "25"
    assert init["securityContext"]["runAsUser"] == 0
    assert init["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "NET_RAW"]


def test_cni_mode_has_no_privileged_init_container_only_the_unprivileged_validation():
    result = inject(pod(), InjectSettings(image="x", cni=True))
    init = result["spec"]["initContainers"]
    assert names(init) == ["istio-validation", "istio-proxy"]
    validation = init[0]
    assert validation["args"][:2] == ["iptables", "validate"]
    context = validation["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert (context["runAsUser"], context["runAsGroup"], context["runAsNonRoot"]) == (
        1337,
        1337,
        True,
    )
    assert context["readOnlyRootFilesystem"] is True
    assert not context["privileged"]
    annotations = result["metadata"]["annotations"]
    assert annotations[ann.INTERCEPTION_MODE] == "REDIRECT"
    # Istio's spelling: the status port (the plugin excludes the proxy's other ports itself).
    assert annotations[ann.EXCLUDE_INBOUND_PORTS] == "15020"
    status = json.loads(annotations[ann.STATUS])
    assert status["initContainers"] == ["istio-validation", "istio-proxy"]


def test_cni_mode_without_interception_has_no_validation():
    result = inject(pod(**{ann.INTERCEPTION_MODE: "NONE"}), InjectSettings(image="x", cni=True))
    assert names(result["spec"]["initContainers"]) == ["istio-proxy"]


def test_status_annotation_has_istios_shape():
    status = json.loads(inject(pod())["metadata"]["annotations"][ann.STATUS])
    assert list(status) == [
        "initContainers",
        "containers",
        "volumes",
        "imagePullSecrets",
        "revision",
    ]
    assert status["initContainers"] == ["istio-init", "istio-proxy"]
    assert status["containers"] is None
    assert status["imagePullSecrets"] is None
    assert status["revision"] == "default"
    assert status["volumes"] == ["workload-certs", "meshctl-tmp", "istio-token", "istiod-ca-cert"]


def test_labels_and_default_container():
    result = inject(pod())
    assert result["metadata"]["labels"] == {
        "app": "web",
        ann.TLS_MODE_LABEL: "istio",
        ann.CANONICAL_NAME_LABEL: "web",
        ann.CANONICAL_REVISION_LABEL: "latest",
    }
    assert result["metadata"]["annotations"][ann.DEFAULT_CONTAINER] == "web"


def test_canonical_labels_come_from_the_usual_labels_first():
    p = pod()
    p["metadata"]["labels"] = {"app.kubernetes.io/name": "shop", "version": "v3"}
    labels = inject_pod(p, SETTINGS, workload_name="shop-7f9").pod["metadata"]["labels"]
    assert labels[ann.CANONICAL_NAME_LABEL] == "shop"
    assert labels[ann.CANONICAL_REVISION_LABEL] == "v3"


def test_a_long_workload_name_still_makes_a_valid_label():
    p = pod()
    p["metadata"]["labels"] = {}
    labels = inject_pod(p, SETTINGS, workload_name="a" * 80 + ".x").pod["metadata"]["labels"]
    assert labels[ann.CANONICAL_NAME_LABEL] == "a" * 63


def test_token_volume_has_the_mesh_audience():
    volumes = {v["name"]: v for v in inject(pod())["spec"]["volumes"]}
    token = volumes["istio-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "meshctl-ca"
    assert volumes["istiod-ca-cert"]["configMap"]["name"] == "meshctl-ca-root-cert"


def test_resource_annotations_replace_the_defaults_as_istio_does():
    proxy = inject(pod(**{ann.PROXY_CPU: "300m", ann.PROXY_MEMORY_LIMIT: "2Gi"}))["spec"][
        "initContainers"
    ][1]
    assert proxy["resources"] == {"requests": {"cpu": "300m"}, "limits": {"memory": "2Gi"}}


def test_a_cpu_request_alone_sets_only_the_request_whatever_the_default_limit():
    init, proxy = inject(pod(**{ann.PROXY_CPU: "4000m"}))["spec"]["initContainers"]
    assert proxy["resources"] == init["resources"] == {"requests": {"cpu": "4000m"}}


def test_without_resource_annotations_the_settings_apply():
    proxy = inject(pod())["spec"]["initContainers"][1]
    assert proxy["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "2000m", "memory": "1Gi"},
    }


def test_a_request_above_its_limit_names_the_annotation():
    with pytest.raises(InvalidAnnotationError, match=r"sidecar\.istio\.io/proxyCPU'"):
        inject(pod(**{ann.PROXY_CPU: "3", ann.PROXY_CPU_LIMIT: "2"}))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (ann.PROXY_MEMORY, "lots"),
        (ann.NATIVE_SIDECAR, "maybe"),
        (ann.READINESS_PERIOD, "0"),
        (ann.PROXY_IMAGE, "has space"),
        (ann.INJECT, "perhaps"),
    ],
)
def test_bad_sidecar_annotations_are_refused(key, value):
    with pytest.raises(InvalidAnnotationError, match=f"for annotation '{key}'"):
        inject(pod(**{key: value}))


def test_probes_are_rewritten_and_kept_for_the_proxy():
    p = pod()
    original = {"httpGet": {"path": "/live", "port": 8080}, "periodSeconds": 3}
    p["spec"]["containers"][0]["livenessProbe"] = copy.deepcopy(original)
    result = inject(p)
    probe = result["spec"]["containers"][0]["livenessProbe"]
    assert probe == {
        "httpGet": {"path": "/app-health/web/livez", "port": 15020},
        "periodSeconds": 3,
    }
    env = {e["name"]: e.get("value") for e in result["spec"]["initContainers"][1]["env"]}
    assert json.loads(env["ISTIO_KUBE_APP_PROBERS"]) == {
        "/app-health/web/livez": {"httpGet": {"path": "/live", "port": 8080}}
    }
    assert uninject_pod(result) == p


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda p: p["spec"].update(hostNetwork=True), "hostNetwork"),
        (lambda p: p["metadata"]["labels"].update({ann.INJECT: "false"}), "label"),
        (lambda p: p["metadata"]["annotations"].update({ann.INJECT: "false"}), "annotation"),
    ],
)
def test_skipped_pods_come_back_unchanged(change, reason):
    p = pod()
    change(p)
    outcome = inject_pod(p, SETTINGS, workload_name="web")
    assert outcome.pod == p
    assert outcome.skipped is not None
    assert reason in outcome.skipped


def test_the_label_wins_over_the_annotation():
    p = pod(**{ann.INJECT: "false"})
    p["metadata"]["labels"][ann.INJECT] = "true"
    assert inject_pod(p, SETTINGS, workload_name="web").skipped is None


def test_system_namespaces_are_never_injected():
    assert inject_pod(pod(), SETTINGS, workload_name="w", namespace="kube-system").skipped


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["spec"].update(containers=[]), "has no containers"),
        (lambda p: p.pop("spec"), "has no spec"),
        (lambda p: p["spec"]["containers"].append({"image": "x"}), "has no name"),
        (lambda p: p["spec"]["containers"].append({"name": "web"}), "used twice"),
        (lambda p: p["spec"].update(volumes=[{"name": "istio-token"}]), "reserved"),
        (lambda p: p["metadata"]["annotations"].update({ann.INJECT: False}), "not a string"),
        (lambda p: p["metadata"].update(labels=["a"]), "not a mapping"),
        (lambda p: p["metadata"]["annotations"].update({ann.UNDO: "{}"}), "without"),
    ],
)
def test_unusable_pods_are_refused(change, message):
    p = pod()
    change(p)
    with pytest.raises(ManifestError, match=message):
        inject(p)


def test_an_unreadable_status_annotation_is_an_error():
    with pytest.raises(InvalidAnnotationError, match=ann.STATUS):
        inject(pod(**{ann.STATUS: "not json"}))


def test_inject_never_changes_its_input():
    p = pod(**{ann.EXCLUDE_INBOUND_PORTS: "9090"})
    p["spec"]["containers"][0]["readinessProbe"] = {"httpGet": {"path": "/", "port": 80}}
    before = copy.deepcopy(p)
    injected = inject(p)
    assert p == before
    uninject_pod(injected)
    assert is_injected(injected)


def test_a_new_revision_replaces_the_old_injection():
    once = inject(pod())
    again = inject(once, InjectSettings(image="new:2", revision="canary"))
    assert json.loads(again["metadata"]["annotations"][ann.STATUS])["revision"] == "canary"
    assert {c["image"] for c in again["spec"]["initContainers"]} == {"new:2"}
    assert uninject_pod(again) == pod()


def test_path_env_overrides_the_settings_value():
    result = inject(pod(), extra_env=(("ISTIO_META_CLUSTER_ID", "east"), ("EXTRA", "1")))
    env = {e["name"]: e.get("value") for e in result["spec"]["initContainers"][1]["env"]}
    assert env["ISTIO_META_CLUSTER_ID"] == "east"
    assert env["EXTRA"] == "1"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"revision": "Canary"}, "revision"),
        ({"proxy_uid": 0}, "proxy-uid"),
        ({"image": ""}, "image"),
        ({"proxy_cpu": "3", "proxy_cpu_limit": "2"}, "exceeds"),
        ({"proxy_memory": "1 Gi"}, "proxy-memory"),
        ({"trust_domain": ""}, "trust-domain"),
    ],
)
def test_bad_settings_are_refused_up_front(values, message):
    with pytest.raises(ConfigError, match=message):
        InjectSettings(**values)


# --- documents and kinds ------------------------------------------------------------------------


def test_timestamps_stay_strings_and_anchors_are_written_out():
    text = "a: &x {b: 2024-01-01}\nc: *x\n"
    (document,) = load(text, "t.yaml")
    assert document.data == {"a": {"b": "2024-01-01"}, "c": {"b": "2024-01-01"}}
    assert "&" not in dump([document.data])
    assert "'2024-01-01'" in dump([document.data])


def test_yaml_errors_name_file_line_and_column():
    with pytest.raises(
        ManifestError, match=r"^bad\.yaml: invalid YAML at line 2, column 5: mapping values"
    ):
        load("a: 1\nb: c: d\n", "bad.yaml")


def test_errors_name_the_object_and_its_line():
    text = "kind: Service\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec: {}\n"
    with pytest.raises(InjectError, match=r"^f\.yaml:3 \(document 2\): Job j: no pod template"):
        inject_text(text, "f.yaml", SETTINGS)


def test_a_scalar_document_is_refused():
    with pytest.raises(ManifestError, match="found a string"):
        inject_text("just text\n", "f.yaml", SETTINGS)


def test_list_items_are_located_by_line():
    text = (
        "apiVersion: v1\nkind: List\nitems:\n- kind: Service\n- apiVersion: v1\n  kind: Pod\n"
        "  metadata: {name: p}\n  spec: {containers: []}\n"
    )
    with pytest.raises(ManifestError, match=r"^l\.yaml:5: Pod p: the pod spec has no containers"):
        inject_text(text, "l.yaml", SETTINGS)


def test_empty_documents_are_dropped_and_order_is_kept():
    text = "---\nkind: A\n---\n---\nkind: B\n"
    out, skipped = inject_text(text, "f.yaml", SETTINGS)
    assert out == "kind: A\n---\nkind: B\n"
    assert skipped == []


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ({"apiVersion": "apps/v1", "kind": "Deployment"}, ("spec", "template")),
        ({"apiVersion": "extensions/v1beta1", "kind": "DaemonSet"}, ("spec", "template")),
        (
            {"apiVersion": "batch/v1", "kind": "CronJob"},
            ("spec", "jobTemplate", "spec", "template"),
        ),
        ({"apiVersion": "v1", "kind": "Pod"}, ()),
        ({"apiVersion": "example.com/v1", "kind": "Job"}, None),
        ({"apiVersion": "v1", "kind": "Service"}, None),
        ({"kind": "Deployment"}, None),
    ],
)
def test_template_paths_by_group_and_kind(obj, path):
    assert kinds.template_path(obj) == path


@pytest.mark.parametrize(
    ("metadata", "name"),
    [
        (
            {
                "generateName": "web-7d4b9c-",
                "labels": {"pod-template-hash": "7d4b9c"},
                "ownerReferences": [
                    {"kind": "ReplicaSet", "name": "web-7d4b9c", "controller": True}
                ],
            },
            "web",
        ),
        (
            {"ownerReferences": [{"kind": "Job", "name": "nightly-29410560", "controller": True}]},
            "nightly",
        ),
        ({"ownerReferences": [{"kind": "StatefulSet", "name": "db", "controller": True}]}, "db"),
        ({"ownerReferences": [{"kind": "ReplicaSet", "name": "bare", "controller": True}]}, "bare"),
        (
            {"ownerReferences": [{"kind": "Job", "name": "x", "controller": False}], "name": "p"},
            "p",
        ),
        ({"generateName": "adhoc-"}, "adhoc"),
        ({}, ""),
    ],
)
def test_workload_name_of_a_pod(metadata, name):
    assert kinds.workload_name_of_pod({"metadata": metadata}) == name


def test_a_users_tls_mode_label_stays():
    p = pod()
    p["metadata"]["labels"][ann.TLS_MODE_LABEL] = "disabled"
    assert inject(p)["metadata"]["labels"][ann.TLS_MODE_LABEL] == "disabled"
    assert uninject_pod(inject(p)) == p


def test_the_revision_is_recorded_as_istio_does():
    result = inject(pod(), InjectSettings(image="x", revision="canary"))
    assert result["metadata"]["annotations"][ann.REVISION_LABEL] == "canary"


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ('{"containers": ["web"]}', "lists container 'web', which injection never adds"),
        ('{"initContainers": ["istio-init"]}', "lists initContainer 'istio-init', which the pod"),
        ('{"volumes": ["gone"]}', "lists volume 'gone', which the pod lacks"),
    ],
)
def test_a_status_annotation_the_pod_does_not_bear_out_is_refused(status, message):
    p = pod(**{ann.STATUS: status})
    for transform in (inject, uninject_pod):
        with pytest.raises(ManifestError, match=message):
            transform(p)


def test_unsupported_istio_annotations_are_warnings_not_silence():
    outcome = inject_pod(
        pod(**{"sidecar.istio.io/logLevel": "debug", "example.com/x": "y"}),
        SETTINGS,
        workload_name="web",
    )
    assert outcome.warnings == (
        "annotation 'sidecar.istio.io/logLevel' is not supported by meshctl and has no effect",
    )


def test_a_users_istio_proxy_overrides_fields_and_comes_back_on_uninject():
    p = pod()
    user_proxy = {
        "name": "istio-proxy",
        "image": "auto",
        "resources": {"requests": {"cpu": "123m"}},
        "env": [{"name": "EXTRA", "value": "1"}],
        "securityContext": {"runAsUser": 1234, "runAsGroup": 1234},
    }
    p["spec"]["containers"].append(copy.deepcopy(user_proxy))
    result = inject(p)
    init, proxy = result["spec"]["initContainers"]
    assert names(result["spec"]["containers"]) == ["web"]
    assert proxy["image"] == "registry.example/meshctl:test"  # "auto": the injected image
    assert proxy["resources"]["requests"] == {"cpu": "123m", "memory": "128Mi"}
    assert {"name": "EXTRA", "value": "1"} in proxy["env"]
    assert proxy["securityContext"]["runAsUser"] == 1234
    # The capture exempts the uid and gid the proxy now runs as.
    args = init["args"]
    assert (args[args.index("-u") + 1], args[args.index("-g") + 1]) == ("1234", "1234")
    assert json.loads(result["metadata"]["annotations"]["proxy.istio.io/overrides"])
    assert uninject_pod(result) == p
    assert inject(result) == result


def test_the_gateway_template_makes_the_proxy_the_main_container_without_capture():
    p = {
        "metadata": {"annotations": {ann.TEMPLATES: "gateway"}},
        "spec": {"containers": [{"name": "istio-proxy", "image": "auto"}]},
    }
    result = inject(p)
    assert "initContainers" not in result["spec"]
    (proxy,) = result["spec"]["containers"]
    assert "restartPolicy" not in proxy
    assert "startupProbe" not in proxy
    assert ann.TLS_MODE_LABEL not in result["metadata"]["labels"]
    assert result["spec"]["securityContext"]["sysctls"] == [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}
    ]
    assert uninject_pod(result) == p


def test_an_unknown_template_is_refused():
    with pytest.raises(InvalidAnnotationError, match=r"inject\.istio\.io/templates") as caught:
        inject(pod(**{ann.TEMPLATES: "custom"}))
    assert "user-defined templates such as 'custom'" in str(caught.value.hint)


@pytest.mark.parametrize(
    ("existing", "expected"),
    [
        (None, "default/meshctl-cni"),
        ("alt", "alt, default/meshctl-cni"),
        ("alt, default/meshctl-cni", "alt, default/meshctl-cni"),
        ('[{"name": "alt"}]', '[{"name": "alt"}, {"name": "meshctl-cni", "namespace": "default"}]'),
    ],
)
def test_multus_networks_get_the_mesh_cni_in_either_spelling(existing, expected):
    settings = InjectSettings(image="x", cni=True, multus_network="default/meshctl-cni")
    p = pod() if existing is None else pod(**{"k8s.v1.cni.cncf.io/networks": existing})
    result = inject(p, settings)
    assert result["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == expected
    assert uninject_pod(result) == p


def test_a_multus_networks_value_that_is_not_json_is_refused():
    settings = InjectSettings(image="x", cni=True, multus_network="default/meshctl-cni")
    with pytest.raises(InvalidAnnotationError, match="k8s"):
        inject(pod(**{"k8s.v1.cni.cncf.io/networks": "[oops]"}), settings)


def test_a_user_mount_at_the_cert_dir_replaces_the_injected_one():
    # Certificates from a Secret (`meshctl ztunnel certs`) at the proxy's cert dir: two mounts at
    # one path would make the API server refuse the pod, so the user's wins; uninject restores.
    certs_dir = "/var/run/secrets/workload-spiffe-credentials"
    original = pod(
        **{
            ann.USER_VOLUME: '{"mesh-certs":{"secret":{"secretName":"web-certs"}}}',
            ann.USER_VOLUME_MOUNT: json.dumps(
                {"mesh-certs": {"mountPath": certs_dir + "/", "readOnly": True}}
            ),
        }
    )
    injected = inject(copy.deepcopy(original))
    proxy = injected["spec"]["initContainers"][1]
    at_dir = [m for m in proxy["volumeMounts"] if m["mountPath"].rstrip("/") == certs_dir]
    assert at_dir == [{"name": "mesh-certs", "mountPath": certs_dir + "/", "readOnly": True}]
    paths = [m["mountPath"] for m in proxy["volumeMounts"]]
    assert len(paths) == len(set(paths))
    assert "/tmp" in paths  # the other injected mounts stay
    volumes = {v["name"]: v for v in injected["spec"]["volumes"]}
    assert volumes["mesh-certs"] == {"name": "mesh-certs", "secret": {"secretName": "web-certs"}}
    assert uninject_pod(injected) == original


def test_an_edited_undo_record_puts_back_only_the_containers_it_recorded_intact():
    p = pod()
    p["spec"]["containers"].append({"name": "istio-proxy", "image": "auto"})
    result = inject(p)
    annotations = result["metadata"]["annotations"]
    record = json.loads(annotations[ann.UNDO])
    # Entries that are no longer [field, index, container]: a list injection never adds to,
    # and shapes that are not entries at all.
    record["overrides"] += [["volumes", 0, {"name": "stray"}], "junk", [1, 2]]
    annotations[ann.UNDO] = json.dumps(record)
    assert uninject_pod(result) == p
