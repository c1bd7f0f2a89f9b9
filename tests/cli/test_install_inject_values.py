"""`meshctl install`/`manifest generate` pass Istio's mesh-wide injection values to the
revision's webhook (components.controlplane.inject), and refuse a bad one before rendering."""

from __future__ import annotations

import yaml

from tests.harness.cli import run_meshctl


def _webhook_env(manifest: str) -> dict[str, str]:
    for obj in yaml.safe_load_all(manifest):
        if (
            obj
            and obj["kind"] == "Deployment"
            and obj["metadata"]["name"].startswith("meshctl-controlplane")
        ):
            container = obj["spec"]["template"]["spec"]["containers"][0]
            return {e["name"]: e.get("value", "") for e in container.get("env", [])}
    raise AssertionError("no control plane Deployment rendered")


def test_the_control_plane_injects_with_the_settings_given_at_install(tmp_path):
    values = tmp_path / "values.yaml"
    values.write_text(
        "components:\n  controlplane:\n    inject:\n"
        "    - network=net1\n    - exclude-ip-ranges=10.0.0.0/8,192.168.0.0/16\n"
    )
    done = run_meshctl("manifest", "generate", "-f", str(values))
    assert done.returncode == 0, done.stderr
    env = _webhook_env(done.stdout)
    assert env["MESHCTL_INJECT_NETWORK"] == "net1"
    assert env["MESHCTL_INJECT_EXCLUDE_IP_RANGES"] == "10.0.0.0/8,192.168.0.0/16"
    plain = _webhook_env(run_meshctl("manifest", "generate").stdout)
    assert "MESHCTL_INJECT_NETWORK" not in plain


def test_a_bad_injection_value_is_refused_before_anything_is_rendered():
    done = run_meshctl(
        "manifest", "generate", "--set", "components.controlplane.inject=interception-mode=FOO"
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(
        "Error: components.controlplane.inject key 'interception-mode': invalid value 'FOO'"
    )
    assert "Traceback" not in done.stderr
