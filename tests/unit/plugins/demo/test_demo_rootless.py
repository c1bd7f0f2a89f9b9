"""The demo's rootless preflight: each refusal names what to fix (the sysctl, the tool, the id
range), before anything starts."""

from __future__ import annotations

import getpass

import pytest
from meshctl_plugins.demo import rootless

from meshctl.errors import MeshctlError


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A machine where everything is in place; tests take one piece away."""
    sysctls = {"kernel.unprivileged_userns_clone": "1", "user.max_user_namespaces": "1000"}
    monkeypatch.setattr(rootless, "_sysctl", sysctls.get)
    monkeypatch.setattr(rootless.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(rootless, "_has_subordinate_ids", lambda user, uid: True)
    return sysctls


def test_a_ready_machine_passes(machine):
    rootless.preflight()


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("kernel.unprivileged_userns_clone", "kernel.unprivileged_userns_clone=0"),
        ("user.max_user_namespaces", "user.max_user_namespaces=0"),
    ],
)
def test_disabled_user_namespaces_name_the_sysctl(machine, name, words):
    machine[name] = "0"
    with pytest.raises(MeshctlError) as refused:
        rootless.preflight()
    assert words in refused.value.message
    assert "sysctl" in (refused.value.hint or "")


def test_missing_newuidmap_names_the_package(machine, monkeypatch):
    monkeypatch.setattr(
        rootless.shutil, "which", lambda tool: None if tool == "newuidmap" else tool
    )
    with pytest.raises(MeshctlError) as refused:
        rootless.preflight()
    assert "newuidmap" in refused.value.message
    assert "uidmap" in (refused.value.hint or "")


def test_no_subordinate_ids_names_the_user_and_the_fix(machine, monkeypatch):
    monkeypatch.setattr(rootless, "_has_subordinate_ids", lambda user, uid: False)
    with pytest.raises(MeshctlError) as refused:
        rootless.preflight()
    assert getpass.getuser() in refused.value.message
    assert "usermod --add-subuids" in (refused.value.hint or "")
