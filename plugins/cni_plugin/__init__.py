"""``meshctl-cni``: the CNI plugin the container runtime runs, a thin client of the node agent.

A package of its own, beside ``cni`` (the installer and node agent, which serves the requests):
plugin discovery reads this package's manifest without importing any plugin code, and the
client imports nothing of meshctl at all (client.py).
"""
