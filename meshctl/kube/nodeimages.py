"""What images each node's runtime holds, as the kubelet reports them (``status.images``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from meshctl.core.k8s.image import LOCAL_REGISTRY_PREFIX, PullWarning, local_image_warning
from meshctl.kube.client import Kube
from meshctl.kube.objects import list_objects
from meshctl.kube.resources import NODES


def node_images(kube: Kube) -> Mapping[str, Sequence[Sequence[str]]]:
    """Node name -> the images its status lists, each as its names (tags and digests)."""
    found: dict[str, Sequence[Sequence[str]]] = {}
    nodes, _ = list_objects(kube, NODES)
    for node in nodes:
        metadata = node.get("metadata")
        status = node.get("status")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        if not isinstance(name, str):
            continue
        images = status.get("images") if isinstance(status, Mapping) else None
        found[name] = [
            [str(n) for n in (image.get("names") or [])]
            for image in (images if isinstance(images, list) else [])
            if isinstance(image, Mapping)
        ]
    return found


def pull_warning(kube: Kube, image: str) -> PullWarning | None:
    """``local_image_warning`` for ``image`` on this cluster's nodes (no read for other names)."""
    if not image.startswith(LOCAL_REGISTRY_PREFIX):
        return None
    return local_image_warning(image, node_images(kube))
