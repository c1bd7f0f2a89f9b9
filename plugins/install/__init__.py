"""meshctl install, uninstall and manifest generate (see cli.py)."""
