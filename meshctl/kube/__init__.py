"""The Kubernetes adapter: the only package that imports ``kubernetes``.

Callers get plain dicts and our own small types; no ``V1*`` object leaves this package. The
kit every controller shares: ``objects`` (the verbs) and ``resources`` (the kinds), ``watch``
(the one list+watch loop), ``informer`` (one loop and cache per resource and selector in a
process, fanned out to subscribers on the asyncio loop) and ``workqueue`` (level-triggered
reconcilers' keys, retried on ``meshctl.core.backoff.Backoff``).
"""
