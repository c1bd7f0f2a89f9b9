"""``meshctl analyze``'s checks: pure functions over a snapshot of Kubernetes objects.

Owns the registry of finding codes (``codes``), the snapshot the checks read (``snapshot``: live
objects with the files given layered over them), one module per family of checks, and the run
that scopes, orders and grades the findings (``run``). Invariants: no I/O; a code never changes
meaning once given; a check that cannot read an object reports it, never raises.
"""
