"""Istio's wire schemas (and gRPC's health checking, for app probes): the `.proto` files and the
modules generated from them (never edited).

Regenerate with `python packaging/protos.py`; CI runs it with `--check`. Package, message names
and field numbers are upstream's (see each file). Only adapters and plugins import these modules;
the core sees plain dataclasses.
"""

import os

# The generated service modules import grpc, whose C core logs to stderr on its own; keep it quiet
# unless the user asks (GRPC_VERBOSITY=debug|info|error). Must run before grpc is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
