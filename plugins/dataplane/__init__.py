"""The HBONE data plane: hidden subcommand ``meshctl ztunnel-dataplane``, one module per path."""
