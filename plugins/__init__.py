"""meshctl's in-tree plugins, installed as ``meshctl_plugins``: one package per subcommand.

Keep this file empty of code: plugin discovery imports it (never a plugin) to find manifests.
"""
