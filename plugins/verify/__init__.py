"""meshctl verify (see cli.py)."""
