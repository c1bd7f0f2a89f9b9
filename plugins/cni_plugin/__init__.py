"""``meshctl-cni``: the CNI plugin, run by the container runtime (see main.py).

A package of its own, beside ``cni`` (the installer): plugin discovery reads this package's
manifest without importing any plugin code, and the two share only ``meshctl.core.k8s.cni``.
"""
