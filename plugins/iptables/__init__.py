"""``meshctl iptables``: traffic capture rules as data, applied in network namespaces."""
