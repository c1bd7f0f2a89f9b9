"""Kubernetes label selectors (``metav1.LabelSelector``) as requirements, and whether a label
map satisfies them: the one evaluation the gateway's route attachment and ``meshctl analyze``
share.

Invariants: every requirement must hold (AND; ``matchLabels`` entries are ``In`` with one
value); no requirement at all holds for every label map (the API's empty selector); an operator
the API does not know holds never, as the API server treats it.
"""

from __future__ import annotations

from collections.abc import Mapping

# (key, operator, values): one matchExpressions entry, or one matchLabels pair as ``In``.
Requirement = tuple[str, str, tuple[str, ...]]


def holds(requirements: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy every requirement."""
    for key, operator, values in requirements:
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
