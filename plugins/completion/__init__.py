"""``meshctl completion``: shell completion scripts."""
