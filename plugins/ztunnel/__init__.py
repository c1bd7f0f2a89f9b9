"""``meshctl ztunnel``: the supervised HBONE proxy (``run``) and dev certificates (``certs``)."""
