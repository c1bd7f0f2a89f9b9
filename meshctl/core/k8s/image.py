"""The container image every manifest meshctl prints runs: one reference, decided here.

``localhost/meshctl:<version>`` is the tag ``packaging/image/build.py`` gives the image it builds.
A ``localhost/`` name is never pulled from a public registry by accident, and with
``imagePullPolicy: IfNotPresent`` (the default here) a node runs the copy imported into its
runtime (``ctr -n k8s.io images import``) without any registry at all. Users who push the image to
their own registry (``meshctl image push``) override it in one place per command (``--image``,
``MESHCTL_INJECT_IMAGE``, install's ``--set image=``); install warns when the nodes lack a
``localhost/`` image (``local_image_warning``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshctl import __version__

LOCAL_REGISTRY_PREFIX = "localhost/"
DEFAULT_REPOSITORY = "localhost/meshctl"
# The suite's own images, built beside it (never referenced by a manifest meshctl prints).
PAUSE_REPOSITORY = "localhost/meshctl-pause"
TESTAPP_REPOSITORY = "localhost/meshctl-testapp"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
DEFAULT_PULL_POLICY = "IfNotPresent"


def default_image(version: str = __version__) -> str:
    """The image reference manifests use unless told otherwise."""
    return f"{DEFAULT_REPOSITORY}:{version}"


# The kubelet reports at most this many images per node (nodeStatusMaxImages' default): a node
# listing that many may hold the image without saying so.
NODE_STATUS_MAX_IMAGES = 50


@dataclass(frozen=True, slots=True)
class PullWarning:
    """Why the nodes will not find ``image``, and the fix."""

    message: str
    hint: str
    nodes: tuple[str, ...]  # the nodes without it


def local_image_warning(
    image: str, node_images: Mapping[str, Sequence[Sequence[str]]]
) -> PullWarning | None:
    """A warning when ``image`` is a ``localhost/`` name that some node does not hold.

    No registry serves ``localhost/`` names (a node's runtime would ask https://localhost/ for
    it), so a pod runs one only where it was imported (``ctr images import``). ``node_images``
    is each node's ``status.images``, each image as its ``names``: a node lists what its runtime
    holds, so a node whose list lacks the name cannot run the pod. None when every node lists
    it, or there are no nodes.
    """
    if not image.startswith(LOCAL_REGISTRY_PREFIX):
        return None
    missing = sorted(
        node for node, images in node_images.items() if not any(image in names for names in images)
    )
    if not missing:
        return None
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    capped = [n for n in missing if len(node_images[n]) >= NODE_STATUS_MAX_IMAGES]
    note = (
        f" ({len(capped)} of them list{'s' * (len(capped) == 1)} the kubelet's maximum of "
        f"{NODE_STATUS_MAX_IMAGES} images, so it may be there unlisted)"
        if capped
        else ""
    )
    return PullWarning(
        message=(
            f"the image {image} is a local name no registry serves, and "
            f"{len(missing)} of {len(node_images)} node(s) do not have it: {shown}{note}; "
            "pods scheduled there will sit in ErrImagePull"
        ),
        hint=(
            "push it to a registry the nodes can pull from: 'meshctl image push "
            "REGISTRY/meshctl:TAG', then install with '--set image=REGISTRY/meshctl:TAG' "
            "(or import the image on every node: ctr -n k8s.io images import)"
        ),
        nodes=tuple(missing),
    )
