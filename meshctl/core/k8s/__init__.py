"""Kubernetes objects as values: the cluster's objects as mesh records, injection, install, the CNI
plugin and the ambient node agent's decisions.
"""
