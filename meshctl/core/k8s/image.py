"""The container image every manifest meshctl prints runs: one reference, decided here.

``localhost/meshctl:<version>`` is the tag ``packaging/image/build.py`` gives the image it builds.
A ``localhost/`` name is never pulled from a public registry by accident, and with
``imagePullPolicy: IfNotPresent`` (the default here) a node runs the copy imported into its
runtime (``ctr -n k8s.io images import``) without any registry at all. Users who push the image to
their own registry override it in one place per command (``--image`` or ``MESHCTL_INJECT_IMAGE``).
"""

from __future__ import annotations

from meshctl import __version__

DEFAULT_REPOSITORY = "localhost/meshctl"
# The suite's own images, built beside it (never referenced by a manifest meshctl prints).
PAUSE_REPOSITORY = "localhost/meshctl-pause"
TESTAPP_REPOSITORY = "localhost/meshctl-testapp"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
DEFAULT_PULL_POLICY = "IfNotPresent"


def default_image(version: str = __version__) -> str:
    """The image reference manifests use unless told otherwise."""
    return f"{DEFAULT_REPOSITORY}:{version}"
