"""What the agent lab's rooms share: its constants (how often hosts are followed, what is kept
of a stuck agent's stacks) and device labels."""

from __future__ import annotations

import re

HISTORY_TAIL = 50
POLL_S = 0.002
FOLLOW_WAIT_S = 1.0  # how long one fetch of a host's records waits in its agent for the next
# Between two fetches: a host writing records all the time (a drain, a burst) is fetched ten
# times a second, not once per record (each fetch costs a TCG guest ~10 ms of its one CPU).
FOLLOW_S = 0.1
STUCK_DUMP_S = 30.0  # reading a stuck agent's stacks through its machine's channel
STUCK_DUMP_CHARS = 20000  # kept of that dump (the end: the Python stacks)


def device_label(device: str) -> str:
    """The provider a device name says ("rxe0" -> rxe, "mlx5_0" -> mlx5): metrics' label."""
    return re.sub(r"_?\d+$", "", device) or device

