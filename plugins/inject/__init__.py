"""``meshctl inject``: sidecar injection offline (files) and as an admission webhook."""
