"""``python -m meshctl``: how the supervisor re-executes this installation (unfrozen)."""

from meshctl.entry import run

run()
