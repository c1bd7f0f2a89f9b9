"""meshctl.core.k8s.image.local_image_warning: install's preflight warning about a localhost/
image the nodes do not hold (decided from each node's status.images), with the push-and-set fix."""

from __future__ import annotations

from meshctl.core.k8s.image import NODE_STATUS_MAX_IMAGES, local_image_warning

LOCAL = "localhost/meshctl:0.1.0"


def test_a_local_image_every_node_lists_gives_no_warning():
    nodes = {
        "a": [[LOCAL, "localhost/meshctl@sha256:" + "1" * 64], ["pause:3"]],
        "b": [["x"], [LOCAL]],
    }
    assert local_image_warning(LOCAL, nodes) is None


def test_a_local_image_missing_on_some_nodes_names_them_and_the_fix():
    nodes = {"a": [[LOCAL]], "b": [["localhost/meshctl:0.0.9"]], "c": []}
    found = local_image_warning(LOCAL, nodes)
    assert found is not None
    assert found.nodes == ("b", "c")
    assert "2 of 3 node(s) do not have it: b, c" in found.message
    assert "ErrImagePull" in found.message
    assert "meshctl image push REGISTRY/meshctl:TAG" in found.hint
    assert "--set image=REGISTRY/meshctl:TAG" in found.hint


def test_an_image_from_a_registry_is_never_warned_about_even_if_no_node_has_it():
    assert local_image_warning("registry.example/meshctl:0.1.0", {"a": []}) is None
    assert local_image_warning("127.0.0.1:5000/meshctl:0.1.0", {"a": []}) is None


def test_no_nodes_means_nothing_to_say():
    assert local_image_warning(LOCAL, {}) is None


def test_a_node_at_the_kubelets_listing_cap_is_said_to_maybe_hold_it():
    full = [[f"img{i}:1"] for i in range(NODE_STATUS_MAX_IMAGES)]
    found = local_image_warning(LOCAL, {"big": full})
    assert found is not None
    assert "may be there unlisted" in found.message
    assert "may be there" not in (local_image_warning(LOCAL, {"small": full[:3]}) or found).message
