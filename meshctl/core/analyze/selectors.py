"""Kubernetes label selectors (``metav1.LabelSelector``) evaluated against a label map.

Invariants: ``matchLabels`` and every ``matchExpressions`` entry must hold (AND); an absent
selector matches everything and so does an empty one (the API's meaning for webhooks and
policies); an operator the API does not know matches nothing, as the API server treats it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .snapshot import mapping, sequence, string_map


def holds(selector: Any, labels: Mapping[str, str]) -> bool:
    """Whether ``selector`` (a LabelSelector mapping, or None) selects ``labels``."""
    if selector is None:
        return True
    selector = mapping(selector)
    if any(labels.get(k) != v for k, v in string_map(selector.get("matchLabels")).items()):
        return False
    for entry in sequence(selector.get("matchExpressions")):
        expression = mapping(entry)
        key = str(expression.get("key", ""))
        values = [str(v) for v in sequence(expression.get("values"))]
        operator = expression.get("operator")
        if operator == "In":
            ok = labels.get(key) in values
        elif operator == "NotIn":
            ok = labels.get(key) not in values
        elif operator == "Exists":
            ok = key in labels
        elif operator == "DoesNotExist":
            ok = key not in labels
        else:
            ok = False
        if not ok:
            return False
    return True
