"""What ``meshctl proxy-status`` and ``proxy-config`` compute and show, as values (no I/O)."""
