"""``meshctl controlplane``: the mesh's control plane (CA, discovery, injection webhook, roots)."""
