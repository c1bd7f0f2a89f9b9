"""meshctl's pytest plugin: markers, the CI no-skip rule, and fixtures on real kernels/clusters."""
