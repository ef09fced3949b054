"""Where the package and the checkout it runs from are: the one home of the paths its rooms
share (the VM lab's cache and tools, the swarm's scenario file, the agent's shipped files)."""

from __future__ import annotations

import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent  # bindings/rdmalab
REPO = PACKAGE.parents[1]                          # the checkout that holds bindings/
