"""Where the package and the checkout it runs from are: the one home of the paths its rooms
share (the VM lab's cache and tools, the swarm's scenario file, the agent's shipped files)."""

from __future__ import annotations

import os
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent  # bindings/rdmalab
REPO = PACKAGE.parents[1]                          # the checkout that holds bindings/


def switch_binary() -> pathlib.Path:
    """The fault switch (and frame decoder) the VM lab runs: RDMALAB_SWITCH, else the build's."""
    return pathlib.Path(os.environ.get("RDMALAB_SWITCH",
                                       REPO / "build" / "faults" / "rdmalab-switch"))
