"""The error family: exit codes and one-line messages."""

from __future__ import annotations

from meshctl.errors import (
    CheckFailedError,
    ConfigError,
    KubeError,
    MeshctlError,
    NetError,
    UserError,
)


def test_exit_codes_follow_the_convention():
    assert MeshctlError("x").exit_code == 1
    assert KubeError("x").exit_code == 1
    assert NetError("x").exit_code == 1
    assert UserError("x").exit_code == 2
    assert ConfigError("x").exit_code == 2
    assert CheckFailedError("x").exit_code == 3
    assert MeshctlError("x", exit_code=126).exit_code == 126


def test_messages_are_folded_to_one_bounded_line():
    err = MeshctlError("first\nsecond   third", hint="a\nb")
    assert err.message == "first second third"
    assert err.hint == "a b"
    long = MeshctlError("y" * 5000)
    assert len(long.message) == 500
    assert long.message.endswith("...")
