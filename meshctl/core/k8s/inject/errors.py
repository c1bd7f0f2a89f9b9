"""The errors the injection pipeline raises: bad manifests and bad annotation values.

Invariant: each is a one-line ``MeshctlError`` with exit code 2 (input the user gave cannot be
used, as docs/cli.md's table says of every input file), so the CLI prints ``Error:``/``Hint:``
and the webhook denies the pod with the message.
"""

from __future__ import annotations

from meshctl.errors import EXIT_USAGE, MeshctlError


class InjectError(MeshctlError):
    """A manifest cannot be injected as it stands (exit 2)."""

    exit_code = EXIT_USAGE


class ManifestError(InjectError):
    """A document is not a well-formed Kubernetes object, or a pod spec lacks what it needs."""


class InvalidAnnotationError(InjectError):
    """An annotation the injector reads holds a value it cannot use."""

    def __init__(self, key: str, value: str, *, expected: str) -> None:
        super().__init__(
            f"invalid value {value!r} for annotation {key!r}",
            hint=f"{key} takes {expected}",
        )
        self.key = key
        self.value = value
