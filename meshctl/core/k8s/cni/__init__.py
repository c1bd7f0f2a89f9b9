"""The CNI plugin and its installer as data: spec types, pod decisions, network-config merging.

Pure: no sockets, files, environment or subprocesses. ``meshctl_plugins.cni`` does the I/O.
"""
