"""The Kubernetes adapter: the only package that imports ``kubernetes``.

Callers get plain dicts and our own small types; no ``V1*`` object leaves this package.
"""
