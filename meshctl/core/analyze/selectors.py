"""Kubernetes label selectors (``metav1.LabelSelector``) evaluated against a label map.

Invariants: ``matchLabels`` and every ``matchExpressions`` entry must hold (AND); an absent
selector matches everything and so does an empty one (the API's meaning for webhooks and
policies); an operator the API does not know matches nothing, as the API server treats it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshctl.core.k8s import labelselector
from meshctl.core.k8s.labelselector import Requirement

from .snapshot import mapping, sequence, string_map


def holds(selector: Any, labels: Mapping[str, str]) -> bool:
    """Whether ``selector`` (a LabelSelector mapping, or None) selects ``labels``."""
    if selector is None:
        return True
    selector = mapping(selector)
    requirements: list[Requirement] = [
        (k, "In", (v,)) for k, v in string_map(selector.get("matchLabels")).items()
    ]
    for entry in sequence(selector.get("matchExpressions")):
        expression = mapping(entry)
        values = tuple(str(v) for v in sequence(expression.get("values")))
        requirements.append(
            (str(expression.get("key", "")), str(expression.get("operator")), values)
        )
    return labelselector.holds(tuple(requirements), labels)
