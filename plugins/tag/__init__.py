"""meshctl tag: revision tags (set, list, remove)."""
