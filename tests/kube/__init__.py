"""Tests against a real kube-apiserver + etcd (harness: tests/harness/kube.py)."""
