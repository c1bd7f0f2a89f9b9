"""The ingress gateway: its install component (``meshctl.components``: ``gateway``)."""
