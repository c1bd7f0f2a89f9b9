"""Kubernetes objects, as plain dicts, turned into the store's records (pure; no client here).

``pods``, ``services`` and ``policies`` read one object each into slim facts and build records
from facts; ``index`` keeps the facts of a whole cluster and says which store updates each
object change causes. The control plane's watches feed the index; nothing here fetches.
"""
