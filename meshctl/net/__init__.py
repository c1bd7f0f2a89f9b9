"""The kernel adapter: the only package that imports pyroute2 or iptc or runs iptables-restore."""
